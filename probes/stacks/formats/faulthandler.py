"""Python faulthandler dumps (``dump_traceback_later``, ``SIGUSR1`` handlers, fatal errors): one
dump per ``Timeout``/``Fatal Python error`` line or repeated thread id.
"""

from __future__ import annotations

import re

from doctor.probes.stacks.model import RawProc, RawThread

_FH_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[([^\]]*)\]| \"([^\"]*)\")? \(most recent call first\):\s*$")
FH_STACK = re.compile(r"^Stack \(most recent call first\):\s*$")
FH_FRAME = re.compile(r"^  File \"(.*)\", line (\d+) in (.+?)\s*$")
FH_NEW_DUMP = re.compile(r"^(Timeout \(\d+:\d\d:\d\d(?:\.\d+)?\)!|Fatal Python error: .*)$")
FH_OTHER = re.compile(r"^(  <no Python frame>|  \.\.\.|  Garbage-collecting|Extension modules: .*|\s*)$")
SNIFF_FH = re.compile(r"(?m)^(?:\[[^\]\n]{1,40}\]:[ \t]?)?(?:(?:Current thread|Thread) 0x[0-9a-fA-F]+.*|Stack) \(most recent call first\):")


def parse_faulthandler(lines: list[str], notes: list[str]) -> list[RawProc]:
    procs: list[RawProc] = []
    cur: RawProc | None = None
    thread: RawThread | None = None
    ids: set[str] = set()

    def new_dump() -> RawProc:
        p = RawProc(None, "faulthandler", seq=len(procs))
        procs.append(p)
        ids.clear()
        return p

    for ln in lines:
        m = FH_FRAME.match(ln)
        if m and thread is not None:
            name = m.group(3)
            thread.frames.append((name, m.group(1), int(m.group(2)), False))
            continue
        if ln.startswith("  Garbage-collecting") and thread is not None:
            thread.frames.append(("Garbage-collecting", "<gc>", 0, False))
            continue
        m = _FH_THREAD.match(ln)
        if m or FH_STACK.match(ln):
            tid = m.group(2) if m else "0x0"
            if cur is None or tid in ids:
                cur = new_dump()
            ids.add(tid)
            thread = RawThread(tid, (m.group(3) or m.group(4) or "") if m else "",
                                current=bool(m and m.group(1) == "Current thread"))
            cur.threads.append(thread)
            continue
        if FH_NEW_DUMP.match(ln):
            if ln.startswith("Fatal Python error"):
                notes.append(f"faulthandler: {ln.strip()[:160]}")
            cur, thread = new_dump(), None
            continue
        if not FH_OTHER.match(ln):
            thread = None
    return [p for p in procs if p.threads]
