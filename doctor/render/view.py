"""Derived views of a report shared by the Markdown and HTML renderers.

The facts namespaces these read (``stacks``, ``gpu``, ``env``) are written by probes that evolve
on their own, so every accessor here reads defensively: a missing or oddly shaped key yields an
empty view, never an exception, and the renderer simply leaves that section out.
"""

from __future__ import annotations

import difflib
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from doctor.engine.report import Report
from doctor.engine.rule import format_ranks

NO_EVIDENCE = "no evidence"
#: Per-rank keys that say where a rank is, most specific first.
_STATE_KEYS = ("state", "where", "phase", "status")
#: Namespaces asked for a rank's state, in order; others follow alphabetically.
_STATE_NS = ("stacks", "flight_recorder", "logs", "procs")
_PROC_STATES = {"S": "sleeping", "R": "running", "D": "uninterruptible (D)", "Z": "zombie",
                "T": "stopped", "I": "idle"}


@dataclass
class StackGroup:
    """One group of ranks that share a stack, normalized from ``stacks.groups``."""

    index: int
    state: str
    ranks: list[int]
    frames: list[str]
    share: float | None = None
    op: str = ""
    top: str = ""
    site: str = ""
    majority: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.ranks)

    @property
    def where(self) -> str:
        """``collective: barrier``: the state, and what in it, when the probe says."""
        return where_label(self.state, self.op)


def where_label(state: str, op: Any) -> str:
    return f"{state}: {op}" if isinstance(op, str) and op and op != state else state


def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _ints(values: Any) -> list[int]:
    out = []
    for v in _as_list(values):
        if isinstance(v, bool):
            continue
        if isinstance(v, int):
            out.append(v)
        elif isinstance(v, str) and v.isdigit():
            out.append(int(v))
    return out


def frame_text(frame: Any) -> str:
    """``name (file:line)`` from a frame given as text or as a map of any common spelling."""
    if isinstance(frame, str):
        return frame.strip()
    if isinstance(frame, dict):
        name = frame.get("name") or frame.get("function") or frame.get("func") or frame.get("fn") or "?"
        where = frame.get("file") or frame.get("filename") or frame.get("short_filename") or ""
        line = frame.get("line") or frame.get("lineno")
        if where:
            return f"{name} ({where}{':' + str(line) if line not in (None, '') else ''})"
        return str(name)
    return str(frame)


def _frames_of(g: dict[str, Any]) -> list[str]:
    for key in ("frames", "stack", "main_thread", "top_frames", "signature"):
        value = g.get(key)
        if isinstance(value, list) and value:
            return [frame_text(f) for f in value]
        if isinstance(value, str) and value.strip():
            return [ln.strip() for ln in value.splitlines() if ln.strip()]
        if isinstance(value, dict):  # e.g. main_thread: {"frames": [...]}
            inner = _frames_of(value)
            if inner:
                return inner
    return []


def stack_groups(facts: dict[str, Any]) -> list[StackGroup]:
    """``stacks.groups`` normalized, largest first (the majority group leads)."""
    groups = []
    for i, g in enumerate(_as_list(_as_dict(facts.get("stacks")).get("groups"))):
        if not isinstance(g, dict):
            continue
        share = g.get("share")
        groups.append(StackGroup(
            index=i,
            state=str(g.get("state") or g.get("kind") or "unknown"),
            ranks=sorted(set(_ints(g.get("ranks")))),
            frames=_frames_of(g),
            share=float(share) if isinstance(share, (int, float)) and not isinstance(share, bool) else None,
            op=str(g.get("op") or ""),
            top=str(g.get("top") or g.get("anchor") or ""),
            site=str(g.get("site") or ""),
            majority=g.get("majority") is True,
            extra={k: v for k, v in g.items() if isinstance(v, (str, int, float, bool))
                   and k not in ("state", "share", "op", "top", "site", "majority")},
        ))
    # The majority group leads (the probe marks it; else the largest), then by size.
    groups.sort(key=lambda g: (not g.majority, -max(g.n, int(g.extra.get("size") or 0)), g.index))
    return groups


