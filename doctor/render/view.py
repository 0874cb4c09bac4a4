"""Derived views of a report shared by the Markdown and HTML renderers and the TUI.

Nothing here reads a probe's facts namespace: what each evidence kind shows comes from its probe
(``Probe.report_sections``, ``rank_states``, ``job_label``), collected by looping over the
registry, so a new kind appears in every report without a renderer edit. A probe whose report
code fails costs its own section only, never the report.
"""

from __future__ import annotations

import difflib
import shlex
from pathlib import Path
from typing import Any

from doctor.engine.report import Report
from doctor.engine.rule import format_ranks
from doctor.evidence import plugins
from doctor.evidence.contract import Probe
from doctor.evidence.sections import Group, Groups, Section, SectionContext, int_list

NO_EVIDENCE = "no evidence"


def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def section_context(report: Report) -> SectionContext:
    """What probes may highlight: the verdict's culprit ranks and every GPU a finding names."""
    return SectionContext(culprit_ranks=culprit_ranks(report),
                          gpus={str(g) for f in report.findings for g in f.gpus})


def sections(report: Report, probes: tuple[Probe, ...] | None = None) -> list[Section]:
    """Every registered probe's report sections, by ``order`` then id."""
    ctx = section_context(report)
    out: list[Section] = []
    for probe in plugins.probes() if probes is None else probes:
        try:
            got = probe.report_sections(report.facts, ctx)
        except Exception:  # a probe's report code must never cost the report
            continue
        out += [s for s in got or [] if isinstance(s, Section)]
    return sorted(out, key=lambda s: (s.order, s.id))


def section(report: Report, section_id: str) -> Section | None:
    return next((s for s in sections(report) if s.id == section_id), None)


def stack_groups(report: Report) -> list[Group]:
    """The groups of the first ``groups`` section (ranks sharing a stack), the base first."""
    for s in sections(report):
        if isinstance(s.body, Groups):
            return s.body.groups
    return []


def frame_diff(frames: list[str], base: list[str]) -> list[tuple[str, bool]]:
    """Each frame of ``frames`` with True where it is not in the base group's stack.

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


def _ask(method: str, report: Report, default: Any) -> list[tuple[Probe, Any]]:
    out = []
    for probe in plugins.probes():
        try:
            out.append((probe, getattr(probe, method)(report.facts)))
        except Exception:  # one probe's answer must never cost the report
            out.append((probe, default))
    return out


def rank_states(report: Report) -> dict[int, str]:
    """Where each rank is: the first answer of the probes by ``rank_state_order`` (stack groups,
    then flight recorder, logs, processes); ranks some evidence names without a state are
    ``seen``; ranks below the world size that no evidence covers are ``no evidence``."""
    facts = report.facts
    out: dict[int, str] = {}
    answers = _ask("rank_states", report, {})
    for _, states in sorted(answers, key=lambda pa: (pa[0].rank_state_order, pa[0].name)):
        for rank, state in (states or {}).items():
            if isinstance(rank, int) and isinstance(state, str) and state:
                out.setdefault(rank, state)
    for rank_s in report.ranks():
        if rank_s.lstrip("-").isdigit():
            out.setdefault(int(rank_s), "seen")
    job = _as_dict(facts.get("job"))
    ws = job.get("world_size") if isinstance(job.get("world_size"), int) else 0
    for r in int_list(job.get("ranks_seen")):
        out.setdefault(r, "seen")
    for r in range(ws or 0):
        out.setdefault(r, NO_EVIDENCE)
    return dict(sorted(out.items()))


def host_names(report: Report) -> list[str]:
    """Host names the probes find in their facts (for the report scrubber to alias)."""
    return [n for _, names in _ask("host_names", report, []) for n in names or [] if isinstance(n, str)]


def rank_details(report: Report) -> dict[str, dict[int, str]]:
    """Extra per-rank columns the probes offer (``stack group``, ``last collective``)."""
    out: dict[str, dict[int, str]] = {}
    answers = _ask("rank_details", report, {})
    for _, cols in sorted(answers, key=lambda pa: (pa[0].rank_state_order, pa[0].name)):
        for name, col in (cols or {}).items():
            out.setdefault(str(name), {}).update(col if isinstance(col, dict) else {})
    return out


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
    for _, label in _ask("job_label", report, ""):
        if isinstance(label, str) and label:
            return label
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
    missing = int_list(job.get("missing_ranks"))
    if missing:
        cover += f"; no evidence from {ranks_phrase(missing)}"
    hosts = _as_list(job.get("hosts"))
    if hosts:
        cover += f"; {len(hosts)} host(s)"
    parts.append(cover + ".")
    if v_missing := str(report.verdict.get("missing") or ""):
        parts.append(f"Missing evidence: {v_missing}")
    return " ".join(p for p in parts if p)
