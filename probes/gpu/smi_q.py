"""``nvidia-smi -q`` text: the whole report, or sections of it pasted into a ticket.

The report is an indentation tree whose key names moved between driver releases ("Clocks
Throttle Reasons" became "Clocks Event Reasons", ECC went from Single/Double Bit to SRAM/DRAM),
so lookups accept every spelling seen in the wild.
"""

from __future__ import annotations

import re
from typing import Any

from .record import REASON_BITS, empty_device
from .smi_values import _exe_name, _int, _na_reason, _num, _yes

#: -q's reason labels -> the canonical names (nvidia-smi's csv names, as in ``REASON_BITS``).
_SMI_REASON_NAMES = {
    "idle": "gpu_idle", "gpu idle": "gpu_idle",
    "applications clocks setting": "applications_clocks_setting",
    "user defined clocks": "applications_clocks_setting",
    "sw power cap": "sw_power_cap",
    "hw slowdown": "hw_slowdown",
    "hw thermal slowdown": "hw_thermal_slowdown",
    "hw power brake slowdown": "hw_power_brake_slowdown",
    "sync boost": "sync_boost",
    "sw thermal slowdown": "sw_thermal_slowdown",
    "display clock setting": "display_clock_setting",
}

_Q_LINE = re.compile(r"^(\s*)(\S.*?)\s+:\s?(.*)$")
_Q_GPU = re.compile(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_Q_PADDED = re.compile(r"^\s*[A-Za-z][\w .()/+-]*?\S\s{2,}: ", re.M)
_Q_KEYS = re.compile(r"^\s*(Product Name|GPU UUID|Clocks (?:Throttle|Event) Reasons|Remapped Rows|FB Memory Usage|"
                     r"Retired Pages|ECC Errors|GPU Power Readings|Power Readings|Max Clocks|Attached GPUs|"
                     r"Performance State)\b", re.M)
#: A word every ``_Q_KEYS`` header holds: a body with none of them cannot match it.
_Q_NEEDLES = ("Product Name", "GPU UUID", "Clocks", "Remapped Rows", "FB Memory Usage", "Retired Pages",
              "ECC Errors", "Power Readings", "Attached GPUs", "Performance State")


def looks_like_q_sections(text: str) -> bool:
    """Pasted sections of ``-q`` with no "NVSMI LOG" banner: -q pads its keys into a column
    ("Pending                           : Yes"), so one known section header plus mostly padded
    lines is enough, while ordinary ``key: value`` files are not claimed."""
    body = text[:20000]
    if " : " not in body:  # every -q line is "key<padding> : value"; one scan rules most files out
        return False
    if not any(k in body for k in _Q_NEEDLES):  # plain substring tests, far cheaper than the regex
        return False
    if not _Q_KEYS.search(body):  # decisive: most files have no -q section header
        return False
    lines = [ln for ln in body.splitlines() if ln.strip() and not ln.strip().startswith("```")]
    padded = len(_Q_PADDED.findall(body))
    return padded >= 3 and padded >= 0.6 * (len(lines) - len(_Q_KEYS.findall(body)))


class Node:
    """One line of ``nvidia-smi -q``: a key, its value (None for a section) and its children."""

    __slots__ = ("key", "value", "children", "indent")

    def __init__(self, key: str, value: str | None, indent: int) -> None:
        self.key = key
        self.value = value
        self.indent = indent
        self.children: list[Node] = []

    def find(self, *names: str) -> Node | None:
        low = [n.lower() for n in names]
        for c in self.children:
            if c.key.lower() in low:
                return c
        return None

    def path(self, *parts: str | tuple[str, ...]) -> Node | None:
        cur: Node | None = self
        for p in parts:
            if cur is None:
                return None
            cur = cur.find(*(p if isinstance(p, tuple) else (p,)))
        return cur

    def val(self, *parts: str | tuple[str, ...]) -> str | None:
        n = self.path(*parts)
        return n.value if n is not None else None


def parse_tree(text: str) -> Node:
    """Indentation tree of ``Key : Value`` lines; lines with no ``:`` are section headers."""
    root = Node("", None, -1)
    stack = [root]
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or line.strip().startswith("=====") or line.lstrip().startswith(("```", "...")):
            continue
        m = _Q_LINE.match(line)
        if m:
            indent, key, value = len(m.group(1)), m.group(2).strip(), m.group(3).strip()
        else:
            indent, key, value = len(line) - len(line.lstrip()), line.strip(), None
        while stack[-1].indent >= indent:
            stack.pop()
        node = Node(key, value, indent)
        stack[-1].children.append(node)
        stack.append(node)
    return root


def parse_smi_q(text: str) -> dict[str, Any]:
    """Devices from ``nvidia-smi -q`` text (the whole report, or pasted sections of one GPU)."""
    root = parse_tree(text)
    gpu_nodes = [c for c in root.children if _Q_GPU.match(c.key)]
    if not gpu_nodes:
        # Pasted sections with no "GPU 0000:..." header: one device, its sections at the top.
        if not any(_Q_KEYS.match(c.key) for c in root.children):
            raise ValueError("no nvidia-smi -q sections found")
        gpu_nodes = [root]
    devices = []
    for i, g in enumerate(gpu_nodes):
        d = empty_device(i)
        m = _Q_GPU.match(g.key)
        if m:
            d["pci_bus"] = m.group(1)
        _fill_from_q(d, g)
        devices.append(d)
    return {"driver_version": root.val("Driver Version"), "cuda_version": root.val("CUDA Version"),
            "timestamp": root.val("Timestamp"), "devices": devices}


def _fill_from_q(d: dict[str, Any], g: Node) -> None:
    err = d["errors"]

    def num(field: str, *parts: str | tuple[str, ...]) -> float | None:
        raw = g.val(*parts)
        why = _na_reason(raw)
        if why and why != "not available":
            err[field] = why
        if raw is not None and raw.strip().lower() in ("gpu is lost", "[gpu is lost]"):
            d["lost"] = True
        return _num(raw)

    d["name"] = g.val("Product Name") or d["name"]
    d["uuid"] = g.val("GPU UUID") or d["uuid"]
    bus = g.val("PCI", "Bus Id")
    if bus:
        d["pci_bus"] = bus
    d["mig"]["current"] = _yes(g.val("MIG Mode", "Current"))
    d["mig"]["pending"] = _yes(g.val("MIG Mode", "Pending"))
    link = ("PCI", "GPU Link Info")
    d["pcie"]["gen_max"] = _int(g.val(*link, "PCIe Generation", "Max"))
    d["pcie"]["gen"] = _int(g.val(*link, "PCIe Generation", "Current"))
    d["pcie"]["width_max"] = _int(g.val(*link, "Link Width", "Max"))
    d["pcie"]["width"] = _int(g.val(*link, "Link Width", "Current"))
    d["pcie"]["replay"] = _int(g.val("PCI", "Replays Since Reset") or g.val("PCI", "Replays"))
    d["pstate"] = g.val("Performance State") or None
    reasons = g.find("Clocks Event Reasons", "Clocks Throttle Reasons", "Clocks Throttle Reason")
    if reasons is not None:
        active: list[str] = []
        for n in _walk(reasons):
            name = _SMI_REASON_NAMES.get(n.key.lower())
            if name and _yes(n.value):
                active.append(name)
        d["reasons"] = [r for r in REASON_BITS.values() if r in active]
    counters = g.find("Clocks Event Reasons Counters", "Clocks Throttle Reasons Counters")
    if counters is not None:
        # Cumulative microseconds each policy held the clocks down since the driver loaded.
        power_us = _num(counters.val("SW Power Capping"))
        thermal = [_num(counters.val(k)) for k in ("SW Thermal Slowdown", "HW Thermal Slowdown")]
        d["violation_ns"]["power"] = int(power_us * 1000) if power_us is not None else None
        if any(t is not None for t in thermal):
            d["violation_ns"]["thermal"] = int(sum(t or 0 for t in thermal) * 1000)
    d["mem"]["total_mib"] = _int(g.val("FB Memory Usage", "Total"))
    d["mem"]["used_mib"] = _int(g.val("FB Memory Usage", "Used"))
    d["util"]["gpu"] = _int(g.val("Utilization", "Gpu"))
    d["util"]["memory"] = _int(g.val("Utilization", "Memory"))
    mode = g.val("ECC Mode", "Current")
    d["ecc"]["mode"] = {True: "enabled", False: "disabled"}.get(_yes(mode)) if mode else None
    errs = g.find("ECC Errors")
    if errs is not None:
        for scope in ("Volatile", "Aggregate"):
            node = errs.find(scope)
            if node is None:
                continue
            unc, cor = _ecc_sums(node)
            d["ecc"][f"{scope.lower()}_uncorrected"] = unc
            d["ecc"][f"{scope.lower()}_corrected"] = cor
            thr = node.find("SRAM Threshold Exceeded")
            if thr is not None:
                d["ecc"]["sram_threshold_exceeded"] = _yes(thr.value)
    rp = g.find("Retired Pages")
    if rp is not None:
        d["retired_pages"] = {
            "sbe": _retired_count(rp.find("Single Bit ECC")),
            "dbe": _retired_count(rp.find("Double Bit ECC")),
            "pending": _yes(rp.val(("Pending Page Blacklist", "Pending Page Retirement", "Pending"))),
        }
    rr = g.find("Remapped Rows")
    if rr is not None:
        d["remapped_rows"] = {
            "correctable": _int(rr.val("Correctable Error")),
            "uncorrectable": _int(rr.val("Uncorrectable Error")),
            "pending": _yes(rr.val("Pending")),
            "failure": _yes(rr.val("Remapping Failure Occurred")),
        }
    t = d["temp"]
    t["gpu"] = num("temp.gpu", "Temperature", "GPU Current Temp")
    t["memory"] = num("temp.memory", "Temperature", "Memory Current Temp")
    t["slowdown"] = num("temp.slowdown", "Temperature", "GPU Slowdown Temp")
    t["shutdown"] = num("temp.shutdown", "Temperature", "GPU Shutdown Temp")
    t["max_operating"] = num("temp.max_operating", "Temperature", "GPU Max Operating Temp")
    for k in list(t):
        t[k] = int(t[k]) if t[k] is not None else None
    pw = ("GPU Power Readings", "Power Readings")
    d["power"]["draw_w"] = num("power.draw_w", pw, ("Power Draw", "Average Power Draw", "Instantaneous Power Draw"))
    d["power"]["limit_w"] = num("power.limit_w", pw, ("Current Power Limit", "Enforced Power Limit", "Power Limit"))
    d["power"]["default_limit_w"] = num("power.default_limit_w", pw, ("Default Power Limit",))
    for key, name in (("graphics", "Graphics"), ("sm", "SM"), ("mem", "Memory")):
        v = g.val("Clocks", name)
        d["clocks"][key] = _int(v)
        d["max_clocks"][key] = _int(g.val("Max Clocks", name))
    d["app_clocks"]["graphics"] = _int(g.val("Applications Clocks", "Graphics"))
    d["app_clocks"]["mem"] = _int(g.val("Applications Clocks", "Memory"))
    procs = g.find("Processes")
    if procs is not None:
        d["processes"] = _q_processes(procs)
    if (g.val("GPU Reset Status", "Reset Required") or "").strip().lower() == "yes":
        err["reset_required"] = "nvidia-smi says a GPU reset is required"



def _walk(node: Node) -> list[Node]:
    out: list[Node] = []
    for c in node.children:
        out.append(c)
        out.extend(_walk(c))
    return out


def _ecc_sums(scope: Node) -> tuple[int | None, int | None]:
    """(uncorrected, corrected) for one ECC scope, old (Single/Double Bit) or new (SRAM/DRAM) layout."""
    unc = cor = None
    old_double = scope.find("Double Bit")
    old_single = scope.find("Single Bit")
    if old_double is not None or old_single is not None:
        if old_double is not None:
            unc = _int(old_double.val("Total"))
        if old_single is not None:
            cor = _int(old_single.val("Total"))
        return unc, cor
    for c in scope.children:
        k = c.key.lower()
        v = _int(c.value)
        if v is None or "threshold" in k or "sources" in k:
            continue
        if "uncorrectable" in k:
            unc = (unc or 0) + v
        elif "correctable" in k:
            cor = (cor or 0) + v
    return unc, cor


def _retired_count(node: Node | None) -> int | None:
    if node is None:
        return None
    if node.value is not None and node.value.strip():
        return _int(node.value)
    return _int(node.val("Count"))


def _q_processes(node: Node) -> list[dict[str, Any]]:
    if node.value and node.value.strip().lower() in ("none", "no running processes found"):
        return []
    out: list[dict[str, Any]] = []
    cur: dict[str, Any] | None = None

    def take(n: Node) -> None:
        nonlocal cur
        k = n.key.lower()
        if k == "process id":
            cur = {"pid": _int(n.value), "used_mib": None}
            out.append(cur)
        elif cur is not None and k == "name":
            cur["name"] = _exe_name(n.value)
        elif cur is not None and k == "type":
            cur["type"] = (n.value or "").strip()
        elif cur is not None and k == "used gpu memory":
            cur["used_mib"] = _int(n.value)
        for c in n.children:
            take(c)

    for c in node.children:
        take(c)
    return [p for p in out if p["pid"] is not None]