def frame_diff(frames: list[str], base: list[str]) -> list[tuple[str, bool]]:
    """Each frame of ``frames`` with True where it is not in the majority group's stack.

    Frames are compared whole (function and place), aligned with difflib so a stack that is one
    call deeper marks only the extra calls.
    """
    if frames is base or frames == base:
        return [(f, False) for f in frames]
    changed = [True] * len(frames)
    sm = difflib.SequenceMatcher(a=base, b=frames, autojunk=False)
    for block in sm.get_matching_blocks():
        for j in range(block.b, block.b + block.size):
            changed[j] = False
    return list(zip(frames, changed, strict=True))


def rank_states(report: Report) -> dict[int, str]:
    """Where each rank is: its stack group's state, else a per-rank ``state`` in any namespace;
    ranks below the world size that no evidence covers are ``no evidence``."""
    facts = report.facts
    out: dict[int, str] = {}
    for g in stack_groups(facts):
        for r in g.ranks:
            out.setdefault(r, g.where)
    per_rank = report.ranks()
    order = list(_STATE_NS) + sorted({ns for info in per_rank.values() for ns in info} - set(_STATE_NS))
    for rank_s, info in per_rank.items():
        if not rank_s.lstrip("-").isdigit() or int(rank_s) in out:
            continue
        for ns in order:
            entry = info.get(ns)
            if not isinstance(entry, dict):
                continue
            for key in _STATE_KEYS:
                value = entry.get(key)
                if isinstance(value, str) and value:
                    value = _PROC_STATES.get(value, value) if ns == "procs" else value
                    out[int(rank_s)] = where_label(value, entry.get("op"))
                    break
            if int(rank_s) in out:
                break
        else:
            out[int(rank_s)] = "seen"
    job = _as_dict(facts.get("job"))
    ws = job.get("world_size") if isinstance(job.get("world_size"), int) else 0
    for r in _ints(job.get("ranks_seen")):
        out.setdefault(r, "seen")
    for r in range(ws or 0):
        out.setdefault(r, NO_EVIDENCE)
    return dict(sorted(out.items()))


def states_summary(states: dict[int, str]) -> list[tuple[str, list[int]]]:
    """(state, ranks) pairs, most ranks first; ``no evidence`` last."""
    by: dict[str, list[int]] = {}
    for r, s in states.items():
        by.setdefault(s, []).append(r)
    return sorted(by.items(), key=lambda kv: (kv[0] == NO_EVIDENCE, -len(kv[1]), kv[0]))


def pct(share: float) -> str:
    """A share as a percentage that never rounds a minority to 0% or a near-all to 100%."""
    if 0 < share < 0.01 or 0.99 < share < 1:
        return f"{share:.2%}"
    return f"{share:.0%}"


def ranks_phrase(ranks: list[int]) -> str:
    """``rank 3`` or ``ranks 0-2,5``."""
    return f"rank{'s' if len(set(ranks)) != 1 else ''} {format_ranks(ranks)}"


def culprit_ranks(report: Report) -> set[int]:
    """The culprits the verdict names (the top finding's): outlining every finding's ranks
    would mark most of a large job when a lesser finding names the majority."""
    return set(report.findings[0].ranks) if report.findings else set()


@dataclass
class EnvRow:
    key: str
    value: str
    differs: bool
    by_value: list[tuple[str, list[int]]]  # value -> ranks, when known per rank


