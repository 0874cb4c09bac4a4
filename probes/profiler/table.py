"""The text table ``torch.profiler`` prints: ``prof.key_averages().table(...)``.

Format (source: pytorch/pytorch torch/autograd/profiler_util.py ``_build_table``; in the torch
2.13.0 copy installed here, lines 1203-1562, stored upstream commit 006bb57b):

- a separator line of dash runs, each run one column (``add_column``: ``"-" * width`` plus two
  spaces), then the header row, then the separator again;
- headers ``Name``, optional ``Overload Name``, ``Self CPU %``, ``Self CPU``, ``CPU total %``,
  ``CPU total``, ``CPU time avg``; with device time ``Self CUDA``, ``Self CUDA %``,
  ``CUDA total``, ``CUDA time avg`` (the device's name upper-cased: XPU, MTIA, ...); memory
  columns with ``profile_memory``; ``# of Calls``; optional ``Node ID``, ``Input Shapes``,
  ``Source Location``, ``Total <x>FLOPs`` (lines 1279-1316);
- one row per event, every value right-aligned in a 12-wide column, names cut to 52 characters
  plus ``...``; times from ``_format_time`` (``12.345us``, ``1.234ms``, ``2.345s``) and shares
  from ``_format_time_share`` (``12.34%``; ``NaN`` over a zero total);
- the separator, then ``Self CPU time total: <t>`` and, with device time,
  ``Self CUDA time total: <t>`` (lines 1553-1561).

The older ``torch.autograd.profiler`` tables (torch 1.x) name the columns ``Self CPU total %``,
``Self CPU total``, ``CUDA total %`` and ``Number of Calls`` and end with ``CUDA time total:``;
the aliases below map both onto one set of keys. Rows are split on runs of two or more spaces
(``SPACING_SIZE = 2``) rather than by column offsets, so a table whose indentation a paste
stripped still reads.
"""

from __future__ import annotations

import re
from typing import Any

#: header text -> canonical column key; device columns are matched by pattern below
_HEADERS = {
    "name": "name", "overload name": "overload",
    "self cpu %": "self_cpu_pct", "self cpu total %": "self_cpu_pct",
    "self cpu": "self_cpu", "self cpu total": "self_cpu",
    "cpu total %": "cpu_total_pct", "cpu total": "cpu_total", "cpu time avg": "cpu_avg",
    "# of calls": "calls", "number of calls": "calls",
}
_DEV = "CUDA|XPU|MTIA|HPU|PRIVATEUSE1|MPS|NPU"
_DEV_HEADERS = (
    (re.compile(rf"^self ({_DEV}) %$", re.I), "self_dev_pct"),
    (re.compile(rf"^self ({_DEV})( total)?$", re.I), "self_dev"),
    (re.compile(rf"^({_DEV}) total %$", re.I), "dev_total_pct"),
    (re.compile(rf"^({_DEV}) total$", re.I), "dev_total"),
    (re.compile(rf"^({_DEV}) time avg$", re.I), "dev_avg"),
)
_SPLIT = re.compile(r"\s{2,}")
_SEP = re.compile(r"^\s*-{3,}(?:\s{2}-{3,})+\s*$")
_TIME = re.compile(r"^(-?\d+(?:\.\d+)?)(us|ms|s)$")
_FOOT = re.compile(rf"^\s*Self CPU time total:\s*(\S+)|^\s*(?:Self )?({_DEV}) time total:\s*(\S+)", re.I | re.M)
_SCALE = {"us": 1.0, "ms": 1e3, "s": 1e6}


def header_line(line: str) -> bool:
    """A ``_build_table`` header row: Name, a Self CPU column and a calls column."""
    low = line.lower()
    return "name" in low and "self cpu" in low and ("# of calls" in low or "number of calls" in low)


def _time_us(text: str) -> float | None:
    m = _TIME.match(text.strip())
    return float(m.group(1)) * _SCALE[m.group(2)] if m else None


def _pct(text: str) -> float | None:
    t = text.strip()
    if t.endswith("%"):
        try:
            return float(t[:-1]) / 100.0
        except ValueError:
            return None
    return 0.0 if t == "0" else None  # async events print 0 for their CPU total %


def _columns(header: str) -> list[str]:
    keys = []
    for h in _SPLIT.split(header.strip()):
        low = h.strip().lower()
        key = _HEADERS.get(low)
        if key is None:
            key = next((k for rx, k in _DEV_HEADERS if rx.match(h.strip())), "other:" + low)
        keys.append(key)
    return keys


def parse_tables(text: str) -> list[dict[str, Any]]:
    """Every table in the text (a log can print one per profiled window)."""
    lines = text.splitlines()
    tables = []
    i = 0
    while i < len(lines):
        if header_line(lines[i]):
            tab, i = _one_table(lines, i)
            if tab["rows"]:
                tables.append(tab)
        else:
            i += 1
    return tables


def _one_table(lines: list[str], at: int) -> tuple[dict[str, Any], int]:
    cols = _columns(lines[at])
    device = next((m.group(1).lower() for ln in [lines[at]] for m in [re.search(rf"Self ({_DEV})\b", ln, re.I)] if m),
                  None)
    rows: list[dict[str, Any]] = []
    i = at + 1
    if i < len(lines) and _SEP.match(lines[i]):
        i += 1
    seps = 0
    foot: dict[str, float] = {}
    while i < len(lines):
        ln = lines[i]
        if header_line(ln):
            break
        if _SEP.match(ln):
            seps += 1
            i += 1
            continue
        m = _FOOT.match(ln)
        if m:
            if m.group(1):
                foot["self_cpu_us"] = _time_us(m.group(1)) or 0.0
            else:
                foot["self_dev_us"] = _time_us(m.group(3)) or 0.0
            i += 1
            continue
        if not ln.strip():
            if foot or seps:
                break
            i += 1
            continue
        if seps and not foot:
            break  # text after the closing separator that is no footer
        row = _row(ln, cols)
        if row is not None:
            rows.append(row)
        elif rows:
            break  # the table ended without its footer (a cut paste)
        i += 1
    return {"columns": cols, "device": device, "rows": rows, **foot}, i


def _row(line: str, cols: list[str]) -> dict[str, Any] | None:
    parts = _SPLIT.split(line.strip())
    n_values = len(cols) - 1
    if len(parts) < len(cols):
        return None
    name = "  ".join(parts[: len(parts) - n_values])  # a name holding a double space keeps it
    vals = parts[len(parts) - n_values:]
    row: dict[str, Any] = {"name": name}
    for key, raw in zip(cols[1:], vals, strict=True):
        if key in ("self_cpu", "cpu_total", "cpu_avg", "self_dev", "dev_total", "dev_avg"):
            v = _time_us(raw)
            if v is None:
                return None
            row[key] = v
        elif key.endswith("_pct"):
            row[key] = _pct(raw)
        elif key == "calls":
            if not raw.isdigit():
                return None
            row[key] = int(raw)
    if "calls" not in row or "self_cpu" not in row:
        return None
    return row
