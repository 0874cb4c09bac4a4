"""The stacks kind's part of the report: ranks grouped by identical stacks, and where each rank is.

``stacks.groups`` is read defensively (frames as text or as maps of any common spelling, shares
that may be missing), so an older bundle or a hand-made facts document still gives a picture.
"""

from __future__ import annotations

from typing import Any

from doctor.evidence.contract import where_label
from doctor.evidence.sections import Group, Groups, Section, SectionContext, int_list

_SCALARS = (str, int, float, bool)


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


def stack_groups(facts: dict[str, Any]) -> list[Group]:
    """``stacks.groups`` as report groups, the majority first (the probe marks it; else the
    largest), then by size."""
    ns = facts.get("stacks")
    raw = ns.get("groups") if isinstance(ns, dict) else None
    keyed = []
    for i, g in enumerate(raw if isinstance(raw, list) else []):
        if not isinstance(g, dict):
            continue
        share = g.get("share")
        ranks = sorted(set(int_list(g.get("ranks"))))
        size = g.get("size") if isinstance(g.get("size"), _SCALARS) else 0
        group = Group(
            id=str(g.get("id") if isinstance(g.get("id"), _SCALARS) and g.get("id") else f"g{i}"),
            label=where_label(str(g.get("state") or g.get("kind") or "unknown"), str(g.get("op") or "")),
            ranks=ranks,
            lines=_frames_of(g),
            share=float(share) if isinstance(share, (int, float)) and not isinstance(share, bool) else None,
            site=str(g.get("site") or ""),
            top=str(g.get("top") or g.get("anchor") or ""),
            majority=g.get("majority") is True,
        )
        keyed.append(((not group.majority, -max(group.n, int(size or 0)), i), group))
    return [g for _, g in sorted(keyed, key=lambda kv: kv[0])]


def sections(facts: dict[str, Any], context: SectionContext) -> list[Section]:
    groups = stack_groups(facts)
    if not groups:
        return []
    return [Section(id="stacks", title="Stack groups", nav="Stacks", order=20, body=Groups(groups),
                    summary=f"{len(groups)} group(s) of ranks with the same stack")]


def rank_states(facts: dict[str, Any]) -> dict[int, str]:
    """Each rank's stack group's state (``collective: barrier``)."""
    out: dict[int, str] = {}
    for g in stack_groups(facts):
        for r in g.ranks:
            out.setdefault(r, g.label)
    return out


def rank_details(facts: dict[str, Any]) -> dict[str, dict[int, str]]:
    ns = facts.get("stacks")
    by_rank = ns.get("by_rank") if isinstance(ns, dict) else None
    col: dict[int, str] = {}
    for rank_s, info in (by_rank.items() if isinstance(by_rank, dict) else ()):
        if isinstance(info, dict) and str(rank_s).lstrip("-").isdigit() and info.get("group"):
            col[int(rank_s)] = str(info["group"])
    return {"stack group": col}