def env_rows(facts: dict[str, Any]) -> list[EnvRow]:
    """Allowlisted variables, the differing ones first with the ranks behind each value."""
    env = _as_dict(facts.get("env"))
    merged = {str(k): str(v) for k, v in _as_dict(env.get("vars")).items()}
    differing = {str(k) for k in _as_list(env.get("differing"))}
    by_rank = _as_dict(env.get("by_rank"))
    rows = []
    for key in sorted(set(merged) | differing, key=lambda k: (k not in differing, k)):
        by_value: dict[str, list[int]] = {}
        if key in differing:
            for rank_s, vars_ in by_rank.items():
                if isinstance(vars_, dict) and str(rank_s).isdigit():
                    by_value.setdefault(str(vars_.get(key, "(unset)")), []).append(int(rank_s))
        rows.append(EnvRow(key, merged.get(key, "(unset)"), key in differing,
                           sorted(by_value.items(), key=lambda kv: -len(kv[1]))))
    return rows


_GPU_HIDDEN = re.compile(r"uuid|serial", re.I)  # identifying, not diagnostic (as collect_env does)
_GPU_FLAGS = ("lost", "hw_fault", "throttle_fault", "hot", "slow_vs_peers", "pcie_degraded", "mem_full",
              "at_power_cap", "power_limit_lowered", "clocks_locked_low", "busy_low_power")


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


def _gpu_label(d: dict[str, Any]) -> str:
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


#: (column, formatter) for ``gpu.devices`` records as the gpu probe writes them; flat spellings
#: (``mem_used_mb``, ``power_w``) are read too so other sources still fill the table.
_GPU_COLUMNS: list[tuple[str, Any]] = [
    ("GPU", _gpu_label),
    ("name", lambda d: str(d.get("name") or "")),
    ("ranks", lambda d: format_ranks(_ints(d.get("ranks"))) if _ints(d.get("ranks")) else ""),
    ("util %", lambda d: _sub(d, "util", "gpu", ("utilization", "gpu_util"))),
    ("mem MiB used / total", lambda d: _pair(d, "mem", "used_mib", "total_mib", ("mem_used_mb", "memory_used"))),
    ("temp C", lambda d: _sub(d, "temp", "gpu", ("temperature",))),
    ("power W draw / limit", lambda d: _pair(d, "power", "draw_w", "limit_w", ("power_w",))),
    ("SM MHz / max", lambda d: (f"{_num((d.get('clocks') or {}).get('sm'))} / {_num((d.get('max_clocks') or {}).get('sm'))}"
                                if isinstance(d.get("clocks"), dict) and (d.get("clocks") or {}).get("sm") is not None
                                and isinstance(d.get("max_clocks"), dict) else _sub(d, "clocks", "sm", ("sm_clock",)))),
    ("PCIe", _pcie),
    ("flags", lambda d: ", ".join(f for f in _GPU_FLAGS if d.get(f) is True)),
    ("clock reasons", lambda d: ", ".join(str(r) for r in _as_list(d.get("reasons"))[:6])),
]


def gpu_table(facts: dict[str, Any], max_cols: int = 12) -> tuple[list[str], list[dict[str, str]], list[bool]]:
    """Columns, formatted rows and a "look here" flag per GPU from ``gpu.devices``.

    Columns no device fills are dropped; identifiers (UUIDs, serials) are never shown.
    """
    devices = [d for d in _as_list(_as_dict(facts.get("gpu")).get("devices")) if isinstance(d, dict)]
    rows: list[dict[str, str]] = []
    for d in devices:
        row = {}
        for col, fn in _GPU_COLUMNS:
            try:
                row[col] = str(fn(d) or "")
            except (TypeError, ValueError, AttributeError):
                row[col] = ""
        rows.append(row)
    cols = [c for c, _ in _GPU_COLUMNS if any(r.get(c) for r in rows[:4096])]
    if len(cols) < 3 and devices:  # an unknown shape: show its scalar fields as they are
        extra: list[str] = []
        for d in devices[:256]:
            for k, v in d.items():
                if k not in extra and not _GPU_HIDDEN.search(k) and isinstance(v, (str, int, float, bool)):
                    extra.append(k)
        for r, d in zip(rows, devices, strict=True):
            r.update({k: cell(d.get(k)) for k in extra})
        cols += [k for k in extra if k not in cols]
    flagged = [any(d.get(f) is True for f in _GPU_FLAGS) for d in devices]
    return cols[:max_cols], rows, flagged


