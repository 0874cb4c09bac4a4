"""The host-tools section of a report: the readings the CPU, memory and disk rules compare.

Why a digest and not the pasted output: the rules read a handful of numbers (load per core,
runnable threads, iowait, available memory, swap traffic, the busiest disk), and an engineer
checking a finding wants those numbers side by side with the line that says which ones crossed
a threshold, not three screens of top. Values past the lines the rules use are marked in words.
"""

from __future__ import annotations

from typing import Any

from doctor.evidence.sections import KeyValues, Section

#: The lines the host rules use (rules/performance: load and runnable per core 1.5, iowait 20 %,
#: available memory under 10 %), marked next to a value only to say it is past them; the rules
#: decide. The disk line is iostat's own saturation mark (%util near 100).
_LOAD_PER_CORE = 1.5
_IOWAIT = 20.0
_AVAILABLE = 0.10
_DISK_UTIL = 90.0


def _mark(past: bool) -> str:
    return " (high)" if past else ""


def sections(facts: dict[str, Any]) -> list[Section]:
    h = facts.get("host_tools")
    if not isinstance(h, dict) or not h.get("tools"):
        return []
    items: list[tuple[str, str]] = [("tools read", ", ".join(str(t) for t in h["tools"]))]
    cores = int(h.get("cores") or 0)
    items.append(("cores", str(cores) if cores else "unknown"))
    if h.get("load1"):
        lpc = float(h.get("load_per_core") or 0.0)
        per = f", {lpc:g} per core{_mark(lpc >= _LOAD_PER_CORE)}" if cores else ""
        items.append(("load average (1 / 15 min)", f"{h['load1']:g} / {h.get('load15', 0):g}{per}"))
    if h.get("runnable") is not None:
        items.append(("runnable threads (vmstat r)", f"{h['runnable']:g}"))
    if h.get("running"):
        items.append(("tasks running (top/htop)", f"{h['running']:g}"))
    if h.get("procs_listed"):
        items.append(("processes listed / over 1.5 CPUs", f"{h['procs_listed']} / {h.get('procs_busy', 0)}"))
    cpu = h.get("cpu") or {}
    if cpu:
        shares = ", ".join(f"{k} {v:g} %" for k, v in cpu.items() if isinstance(v, (int, float)))
        items.append(("CPU (worst interval)", shares))
    if h.get("iowait_pct"):
        items.append(("iowait (highest)", f"{h['iowait_pct']:g} %{_mark(h['iowait_pct'] >= _IOWAIT)}"))
    if h.get("mem_total_mb"):
        frac = h.get("mem_available_frac")
        avail = h.get("mem_available_mb")
        low = frac is not None and frac < _AVAILABLE
        items.append(("memory available", f"{avail:.0f} of {h['mem_total_mb']:.0f} MB{_mark(low)}"
                      if avail is not None else f"? of {h['mem_total_mb']:.0f} MB"))
    if h.get("swap_total_mb"):
        items.append(("swap used", f"{h.get('swap_used_mb', 0):.0f} of {h['swap_total_mb']:.0f} MB"))
    if h.get("swap_io"):
        items.append(("swap traffic (si+so per s)", f"{h['swap_io']:g}"))
    if h.get("disk_util_max"):
        items.append(("busiest disk", f"{h.get('disk_util_device') or '?'} {h['disk_util_max']:g} %util"
                      f"{_mark(h['disk_util_max'] >= _DISK_UTIL)}"))
    summary = "; ".join(f"{k}: {v}" for k, v in items[1:4])
    return [Section(id="host-tools", title="Host readings (top, vmstat, mpstat, iostat, free)", nav="Host",
                    order=36, summary=summary, body=KeyValues(items))]
