"""py-spy ``dump`` text (with ``--native``, ``--locals``, ``--subprocesses``, or pasted without
thread ids); locals are skipped as they are read, because they are where secrets live.
"""

from __future__ import annotations

import re
import sys
from functools import lru_cache

from doctor.probes.stacks.formats.common import RANK_LINE, is_native_file
from doctor.probes.stacks.model import RawProc, RawThread

PS_PROCESS = re.compile(r"^Process (\d+): ?(.*)$")
_PS_PYTHON = re.compile(r"^Python v(\S+)")
_PS_PARENT = re.compile(r"^Parent Process (\d+):")
#: the thread id is optional: dumps pasted into issue threads often come without it
#: (``Thread (idle): "MainThread"``)
_PS_THREAD = re.compile(r"^Thread (?:(0x[0-9A-Fa-f]+|\d+) )?\((idle|active\+gil|active|gil|idle\+gil)\)(?:: \"(.*)\")?\s*$")
SNIFF_PYSPY = re.compile(r"(?m)^(?:\[[^\]\n]{1,40}\]:[ \t]?)?Thread (?:(?:0x[0-9A-Fa-f]+|\d+) )?\((?:idle|active|active\+gil|gil|idle\+gil)\)")
SNIFF_PYSPY_FRAME = re.compile(r"(?m)^(?:\[[^\]\n]{1,40}\]:[ \t]?)? {4}\S.* \([^()\n]+\)$")


@lru_cache(maxsize=1 << 16)
def _frame_from_pyspy(body: str) -> tuple[str, str, int, bool] | None:
    """``name (file:line)`` or ``name (lib)``; the name may hold spaces and parentheses (C++).
    Cached: the same frame lines recur across ranks."""
    if not body.endswith(")"):
        return None
    idx = body.rfind(" (")
    if idx <= 0:
        return None
    name, inner = body[:idx], body[idx + 2:-1]
    file, sep, line = inner.rpartition(":")
    if not (sep and line.isdigit()):
        file, line = inner, "0"
    return sys.intern(name), sys.intern(file), int(line), is_native_file(file)


#: Frame line as printed -> its frame (or None): ranks of one job print the same lines, so each
#: distinct line is split once (one dict lookup per line instead of a slice, a strip and a call).
_FRAME_LINES: dict[str, tuple[str, str, int, bool] | None] = {}
_MISS = object()


def parse_pyspy_text(lines: list[str], notes: list[str]) -> list[RawProc]:
    procs: list[RawProc] = []
    cur: RawProc | None = None
    thread: RawThread | None = None
    pending_rank: int | None = None
    seen: dict[int, int] = {}  # dumps per pid so far (a plain dict: a Counter costs more per file)
    cache = _FRAME_LINES
    append = None  # the current thread's frames.append
    for ln in lines:
        if ln.startswith("    "):
            if thread is None:
                continue
            # the cache holds only frame-shaped lines (never --locals lines, which it does not
            # keep: secrets), so a hit is a frame line or a blank indented line (None)
            fr = cache.get(ln, _MISS)
            if fr is _MISS:
                if ln.startswith("        "):
                    continue  # --locals lines: never kept (secrets), nor cached
                if len(cache) > 1 << 16:
                    cache.clear()
                fr = cache[ln] = _frame_from_pyspy(ln[4:].rstrip()) if ln[4:5].strip() else None  # a blank indented line is no frame
            if fr is not None:
                append(fr)
            continue
        if not ln.strip():
            continue
        head = ln[0]
        m = _PS_THREAD.match(ln) if head == "T" else None
        if m:
            if cur is None:  # threads without a Process header (pasted output)
                cur = RawProc(None, "pyspy_text")
                procs.append(cur)
            tid, status, name = m.groups()
            thread = RawThread(tid or "", name or "", status.startswith("active"), "gil" in status)
            append = thread.frames.append
            cur.threads.append(thread)
            continue
        m = PS_PROCESS.match(ln) if head == "P" else None
        if m:
            pid = int(m.group(1))
            n = seen.get(pid, 0)
            cur = RawProc(pid, "pyspy_text", seq=n)
            seen[pid] = n + 1
            if pending_rank is not None:
                cur.rank, cur.rank_source, pending_rank = pending_rank, "rank_line", None
            procs.append(cur)
            thread = None
            continue
        m = _PS_PARENT.match(ln) if head == "P" else None
        if m and cur is not None:
            cur.parent = int(m.group(1))
            continue
        if _PS_PYTHON.match(ln) or ln.startswith("-----"):
            continue
        m = RANK_LINE.match(ln)
        if m:
            pending_rank = int(m.group(1) or m.group(2))
            thread = None
            continue
        if ln.startswith(("Error:", "Reason:", "Permission Denied")):
            notes.append(f"py-spy error in the file: {ln.strip()[:160]}")
            thread = None
    return procs
