"""The profiler section of a report: where the profiled step time went.

Why: the profiler rules decide on a few shares (batch fetching, blocking host reads, compiling,
communication); an engineer reading a finding wants to see those shares next to the ops that
took the most self time, as the table printed them, without scrolling through a 200-row
``key_averages()`` dump. Shares at or above the line a rule uses are marked in words.
"""

from __future__ import annotations

from typing import Any

from doctor.evidence.sections import Cell, KeyValues, Row, Section, Table

#: What each share is, in the order shown, with the share at which a rule reads it as the cause
#: (the profiler rules of rules/performance; None: context only).
_SHARES: tuple[tuple[str, str, float | None], ...] = (
    ("dataloader", "fetching batches (enumerate(DataLoader)), less a 1 s start-up", 0.15),
    ("dataloader_raw", "fetching batches, start-up included", None),
    ("host_sync", "blocking host reads (item, synchronize)", 0.10),
    ("compile", "compiling (dynamo/inductor)", 0.10),
    ("comm_cpu", "communication, host side", None),
    ("comm_device", "communication, share of device time", None),
    ("copy", "copies", None),
    ("dtoh_device", "device-to-host copies, share of device time", None),
    ("pin_memory", "pinning memory", None),
)


def _pct(x: float) -> str:
    return f"{100.0 * x:.0f} %"


def sections(facts: dict[str, Any]) -> list[Section]:
    p = facts.get("profiler")
    if not isinstance(p, dict) or not p.get("tables"):
        return []
    shares = p.get("shares") or {}
    items: list[tuple[str, str]] = [("tables read", str(p["tables"])),
                                    ("profiled steps", str(p.get("steps") or "no ProfilerStep rows")),
                                    ("device", p.get("device") or "CPU only")]
    if p.get("gpu_busy") is not None:
        items.append(("device busy (device time / step wall time)", _pct(float(p["gpu_busy"]))))
    if p.get("host_sync_per_step"):
        items.append(("blocking host reads per step", f"{p['host_sync_per_step']:g}"))
    for key, what, line in _SHARES:
        if key in shares and (line is not None or shares[key] >= 0.01):  # context shares only when present
            past = line is not None and shares[key] >= line
            items.append((what, _pct(float(shares[key])) + (" (past the rule's line)" if past else "")))
    out = [Section(id="profiler", title="Profiler (torch.profiler tables)", nav="Profiler", order=47,
                   summary="; ".join(f"{k}: {v}" for k, v in items[1:5]), body=KeyValues(items))]
    top = [t for t in p.get("top") or [] if isinstance(t, dict)]
    if top:
        rows = [Row([Cell(str(t.get("name", "")), code=True), Cell(_pct(float(t.get("share") or 0.0))),
                     Cell(str(t.get("calls", "")))]) for t in top]
        out.append(Section(id="profiler-top", title="Profiler: most self time", nav="Top ops", order=48,
                           summary=", ".join(f"{t.get('name', '')} {_pct(float(t.get('share') or 0.0))}"
                                             for t in top[:3]),
                           body=Table(["op", "share of self time", "calls"], rows, noun="op")))
    return out
