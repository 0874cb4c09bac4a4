"""JSONL metric records (one per line, nested up to two levels) and JSON: HF
``trainer_state.json`` (its ``log_history``) or a list of records.

A metrics JSONL file repeats the same few key sets on every line, so how to read a key set is
worked out once and cached; a million lines then cost little more than ``json`` decoding.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from doctor.probes.common import jsonstream
from doctor.probes.metrics.names import canonical
from doctor.probes.metrics.rows import LINE_FORMAT_MAX, Rows, parse_number

from doctor.evidence.contract import Hints, Sample
from doctor.evidence.errors import EvidenceError
from doctor.evidence.redact import scrub

if TYPE_CHECKING:
    from doctor.probes.metrics.detect import Series

def _flatten(rec: dict[str, Any], prefix: str = "", depth: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in rec.items():
        key = f"{prefix}/{k}" if prefix else str(k)
        if isinstance(v, dict) and depth < 2:
            out.update(_flatten(v, key, depth + 1))
        else:
            out[key] = v
    return out


def _plan(keys: tuple[str, ...]) -> tuple[bool, list[tuple[str, str, float]]] | None:
    """How to read a record with these keys: whether to skip it (evaluation and end-of-run
    summaries), and (raw key, metric, factor) for the keys we read. Cached per key tuple, since
    a metrics file repeats the same few key sets on every line."""
    if any(k.startswith("eval_") for k in keys) or "train_runtime" in keys:
        return True, []
    out = []
    for k in keys:
        c = canonical(k)
        if c is not None:
            out.append((k, c[0], c[1]))
    return False, out


def _records_to_series(records: Any, rel: str, hints: Hints, fmt: str) -> list[Series]:
    per: dict[tuple[int | None, str | None], Rows] = {}
    ordinal: dict[tuple[int | None, str | None], int] = {}
    plans: dict[tuple[str, ...], Any] = {}
    for rec in records:
        if not isinstance(rec, dict):
            continue
        keys = tuple(rec)
        plan = plans.get(keys)
        if plan is None or plan[2]:  # new key set, or one with nested values: flatten it
            flat = rec if plan is not None and not plan[2] else _flatten(rec)
            nested = len(flat) != len(rec) or any(isinstance(v, dict) for v in rec.values())
            skip, read = _plan(tuple(str(k) for k in flat))
            if len(plans) < 1024:
                plans[keys] = (skip, read, nested)
        else:
            flat = rec
            skip, read = plan[0], plan[1]
        if skip:
            continue
        vals: dict[str, float] = {}
        step = rank = run = None
        for k, m, factor in read:
            v = flat[k]
            if m == "run":
                run = scrub(str(v))[:80]  # a name from the logs: scrubbed like any text we keep
                continue
            tv = type(v)
            if tv is float or tv is int:
                x = float(v)
            elif tv is str:
                try:
                    x = parse_number(v)
                except ValueError:
                    continue
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                x = float(v)
            else:
                continue
            if m == "step":
                step = int(x) if math.isfinite(x) else None
            elif m == "rank":
                rank = int(x) if math.isfinite(x) else None
            elif m not in vals:
                vals[m] = x * factor
        if not vals:
            continue
        key = (rank if rank is not None else hints.rank, run)
        rows = per.get(key)
        if rows is None:
            rows = per[key] = Rows()
        if step is None:
            ordinal[key] = ordinal.get(key, 0) + 1
            step = ordinal[key]
        rows.add(step, vals)
    out = []
    for (rank, run), rows in per.items():
        if not any(m in rows.vals for m in ("loss", "grad_norm", "loss_scale", "step_time")):
            continue
        parts = [rel] + ([run] if run else []) + ([f"rank{rank}"] if rank is not None and len(per) > 1 else [])
        out.append(rows.series(":".join(parts), rel, fmt, rank=rank, run=run,
                               step_from="line_order" if (rank, run) in ordinal else "column"))
    if not out:
        raise EvidenceError(rel, "no records with a training metric (loss, grad_norm, loss_scale, step_time)")
    return out


def read_jsonl(path: Path, rel: str, hints: Hints) -> list[Series]:
    size = path.stat().st_size
    if size > LINE_FORMAT_MAX:
        raise EvidenceError(rel, f"{size / 2**20:.0f} MiB JSONL is over the {LINE_FORMAT_MAX // 2**20} MiB "
                                 "line reader limit; export the metrics as CSV")
    bad = [0]
    decode = json.JSONDecoder().raw_decode

    def records() -> Any:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    rec, end = decode(line)  # json.loads without its two whitespace regexes
                except ValueError:
                    bad[0] += 1
                    continue
                if end == len(line):
                    yield rec
                else:
                    bad[0] += 1

    try:
        return _records_to_series(records(), rel, hints, "jsonl")
    except EvidenceError:
        if bad[0]:
            raise EvidenceError(rel, f"no usable JSON records ({bad[0]} line(s) are not valid JSON)") from None
        raise


def read_json(path: Path, rel: str, hints: Hints) -> list[Series]:
    """HF ``trainer_state.json`` (``log_history``) or a JSON list of metric records.

    The records are decoded one at a time (``jsonstream``): a whole-file ``json.loads`` of a
    309 MB trainer_state.json reached 4.2 GB; now memory is the text plus the rows kept. Files
    over LINE_FORMAT_MAX are refused in one line, like the other line-by-line formats.
    """
    size = path.stat().st_size
    if size > LINE_FORMAT_MAX:
        raise EvidenceError(rel, f"{size / 2**20:.0f} MiB JSON is over the {LINE_FORMAT_MAX // 2**20} MiB "
                                 "limit for JSON metrics; skipped (export the metrics as CSV)")
    text = path.read_text(encoding="utf-8", errors="replace")
    is_state = text.lstrip()[:1] == "{"
    found = [False]

    def records() -> Any:
        if not is_state:
            yield from jsonstream.elements(text)
            return
        for _key, rec, elem in jsonstream.members(text, "log_history"):
            if elem:
                found[0] = True
                yield rec

    try:
        return _records_to_series(records(), rel, hints, "json:trainer_state" if is_state else "json")
    except json.JSONDecodeError as exc:
        raise EvidenceError(rel, f"invalid JSON ({exc.msg} at line {exc.lineno})") from None
    except jsonstream.JsonShapeError as exc:
        raise EvidenceError(rel, f"invalid JSON ({exc})") from None
    except RecursionError:
        raise EvidenceError(rel, "JSON nested too deeply to parse as metrics") from None
    except EvidenceError:
        if is_state and not found[0]:
            raise EvidenceError(rel, "JSON holds no list of metric records (no log_history)") from None
        raise


def _first_char(text: str) -> str:
    """The first non-blank character of ``text`` without copying all of it (a sniff runs on
    every file of a folder: 16k stack dumps at a time)."""
    return (text[:4096].lstrip() or text.lstrip())[:1]


def looks_jsonl(sample: Sample) -> bool:
    if _first_char(sample.text) != "{":  # the first line below must start with one
        return False
    lines = [ln.strip() for ln in sample.text.splitlines()[:50] if ln.strip()]
    if len(lines) < 2 or not lines[0].startswith("{"):
        return False
    hits = 0
    for ln in lines[:-1]:  # the last line of the sample may be cut
        try:
            rec = json.loads(ln)
        except ValueError:
            return False
        if isinstance(rec, dict) and any((c := canonical(str(k))) and c[0] in ("loss", "grad_norm", "loss_scale")
                                         for k in _flatten(rec)):
            hits += 1
    return hits >= 1


def looks_json(sample: Sample) -> bool:
    return _first_char(sample.text) == "{" and '"log_history"' in sample.text and '"loss"' in sample.text
