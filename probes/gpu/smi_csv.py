"""``nvidia-smi --query-gpu=... --format=csv`` output, with or without units.

Header names differ across driver releases (``clocks_throttle_reasons`` became
``clocks_event_reasons``) and users pick their own columns, so each header maps to a canonical
field through aliases; repeated rows from ``-l`` become samples, since a loop is exactly the
evidence of a clock that moves.
"""

from __future__ import annotations

import csv
import io
import re
from datetime import datetime
from typing import Any

from .record import REASON_BITS, decode_reasons, empty_device
from .smi_values import _NA, _int, _na_reason, _num, _yes

_CSV_FIELDS: dict[str, tuple[str, ...]] = {
    # canonical -> accepted header names (units in brackets are stripped first)
    "index": ("index",), "name": ("name", "gpu_name"), "uuid": ("uuid", "gpu_uuid"),
    "pci_bus": ("pci.bus_id", "gpu_bus_id"), "timestamp": ("timestamp",), "pstate": ("pstate",),
    "clocks.sm": ("clocks.sm", "clocks.current.sm"), "clocks.mem": ("clocks.mem", "clocks.current.memory"),
    "clocks.graphics": ("clocks.gr", "clocks.current.graphics"),
    "max_clocks.sm": ("clocks.max.sm", "clocks.max.streaming_multiprocessor"),
    "max_clocks.mem": ("clocks.max.mem", "clocks.max.memory"),
    "max_clocks.graphics": ("clocks.max.gr", "clocks.max.graphics"),
    "app_clocks.graphics": ("clocks.applications.graphics", "clocks.applications.gr"),
    "app_clocks.mem": ("clocks.applications.memory", "clocks.applications.mem"),
    "reasons_mask": ("clocks_throttle_reasons.active", "clocks_event_reasons.active"),
    "temp.gpu": ("temperature.gpu",), "temp.memory": ("temperature.memory",),
    "power.draw_w": ("power.draw", "power.draw.average", "power.draw.instant"),
    "power.limit_w": ("enforced.power.limit", "power.limit"),
    "power.default_limit_w": ("power.default_limit",),
    "util.gpu": ("utilization.gpu",), "util.memory": ("utilization.memory",),
    "mem.used_mib": ("memory.used",), "mem.total_mib": ("memory.total",),
    "ecc.mode": ("ecc.mode.current",),
    "ecc.volatile_uncorrected": ("ecc.errors.uncorrected.volatile.total",),
    "ecc.aggregate_uncorrected": ("ecc.errors.uncorrected.aggregate.total",),
    "ecc.volatile_corrected": ("ecc.errors.corrected.volatile.total",),
    "ecc.aggregate_corrected": ("ecc.errors.corrected.aggregate.total",),
    "retired_pages.sbe": ("retired_pages.single_bit_ecc.count", "retired_pages.sbe"),
    "retired_pages.dbe": ("retired_pages.double_bit.count", "retired_pages.dbe"),
    "retired_pages.pending": ("retired_pages.pending",),
    "remapped_rows.correctable": ("remapped_rows.correctable",),
    "remapped_rows.uncorrectable": ("remapped_rows.uncorrectable",),
    "remapped_rows.pending": ("remapped_rows.pending",),
    "remapped_rows.failure": ("remapped_rows.failure",),
    "pcie.gen": ("pcie.link.gen.current", "pcie.link.gen.gpucurrent"),
    "pcie.gen_max": ("pcie.link.gen.max", "pcie.link.gen.gpumax"),
    "pcie.width": ("pcie.link.width.current",), "pcie.width_max": ("pcie.link.width.max",),
    "mig.current": ("mig.mode.current",), "mig.pending": ("mig.mode.pending",),
}
_CSV_ALIASES = {alias: canon for canon, aliases in _CSV_FIELDS.items() for alias in aliases}
_CSV_REASON_PREFIX = ("clocks_throttle_reasons.", "clocks_event_reasons.")
_CSV_STR = {"name", "uuid", "pci_bus", "timestamp", "pstate", "ecc.mode"}
_CSV_BOOL = {"retired_pages.pending", "remapped_rows.pending", "remapped_rows.failure", "mig.current", "mig.pending"}


