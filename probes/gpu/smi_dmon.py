"""``nvidia-smi dmon`` and ``nvidia-smi pmon`` output: one row per GPU (or process) per interval.

Format (nvidia-smi(1), sections "DEVICE MONITORING" and "PROCESS MONITORING",
https://manpages.ubuntu.com/manpages/plucky/man1/nvidia-smi.1.html; column meanings also in
https://leimao.github.io/blog/NVIDIA-NVML-GPU-Statistics/): two comment lines, names then
units, e.g.::

    # gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa   mclk   pclk
    # Idx      W      C      C      %      %      %      %      %      %    MHz    MHz
        0    632     60     46    100      9      0      0      0      0   3201   1980

``-s`` picks the metric groups (p: power/temperature, u: utilization, c: clocks, v: power and
thermal violations, m: frame-buffer/BAR1 memory, e: ECC and PCIe replays, t: PCIe throughput),
so the columns vary; ``-o DT`` adds date/time columns in front and ``-i`` restricts GPUs. ``sm``
is the share of time at least one SM ran a kernel (NVML utilization), ``pclk`` the graphics
(processor) clock. The header is repeated every screenful; ``-`` marks a value not read.

pmon prints ``# gpu pid type sm mem enc dec ... command`` with ``-`` for idle processes.
Readings were checked against the captures in tests/fixtures/host_tools/h200 (an H200 under a
compute-bound and an input-starved job).
"""

from __future__ import annotations

import re
from typing import Any

from .record import empty_device

_HEAD = re.compile(r"^#\s*(?:Date\s+Time\s+)?gpu\s+\S", re.I)


def looks_like_dmon(text: str) -> bool:
    """A dmon/pmon header opening the text (after a shell prompt line at most): ``# gpu``
    followed by known columns. A log that quotes dmon further down stays the logs kind's."""
    lines = [ln for ln in text.splitlines()[:10] if ln.strip()][:2]
    for ln in lines:
        s = ln.strip()
        if _HEAD.match(s):
            cols = s.lstrip("#").split()
            low = [c.lower() for c in cols]
            return ("pid" in low and "type" in low) or sum(c in _DMON_COLS for c in low) >= 3
    return False


_DMON_COLS = {"pwr", "gtemp", "mtemp", "sm", "mem", "enc", "dec", "jpg", "ofa", "mclk", "pclk", "pviol", "tviol",
              "fb", "bar1", "ccpm", "sbecc", "dbecc", "pci", "rxpci", "txpci"}


def _val(raw: str) -> float | None:
    if raw in ("-", "N/A", ""):
        return None
    try:
        return float(raw)
    except ValueError:
        return None


def parse_dmon(text: str) -> dict[str, Any]:
    """Devices (last row per GPU) and samples (every row) from dmon; processes from pmon."""
    cols: list[str] = []
    rows: list[dict[str, Any]] = []
    pmon = False
    for ln in text.splitlines():
        s = ln.strip()
        if not s:
            continue
        if s.startswith("#"):
            if _HEAD.match(s):
                cols = [c.lower() for c in s.lstrip("#").split()]
                pmon = "pid" in cols
            continue
        if not cols:
            continue
        parts = s.split()
        if pmon and len(parts) > len(cols):  # a command name with spaces
            parts = parts[: len(cols) - 1] + [" ".join(parts[len(cols) - 1:])]
        if len(parts) != len(cols):
            continue  # a cut line
        rec = dict(zip(cols, parts, strict=True))
        if not rec.get("gpu", "").isdigit():
            continue
        rows.append(rec)
    if not rows:
        raise ValueError("no nvidia-smi dmon/pmon rows found")
    return _pmon(rows) if pmon else _dmon(rows)


def _dmon(rows: list[dict[str, str]]) -> dict[str, Any]:
    latest: dict[int, dict[str, Any]] = {}
    samples: dict[int, list[dict[str, Any]]] = {}
    viol: dict[int, list[tuple[float, float]]] = {}  # (pviol %, tviol) per row, with -s v
    for n, rec in enumerate(rows):
        idx = int(rec["gpu"])
        d = empty_device(idx)
        sm, pclk, mclk = _val(rec.get("sm", "-")), _val(rec.get("pclk", "-")), _val(rec.get("mclk", "-"))
        pwr, temp, mtemp = _val(rec.get("pwr", "-")), _val(rec.get("gtemp", "-")), _val(rec.get("mtemp", "-"))
        mem = _val(rec.get("mem", "-"))
        d["util"]["gpu"] = None if sm is None else int(sm)
        d["util"]["memory"] = None if mem is None else int(mem)
        d["clocks"]["sm"] = d["clocks"]["graphics"] = None if pclk is None else int(pclk)
        d["clocks"]["mem"] = None if mclk is None else int(mclk)
        d["power"]["draw_w"] = pwr
        d["temp"]["gpu"] = None if temp is None else int(temp)
        d["temp"]["memory"] = None if mtemp is None else int(mtemp)
        latest[idx] = d
        pv, tv = _val(rec.get("pviol", "-")), _val(rec.get("tviol", "-"))
        if pv is not None or tv is not None:
            viol.setdefault(idx, []).append((pv or 0.0, tv or 0.0))
        samples.setdefault(idx, []).append({
            "t": float(len(samples.get(idx, []))), "index": idx, "sm": d["clocks"]["sm"], "util": d["util"]["gpu"],
            "power_w": pwr, "reasons": [], "temp": d["temp"]["gpu"], "row": n,
        })
    # -s v: pviol is the % of the interval the power limit held clocks down, tviol whether the
    # thermal limit did; as shares of the readings they feed the same flags as NVML's violation
    # counters (derive: thermal_policy at >= 25 % of the window)
    for idx, vs in viol.items():
        latest[idx]["violation_share"] = {"power": round(sum(p for p, _ in vs) / 100.0 / len(vs), 3),
                                          "thermal": round(sum(1 for _, t in vs if t > 0) / len(vs), 3)}
    return {"devices": [latest[i] for i in sorted(latest)],
            "samples": {i: s for i, s in samples.items() if len(s) > 1}}


def _pmon(rows: list[dict[str, str]]) -> dict[str, Any]:
    """pmon: the processes per GPU (pid, type C/G, name) and their last SM share."""
    devices: dict[int, dict[str, Any]] = {}
    for rec in rows:
        idx = int(rec["gpu"])
        d = devices.setdefault(idx, empty_device(idx))
        pid = rec.get("pid", "-")
        if not pid.isdigit():
            continue  # "-": no process on the GPU in that interval
        procs = {p["pid"]: p for p in d["processes"]}
        p = procs.get(int(pid)) or {"pid": int(pid), "used_mib": None}
        p["type"] = rec.get("type")
        if rec.get("command"):
            p["name"] = rec["command"]
        if int(pid) not in procs:
            d["processes"].append(p)
    if not devices:
        raise ValueError("no nvidia-smi pmon rows found")
    return {"devices": [devices[i] for i in sorted(devices)], "samples": {}}
