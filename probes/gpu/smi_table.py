"""The default ``nvidia-smi`` table, the format most often pasted into tickets.

It holds the least (no max clocks, no reasons), but it is often the only GPU evidence a user
attaches; the column layout changed across driver releases, hence the lenient row patterns.
"""

from __future__ import annotations

import re
from typing import Any

from .record import empty_device
from .smi_values import _exe_name, _int, _num, _yes

#: The banner or column header of the default table, whatever the driver release.
SMI_TABLE_MARK = re.compile(r"NVIDIA-SMI\s+[\d.]+|\|\s+GPU\s+Name\s+Persistence-M")
_T_ROW1 = re.compile(r"^\s*(\d+)\s+(.*?)\s+(On|Off)\s*$")
_T_BUS = re.compile(r"([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])")
_T_ROW2 = re.compile(r"^\s*(\S+)\s+(\S+?)C?\s+(P\d+|ERR!|N/A)\s+(\S+?)\s*/\s*(\S+?)\s*$")
_T_MEM = re.compile(r"(\d+)\s*MiB\s*/\s*(\d+)\s*MiB")
_T_PROC = re.compile(r"^\|\s+(\d+)\s+(?:(?:N/A|\d+)\s+(?:N/A|\d+)\s+)?(\d+)\s+([CGM+]+)\s+(.+?)\s+(\d+|N/A)(?:MiB)?\s*\|$")


def parse_smi_table(text: str) -> dict[str, Any]:
    """Devices and processes from the default ``nvidia-smi`` table."""
    lines = text.splitlines()
    driver = re.search(r"Driver Version:\s*([\d.]+)", text)
    devices: list[dict[str, Any]] = []
    in_procs = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if "Processes:" in line:
            in_procs = True
        cells = line.split("|")
        if not in_procs and len(cells) >= 4:
            m = _T_ROW1.match(cells[1])
            bus = _T_BUS.search(cells[2]) if m else None
            if m and bus and i + 1 < len(lines):
                d = empty_device(int(m.group(1)))
                d["name"] = m.group(2).strip()
                d["pci_bus"] = bus.group(1)
                ecc_cell = cells[3].strip()
                if ecc_cell.isdigit():
                    d["ecc"]["volatile_uncorrected"] = int(ecc_cell)
                elif ecc_cell == "ERR!":
                    d["errors"]["ecc.volatile_uncorrected"] = "error reading the value"
                _table_row2(d, lines[i + 1].split("|"))
                if i + 2 < len(lines):
                    mig = lines[i + 2].split("|")
                    if len(mig) >= 4:
                        d["mig"]["current"] = _yes(mig[3].strip()) if mig[3].strip() not in ("", "N/A") else None
                devices.append(d)
                i += 2
        elif in_procs:
            pm = _T_PROC.match(line.rstrip())
            if pm:
                idx = int(pm.group(1))
                for d in devices:
                    if d["index"] == idx:
                        d["processes"].append({"pid": int(pm.group(2)), "used_mib": _int(pm.group(5)),
                                               "type": pm.group(3), "name": _exe_name(pm.group(4))})
        i += 1
    if not devices:
        raise ValueError("no GPU rows found in the nvidia-smi table")
    return {"driver_version": driver.group(1) if driver else None, "devices": devices}


def _table_row2(d: dict[str, Any], cells: list[str]) -> None:
    if len(cells) < 4:
        return
    m = _T_ROW2.match(cells[1])
    if m:
        d["temp"]["gpu"] = _int(m.group(2))
        d["pstate"] = m.group(3) if m.group(3).startswith("P") else None
        d["power"]["draw_w"] = _num(m.group(4))
        d["power"]["limit_w"] = _num(m.group(5))
    if "ERR!" in cells[1] or "ERR!" in cells[2]:
        d["errors"]["table"] = "nvidia-smi printed ERR! for this GPU"
    mm = _T_MEM.search(cells[2])
    if mm:
        d["mem"] = {"used_mib": int(mm.group(1)), "total_mib": int(mm.group(2))}
    um = re.search(r"(\d+)%", cells[3])
    if um:
        d["util"]["gpu"] = int(um.group(1))