def gpu_named(rows: list[dict[str, str]], report: Report) -> list[bool]:
    """Which rows are GPUs a finding names (by label, e.g. ``node3:gpu5``)."""
    named = {str(g) for f in report.findings for g in f.gpus}
    return [bool(named) and r.get("GPU", "") in named for r in rows]


def cell(value: Any) -> str:
    """A short text for a table cell."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.0f}"
    if isinstance(value, list):
        if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return format_ranks(value)
        return ", ".join(str(v) for v in value[:8]) + (" ..." if len(value) > 8 else "")
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in list(value.items())[:6])
    return str(value)


def job_name(report: Report) -> str:
    """A short job label for file names: the launcher's job key, the SLURM job, or the folder."""
    src = report.source or {}
    target = _as_dict(src.get("target"))
    for value in (src.get("job"), target.get("job"), target.get("slurm_job"), target.get("name")):
        if isinstance(value, (str, int)) and str(value):
            return str(value)
    env_vars = _as_dict(_as_dict(report.facts.get("env")).get("vars"))
    for key in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        value = env_vars.get(key)
        if value and value != "none":
            return str(value)
    path = src.get("path")
    if isinstance(path, str) and path:
        name = Path(path).name
        for suffix in (".tar.gz", ".tgz", ".tar"):
            name = name.removesuffix(suffix)
        return name or "job"
    return "job"


def reproduce_commands(report: Report, bundle_name: str | None) -> list[str]:
    """How to get this diagnosis again from what is attached to the ticket."""
    if bundle_name:
        q = shlex.quote(bundle_name)
        return [f"sha256sum -c {q}.sha256", f"mldoctor diagnose --from {q}",
                f"mldoctor report {q} --format html --out report.html"]
    path = (report.source or {}).get("path")
    if isinstance(path, str) and path and (report.source or {}).get("type") in ("bundle", "loose"):
        return [f"mldoctor diagnose --from {shlex.quote(path)}"]
    return ["mldoctor diagnose --out DIR   # on the job's host, to keep a bundle"]


def verdict_paragraph(report: Report) -> str:
    """The one-paragraph verdict: state, what, where, how sure, how much evidence (plain text)."""
    v = report.verdict
    head = f"{str(v.get('state', 'unknown')).upper()}: {v.get('summary', '')}".strip()
    return f"{head} {verdict_details(report)}".strip()


def verdict_details(report: Report) -> str:
    """The verdict paragraph after its summary line: top cause, culprits, confidence, coverage."""
    facts = report.facts
    job = _as_dict(facts.get("job"))
    ev = _as_dict(facts.get("evidence"))
    parts: list[str] = []
    if report.findings:
        top = report.findings[0]
        where = f" on {ranks_phrase(top.ranks)}" if top.ranks else ""
        if top.hosts:
            where += f" ({', '.join(top.hosts[:4])}{', ...' if len(top.hosts) > 4 else ''})"
        parts.append(f"Most likely cause: {top.cause}{where}, {top.severity} severity, "
                     f"confidence {top.confidence:.2f}.")
        if len(report.findings) > 1:
            parts.append(f"{len(report.findings) - 1} other finding(s) below.")
    ws = job.get("world_size") or 0
    seen = job.get("n_ranks_seen") or len(_as_list(job.get("ranks_seen")))
    kinds = ", ".join(str(k) for k in _as_list(ev.get("kinds"))) or "nothing recognized"
    cover = f"Evidence: {ev.get('files', 0)} file(s) ({kinds})"
    if ws:
        cover += f" covering {seen} of {ws} ranks"
    missing = _ints(job.get("missing_ranks"))
    if missing:
        cover += f"; no evidence from {ranks_phrase(missing)}"
    hosts = _as_list(job.get("hosts"))
    if hosts:
        cover += f"; {len(hosts)} host(s)"
    parts.append(cover + ".")
    return " ".join(p for p in parts if p)
