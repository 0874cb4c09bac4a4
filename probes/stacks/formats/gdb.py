"""gdb output: ``thread apply all bt`` (and ``py-bt``) or a bare ``bt`` pasted from an interactive
session, whose wrapped frames and argument lists have to be undone before a frame reads like
any other tool's.
"""

from __future__ import annotations

import re

from doctor.probes.stacks.formats.common import clean_native
from doctor.probes.stacks.formats.traceback import TB_FRAME, pybt_entry
from doctor.probes.stacks.model import RawProc, RawThread

_GDB_THREAD = re.compile(r"^Thread (\d+) \((?:Thread (0x[0-9a-fA-F]+) )?\(?LWP (\d+)\)?\)?(?: \"([^\"]*)\")?\):?\s*$")
GDB_FRAME = re.compile(r"^#(\d+)\s+(?:(0x[0-9a-fA-F]+) in )?(.*)$")
_GDB_LOC = re.compile(r" (?:at|from) (\S+?)(?::(\d+))?$")
_GDB_DETACH = re.compile(r"^\[Inferior \d+ \(process (\d+)\) detached\]")
SNIFF_GDB = re.compile(r"(?m)^Thread \d+ \((?:Thread 0x[0-9a-fA-F]+ )?\(?LWP \d+")
#: a bare ``(gdb) bt`` of one thread: frame #0 without any ``Thread N (...)`` header
SNIFF_GDB_BARE = re.compile(r"(?m)^#0 +(?:0x[0-9a-fA-F]+ in )?[A-Za-z_~?.<][^\n]*\(")
#: a long frame wrapped by an interactive gdb continues on lines indented by 3-4 spaces
#: (``   from /lib/...``, ``    func=0x...) at file.c:70``); ``bt full`` locals are indented by 8
_GDB_CONT = re.compile(r"^ {1,7}(?! )[^#\s]")
GDB_PROMPT = re.compile(r"^\(gdb\)")


def _strip_call_args(text: str) -> str:
    """``func (a=1, f=0x.. <x()>)`` -> ``func``: drop the argument list gdb prints after a frame's
    function, matching its parentheses (arguments hold ``()`` of their own, C++ names too)."""
    if not text.endswith(")"):
        return text
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        c = text[i]
        if c == ")":
            depth += 1
        elif c == "(":
            depth -= 1
            if depth == 0:
                return text[:i].rstrip() if i > 0 and text[i - 1] == " " else text
    cut = text.rfind(" (")  # unbalanced (a string argument with a parenthesis): the old way
    return text[:cut] if cut > 0 else text


def _gdb_frame(rest: str) -> tuple[str, str, int, bool]:
    """One gdb frame's text after ``#N  [0x.. in ]``: function, file (or library), line."""
    loc = _GDB_LOC.search(rest)
    if loc:
        path, line = loc.group(1), int(loc.group(2) or 0)
        file = path.rsplit("/", 1)[-1] if not line else path.removeprefix("./").removeprefix("../")
        rest = rest[:loc.start()]
    else:
        file, line = "??", 0
    name = _strip_call_args(rest.strip())
    return (clean_native(name) or "??", file, line, True)


def _join_gdb_lines(lines: list[str]) -> list[str]:
    """Join the continuation lines of frames an interactive gdb wrapped at the terminal width
    (pasted ``bt`` output) to their frame line; ``bt full`` locals (8 spaces) stay apart."""
    out: list[str] = []
    open_frame = False
    for ln in lines:
        if open_frame and _GDB_CONT.match(ln) and not TB_FRAME.match(ln):
            out[-1] = out[-1].rstrip() + " " + ln.strip()
            continue
        open_frame = bool(GDB_FRAME.match(ln))
        out.append(ln)
    return out


def parse_gdb(lines: list[str], notes: list[str]) -> list[RawProc]:
    """``thread apply all bt`` (and ``py-bt``) with ``Thread N (...)`` headers, or a bare ``bt``
    of one thread without any header (pasted from an interactive session)."""
    procs: list[RawProc] = []
    cur: RawProc | None = None
    thread: RawThread | None = None
    nums: set[int] = set()
    bare: RawProc | None = None  # the process a headerless ``bt`` started
    for ln in _join_gdb_lines(lines):
        m = GDB_FRAME.match(ln)
        if m:
            if thread is None or (cur is bare and m.group(1) == "0" and thread.frames):
                if cur is None or cur is not bare:
                    cur = bare = RawProc(None, "gdb")
                    procs.append(cur)
                if m.group(1) != "0" and cur.threads:
                    thread = cur.threads[-1]  # the same bt, after a blank line
                else:  # a new ``bt`` (of another thread: ``thread 3`` then ``bt``)
                    thread = RawThread("", "", current=not cur.threads)
                    cur.threads.append(thread)
            thread.frames.append(_gdb_frame(m.group(3)))
            continue
        if thread is not None:
            entry = pybt_entry(ln)
            if entry is not None:  # ``thread apply all py-bt``: Python frames, innermost first
                if isinstance(entry, tuple):
                    thread.frames.append(entry)
                    if cur is not None:
                        cur.fmt = "gdb_pybt"
                continue
        m = _GDB_THREAD.match(ln)
        if m:
            num = int(m.group(1))
            if cur is not None and cur is bare:
                # a bare ``bt`` before ``thread apply all bt``: the full dump holds that thread too
                if procs and procs[-1] is bare:
                    procs.pop()
                cur = bare = None
            if cur is None or num in nums:  # thread numbers repeat: the next process's dump
                cur = RawProc(None, "gdb")
                procs.append(cur)
                nums = set()
            nums.add(num)
            thread = RawThread(m.group(3), m.group(4) or "")
            thread.current = num == 1
            cur.threads.append(thread)
            continue
        m = _GDB_DETACH.match(ln)
        if m and cur is not None and cur.pid is None:
            cur.pid = int(m.group(1))
            continue
        if not ln.strip():
            thread = None
    for p in procs:
        if p.pid is None:
            first = next((t for t in p.threads if t.current), None)
            p.pid = int(first.tid) if first and first.tid.isdigit() else None
    return procs
