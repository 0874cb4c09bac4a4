"""The gpu kind's part of the report: one table row per GPU, the ones a finding names or a health
flag marks first and highlighted.

``gpu.devices`` records are read as this probe writes them, plus the flat spellings other sources
use (``mem_used_mb``, ``power_w``); columns no device fills are dropped, and identifiers (UUIDs,
serials) are never shown, as PyTorch's ``collect_env`` does.
"""

from __future__ import annotations

import re
from typing import Any

from doctor.evidence.sections import Cell, Row, Section, SectionContext, Table

_HIDDEN = re.compile(r"uuid|serial", re.I)  # identifying, not diagnostic
_FLAGS = ("lost", "hw_fault", "throttle_fault", "hot", "slow_vs_peers", "pcie_degraded", "mem_full",
          "at_power_cap", "power_limit_lowered", "clocks_locked_low", "busy_low_power")
MAX_COLUMNS = 14


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _ints(values: Any) -> list[int]:
    return [v for v in _as_list(values) if isinstance(v, int) and not isinstance(v, bool)] + [
        int(v) for v in _as_list(values) if isinstance(v, str) and v.isdigit()]


def format_ranks(ranks: list[int]) -> str:
    """``0-3,7``: compact rank ranges (the same form the rules and reports use)."""
    out: list[str] = []
    xs = sorted(set(ranks))
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(out)


def _num(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.0f}" if abs(value) >= 10 else f"{value:.3g}"
    return str(value)


def _pair(d: dict[str, Any], key: str, a: str, b: str, flat: tuple[str, ...] = ()) -> str:
    sub = d.get(key)
    if isinstance(sub, dict):
        x, y = _num(sub.get(a)), _num(sub.get(b))
        return f"{x} / {y}" if x and y else x
    for k in (key, *flat):
        if not isinstance(d.get(k), (dict, list)) and _num(d.get(k)):
            return _num(d.get(k))
    return ""


def _sub(d: dict[str, Any], key: str, field_: str, flat: tuple[str, ...] = ()) -> str:
    sub = d.get(key)
    if isinstance(sub, dict):
        return _num(sub.get(field_))
    for k in (key, *flat):
        if not isinstance(d.get(k), (dict, list)) and _num(d.get(k)):
            return _num(d.get(k))
    return ""


def _label(d: dict[str, Any]) -> str:
    if isinstance(d.get("label"), str) and d["label"]:
        return d["label"]
    host, idx = d.get("host") or "", d.get("index")
    return f"{host}:gpu{idx}" if host and idx is not None else (f"gpu{idx}" if idx is not None else "")


def _pcie(d: dict[str, Any]) -> str:
    p = d.get("pcie")
    if not isinstance(p, dict) or p.get("gen") is None:
        return ""
    cur = f"gen{p.get('gen')} x{p.get('width')}"
    if p.get("gen_max") is not None and (p.get("gen_max"), p.get("width_max")) != (p.get("gen"), p.get("width")):
        cur += f" (max gen{p.get('gen_max')} x{p.get('width_max')})"
    return cur


def _clocks(d: dict[str, Any]) -> str:
    clocks, top = d.get("clocks"), d.get("max_clocks")
    if isinstance(clocks, dict) and clocks.get("sm") is not None and isinstance(top, dict):
        return f"{_num(clocks.get('sm'))} / {_num(top.get('sm'))}"
    return _sub(d, "clocks", "sm", ("sm_clock",))


_COLUMNS: list[tuple[str, Any]] = [
    ("GPU", _label),
    ("name", lambda d: str(d.get("name") or "")),
    ("ranks", lambda d: format_ranks(_ints(d.get("ranks"))) if _ints(d.get("ranks")) else ""),
    ("util %", lambda d: _sub(d, "util", "gpu", ("utilization", "gpu_util"))),
    ("mem MiB used / total", lambda d: _pair(d, "mem", "used_mib", "total_mib", ("mem_used_mb", "memory_used"))),
    ("temp C", lambda d: _sub(d, "temp", "gpu", ("temperature",))),
    ("power W draw / limit", lambda d: _pair(d, "power", "draw_w", "limit_w", ("power_w",))),
    ("SM MHz / max", _clocks),
    ("PCIe", _pcie),
    ("flags", lambda d: ", ".join(f for f in _FLAGS if d.get(f) is True)),
    ("clock reasons", lambda d: ", ".join(str(r) for r in _as_list(d.get("reasons"))[:6])),
]


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.0f}"
    return str(value)


def table(facts: dict[str, Any]) -> tuple[list[str], list[dict[str, str]], list[bool]]:
    """Columns, formatted rows and a "look here" flag per GPU, in device order."""
    ns = facts.get("gpu")
    devices = [d for d in _as_list(ns.get("devices") if isinstance(ns, dict) else None) if isinstance(d, dict)]
    rows: list[dict[str, str]] = []
    for d in devices:
        row = {}
        for col, fn in _COLUMNS:
            try:
                row[col] = str(fn(d) or "")
            except (TypeError, ValueError, AttributeError):
                row[col] = ""
        rows.append(row)
    cols = [c for c, _ in _COLUMNS if any(r.get(c) for r in rows[:4096])]
    if len(cols) < 3 and devices:  # an unknown shape: show its scalar fields as they are
        extra: list[str] = []
        for d in devices[:256]:
            for k, v in d.items():
                if k not in extra and not _HIDDEN.search(k) and isinstance(v, (str, int, float, bool)):
                    extra.append(k)
        for r, d in zip(rows, devices, strict=True):
            r.update({k: _cell(d.get(k)) for k in extra})
        cols += [k for k in extra if k not in cols]
    flagged = [any(d.get(f) is True for f in _FLAGS) for d in devices]
    return cols[:MAX_COLUMNS], rows, flagged


def sections(facts: dict[str, Any], context: SectionContext) -> list[Section]:
    cols, rows, flagged = table(facts)
    if not rows or not cols:
        return []
    named = [bool(context.gpus) and r.get("GPU", "") in context.gpus for r in rows]
    order = sorted(range(len(rows)), key=lambda i: (not named[i], not flagged[i], i))
    out = [Row([Cell(rows[i].get(c, "")) for c in cols],
               marks=[m for m, on in (("NAMED", named[i]), ("LOOK", flagged[i])) if on]) for i in order]
    n_flag = sum(flagged)
    return [Section(
        id="gpus", title="GPUs", nav="GPUs", order=40, body=Table(cols, out, noun="GPU",
                                                                 legend="LOOK = a health flag is set, NAMED = a finding names it"),
        summary=f"{len(rows)} GPU(s)" + (f", {n_flag} flagged" if n_flag else ""),
        note=f"{len(rows)} GPU(s); highlighted: named by a finding or flagged by the GPU probe.",
    )]
