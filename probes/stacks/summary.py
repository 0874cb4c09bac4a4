"""From raw threads to classified summaries: which thread is the main one, and one classification
per distinct stack (thousands of ranks wait in the same frames, so the cache does the work).
"""

from __future__ import annotations

import re
import sys
from typing import Any

from doctor.probes.stacks import classify as ss
from doctor.probes.stacks.model import ProcDump, RawProc, RawThread, ThreadSum

_HEX = re.compile(r"^0x[0-9a-fA-F]+$")


def _pick_main(proc: RawProc) -> RawThread | None:
    ts = proc.threads
    if not ts:
        return None
    for t in ts:
        if t.name == "MainThread":
            return t
    if proc.pid is not None:
        for t in ts:
            if t.tid == str(proc.pid):
                return t
    for t in ts:  # the thread started by the interpreter itself ends in <module>
        py = [f for f in t.frames if not f[3]]
        if py and py[-1][0] == "<module>":
            return t
    if proc.fmt == "faulthandler":
        return ts[-1]  # faulthandler lists the newest thread first, the main thread last
    return ts[0]


#: (frames, active, gil) -> the classification's fields after tid, name, active, gil, in
#: ThreadSum's order (one tuple: a hit is unpacked into the new ThreadSum in one call).
_SUMMARY_CACHE: dict[tuple[Any, ...], tuple[Any, ...]] = {}


def summarize(t: RawThread) -> ThreadSum:
    """Classify one thread and reduce it to what the analysis needs. Threads with the same frames
    and activity share one classification (thousands of ranks wait in the same frames)."""
    key = (tuple(t.frames), t.active, t.gil)
    hit = _SUMMARY_CACHE.get(key)
    if hit is None:
        s = _summarize(t)
        # worker ("") is filled per process by to_dump, never shared
        hit = (s.state, s.op, s.top, s.anchor, s.site, s.sig, s.exact, s.frames, "", s.native, s.role)
        if len(_SUMMARY_CACHE) > 200_000:
            _SUMMARY_CACHE.clear()
        _SUMMARY_CACHE[key] = hit
    return ThreadSum(t.tid, t.name, t.active, t.gil, *hit)


def _summarize(t: RawThread) -> ThreadSum:
    frames = t.frames
    v = ss.classify(frames, t.active)
    py = [f for f in frames if not f[3]]
    if py:
        key_frames = py
    else:
        key_frames = [f for f in frames if not _HEX.match(f[0])][:12]
    sig = sys.intern(f"{v.state}|{v.op}|" + ";".join(f"{f[0]}@{f[1]}" for f in key_frames))
    exact = sys.intern(";".join(f"{f[0]}@{f[1]}:{f[2]}" for f in (py or key_frames)))
    anchor = ss.fmt_frame(frames[v.anchor]) if v.anchor >= 0 else ""
    # the innermost Python frame; a native-only stack (gdb) shows the frame that decided instead
    top_frame = py[0] if py else (frames[v.anchor] if v.anchor >= 0 else (key_frames[0] if key_frames else None))
    return ThreadSum(
        tid=t.tid, name=t.name, active=t.active, gil=t.gil, state=v.state, op=v.op,
        top=ss.fmt_frame(top_frame) if top_frame else "",
        anchor=anchor, site=ss.call_site(frames, max(v.anchor, 0)),
        sig=sig, exact=exact,
        frames=tuple(sys.intern(f"{f[0]} ({f[1]})") for f in key_frames[:8]),
        native=len(py) != len(frames), role=ss.role_of(frames),
    )


def to_dump(p: RawProc, snapshot_base: int, path: str) -> ProcDump:
    main_raw = _pick_main(p)
    main = summarize(main_raw) if main_raw is not None else None
    others = [summarize(t) for t in p.threads if t is not main_raw]
    role = main.role if main is not None else "rank"
    if role == "worker" and main is not None and main_raw is not None:
        main.worker = ss.worker_activity(main_raw.frames, main_raw.active)
    native = (main is not None and main.native) or any(t.native for t in others)
    # positional, in ProcDump's field order (host is set by the probe): one per process
    return ProcDump(p.pid, p.rank, role, p.fmt, native, snapshot_base + p.seq, main, others, p.parent,
                    None, p.local_rank, p.rank_source, p.truncated, path)