def _csv_header_name(h: str) -> str:
    return re.sub(r"\s*\[[^\]]*\]\s*$", "", h.strip()).strip().lower()


def csv_header_known(line: str) -> int:
    """How many columns of a csv header are nvidia-smi --query-gpu fields with a dot in the name
    (clocks.sm, memory.used, ...): plain ``timestamp,name,index`` is any csv's header."""
    cols = [_csv_header_name(c) for c in line.split(",")]
    return sum(1 for c in cols if "." in c and (c in _CSV_ALIASES or c.startswith(_CSV_REASON_PREFIX)))


def parse_smi_csv(text: str) -> dict[str, Any]:
    """Devices (last row per GPU) and samples (every row) from --query-gpu csv output."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines[:50]) if csv_header_known(ln) >= 2), None)
    if start is None:
        raise ValueError("no nvidia-smi --query-gpu csv header found")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:])), skipinitialspace=True))
    header = [_csv_header_name(h) for h in rows[0]]
    latest: dict[Any, dict[str, Any]] = {}
    order: list[Any] = []
    samples: dict[int, list[dict[str, Any]]] = {}
    t0: float | None = None
    for row_no, row in enumerate(rows[1:]):
        if len(row) != len(header) or row == rows[0]:
            continue  # a repeated header (``-l`` after a restart) or a truncated last line
        rec = dict(zip(header, (c.strip() for c in row), strict=False))
        key = rec.get("index") or rec.get("uuid") or rec.get("pci.bus_id") or str(len(order))
        if key not in latest:
            order.append(key)
        d = empty_device(_int(rec.get("index")) if rec.get("index", "").isdigit() else order.index(key))
        _fill_from_csv(d, rec)
        latest[key] = d
        ts = _csv_time(rec.get("timestamp"))
        if ts is not None and t0 is None:
            t0 = ts
        samples.setdefault(d["index"], []).append({
            "t": round(ts - t0, 3) if ts is not None and t0 is not None else float(row_no),
            "index": d["index"], "sm": d["clocks"]["sm"], "util": d["util"]["gpu"],
            "power_w": d["power"]["draw_w"], "reasons": d["reasons"], "temp": d["temp"]["gpu"],
        })
    if not latest:
        raise ValueError("csv header found but no data rows")
    devices = [latest[k] for k in order]
    multi = {i: s for i, s in samples.items() if len(s) > 1}
    return {"devices": devices, "samples": multi}


def _csv_time(value: str | None) -> float | None:
    """Seconds of an nvidia-smi timestamp (``2024/12/02 10:00:00.123``); None when absent."""
    if not value:
        return None
    for fmt in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S"):
        try:
            return datetime.strptime(value.strip(), fmt).timestamp()
        except ValueError:
            continue
    return None


def _fill_from_csv(d: dict[str, Any], rec: dict[str, str]) -> None:
    err = d["errors"]
    active: list[str] = []
    for col, raw in rec.items():
        if col.startswith(_CSV_REASON_PREFIX):
            name = col.split(".", 1)[1]
            if name != "active" and name != "supported" and _yes(raw):
                active.append(name)
            continue
        canon = _CSV_ALIASES.get(col)
        if canon is None:
            continue
        why = _na_reason(raw)
        if why and why != "not available":
            err[canon] = why
            if why == "gpu is lost":
                d["lost"] = True
        if canon == "index":
            continue
        if canon in _CSV_STR:
            val: Any = raw if raw and raw.strip().lower() not in _NA else None
            if canon == "ecc.mode" and val is not None:
                val = {True: "enabled", False: "disabled"}.get(_yes(val))
        elif canon in _CSV_BOOL:
            val = _yes(raw)
        elif canon == "reasons_mask":
            try:
                val = int(raw, 16) if raw and raw.lower().startswith("0x") else None
            except ValueError:
                val = None
        else:
            n = _num(raw)
            val = None if n is None else (round(n, 1) if canon.startswith("power.") else int(n))
        if "." in canon:
            group, key = canon.split(".", 1)
            d[group][key] = val
        else:
            d[canon] = val
    if d["reasons_mask"] is not None:
        d["reasons"] = decode_reasons(d["reasons_mask"])
    elif active:
        d["reasons"] = [r for r in REASON_BITS.values() if r in active]

