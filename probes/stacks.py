"""Thread stacks of every rank: py-spy dumps (text, ``--json``, ``--native``, ``--locals``,
``--subprocesses``), Python faulthandler dumps and gdb ``thread apply all bt`` output, and the
looser shapes pasted into issue threads: a bare gdb ``bt`` of one thread, gdb ``py-bt``, py-spy
text without thread ids, traceback-style stacks (``traceback.format_stack``) and IDE call stacks.

Where each rank's main thread waits is the most direct evidence of a hang: peers in a collective,
the odd rank in its DataLoader, a checkpoint write, a lock. ``build`` classifies every thread
(``doctor.probes.stackstate``), groups ranks STAT-style by stack signature, and names the majority and
the outliers, so rules read a handful of groups instead of thousands of ranks.

Live, ``collect`` runs ``py-spy dump --json`` on every rank in parallel (py-spy ptraces and
pauses the process for the dump's duration, measured as ``pause_s``; it never signals it).
Local variables (``--locals``) are never kept: they are where secrets live.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

from doctor.probes import stackstate as ss
from doctor.probes.common.text import EXC_LINE

from doctor.evidence.contract import Hints, Parsed, Probe, ProbeFailed, ProbeSkipped, Sample
from doctor.evidence.errors import EvidenceError

# ---------------------------------------------------------------------------------------------
# what a parsed dump holds


@dataclass(slots=True)
class ThreadSum:
    """One thread, classified. ``sig`` groups stacks (function+file, no lines); ``exact`` (with
    lines) tells a frozen stack from a moving one across snapshots."""

    tid: str
    name: str
    active: bool | None
    gil: bool | None
    state: str
    op: str
    top: str
    anchor: str
    site: str
    sig: str
    exact: str
    frames: tuple[str, ...]
    worker: str = ""  # for a DataLoader worker's main thread: waiting | busy | blocked
    native: bool = False  # the stack has native frames
    role: str = "rank"  # the process's role if this is its main thread (stackstate.role_of)


@dataclass(slots=True)
class ProcDump:
    """One process's dump: its main thread and the others, with where the dump came from."""

    pid: int | None
    rank: int | None
    role: str  # rank | worker (DataLoader) | child (other child of a rank) | launcher | helper
    fmt: str  # pyspy_text | pyspy_json | faulthandler | gdb | gdb_pybt | traceback | ide
    native: bool
    snapshot: int
    main: ThreadSum | None
    others: list[ThreadSum]
    parent: int | None = None
    host: str | None = None
    local_rank: int | None = None
    rank_source: str = ""
    truncated: bool = False
    path: str = ""


@dataclass(slots=True)
class DumpError:
    """A rank whose live dump failed (written by ``collect``): the failure is itself evidence."""

    rank: int | None
    pid: int | None
    kind: str  # gone | permission | unsupported | timeout | error
    reason: str
    snapshot: int = 0


# ---------------------------------------------------------------------------------------------
# text formats

_PREFIX = re.compile(r"^\[([^\[\]\n]{1,40})\]:")
_PREFIX_RANK = re.compile(r"^(?:rank)?(\d{1,6})$", re.I)
_PREFIX_LOCAL = re.compile(r"^[A-Za-z_][\w.-]*?(\d{1,6})$")

_PS_PROCESS = re.compile(r"^Process (\d+): ?(.*)$")
_PS_PYTHON = re.compile(r"^Python v(\S+)")
_PS_PARENT = re.compile(r"^Parent Process (\d+):")
#: the thread id is optional: dumps pasted into issue threads often come without it
#: (``Thread (idle): "MainThread"``)
_PS_THREAD = re.compile(r"^Thread (?:(0x[0-9A-Fa-f]+|\d+) )?\((idle|active\+gil|active|gil|idle\+gil)\)(?:: \"(.*)\")?\s*$")

_FH_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[([^\]]*)\]| \"([^\"]*)\")? \(most recent call first\):\s*$")
_FH_STACK = re.compile(r"^Stack \(most recent call first\):\s*$")
_FH_FRAME = re.compile(r"^  File \"(.*)\", line (\d+) in (.+?)\s*$")
_FH_NEW_DUMP = re.compile(r"^(Timeout \(\d+:\d\d:\d\d(?:\.\d+)?\)!|Fatal Python error: .*)$")
_FH_OTHER = re.compile(r"^(  <no Python frame>|  \.\.\.|  Garbage-collecting|Extension modules: .*|\s*)$")

_GDB_THREAD = re.compile(r"^Thread (\d+) \((?:Thread (0x[0-9a-fA-F]+) )?\(?LWP (\d+)\)?\)?(?: \"([^\"]*)\")?\):?\s*$")
_GDB_FRAME = re.compile(r"^#(\d+)\s+(?:(0x[0-9a-fA-F]+) in )?(.*)$")
_GDB_LOC = re.compile(r" (?:at|from) (\S+?)(?::(\d+))?$")
_GDB_DETACH = re.compile(r"^\[Inferior \d+ \(process (\d+)\) detached\]")

_RANK_LINE = re.compile(
    r"^\s*(?:export\s+)?(?:RANK|SLURM_PROCID|OMPI_COMM_WORLD_RANK|PMI_RANK)\s*[=:]\s*(\d{1,6})\s*$"
    r"|^\W*\brank\s*[:=#]?\s*(\d{1,6})\W*$", re.I)
_HEX = re.compile(r"^0x[0-9a-fA-F]+$")
_SNAP = re.compile(r"snap(?:shot)?[-_]?(\d{1,4})(?!\d)", re.I)
_JSON_START = re.compile(r"^\s*(\[\s*[\{\]]|\{)")
#: ``pyspy-worker0-of-rank3.txt``, ``pyspy-worker4242-of-rank3-snap0.json``: a rank's child process
_WORKER_NAME = re.compile(r"worker\d*[-_]of[-_]", re.I)

_SNIFF_PYSPY = re.compile(r"(?m)^(?:\[[^\]\n]{1,40}\]:[ \t]?)?Thread (?:(?:0x[0-9A-Fa-f]+|\d+) )?\((?:idle|active|active\+gil|gil|idle\+gil)\)")
_SNIFF_PYSPY_FRAME = re.compile(r"(?m)^(?:\[[^\]\n]{1,40}\]:[ \t]?)? {4}\S.* \([^()\n]+\)$")
_SNIFF_FH = re.compile(r"(?m)^(?:\[[^\]\n]{1,40}\]:[ \t]?)?(?:(?:Current thread|Thread) 0x[0-9a-fA-F]+.*|Stack) \(most recent call first\):")
_SNIFF_GDB = re.compile(r"(?m)^Thread \d+ \((?:Thread 0x[0-9a-fA-F]+ )?\(?LWP \d+")
#: a bare ``(gdb) bt`` of one thread: frame #0 without any ``Thread N (...)`` header
_SNIFF_GDB_BARE = re.compile(r"(?m)^#0 +(?:0x[0-9a-fA-F]+ in )?[A-Za-z_~?.<][^\n]*\(")
#: a long frame wrapped by an interactive gdb continues on lines indented by 3-4 spaces
#: (``   from /lib/...``, ``    func=0x...) at file.c:70``); ``bt full`` locals are indented by 8
_GDB_CONT = re.compile(r"^ {1,7}(?! )[^#\s]")
_GDB_PROMPT = re.compile(r"^\(gdb\)")

# Python frames printed traceback-style: gdb's ``py-bt`` (innermost first), ``traceback.print_stack``
# / ``format_stack`` of ``sys._current_frames()`` (outermost first), the ``File: "..."`` of a
# popular all-threads recipe. faulthandler's ``line N in f`` (no comma) is _FH_FRAME.
_TB_FRAME = re.compile(r'^[ \t]*File:? "(?P<file>[^"\n]+)", line (?P<line>\d+), in (?P<func>\S.*?)\s*$')
_TB_HEAD = re.compile(r"^(?:Traceback|Stack) \(most recent call (?P<order>first|last)\):\s*$")
_TB_EXC = EXC_LINE  # an exception line exactly as the log reader sees one
_TB_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
#: recipe headers: ``# Thread: MainThread(1407...)``, ``# ThreadID: 1407...``
_TB_THREAD = re.compile(r"^#\s*Thread(?:ID)?\s*:\s*(?P<rest>.*?)\s*$", re.I)
_TB_THREAD_NAMED = re.compile(r"^(?P<name>.*?)\s*\((?P<tid>\d+)\)$")
#: gdb py-bt's lines for C calls between Python frames (libpython.py PyCFunctionObjectPtr)
_PYBT_BUILTIN = re.compile(r"^<built-in (?:method (?P<meth>\S+) of (?P<type>\S+) object at remote 0x[0-9a-fA-F]+"
                           r"|function (?P<func>\S+))>$")
_PYBT_NOISE = ("(unable to read python frame information)", "(frame information optimized out)",
               "Unable to read information on python frame", "Unable to locate python frame",
               "PyCFunction invocation", "<wrapper_call invocation")
#: the C functions behind the few built-ins whose waiting matters (so the native tables apply)
_BUILTIN_C = {("acquire", "_thread.lock"): "lock_PyThread_acquire_lock", ("acquire", "thread.lock"): "lock_PyThread_acquire_lock",
              ("acquire", "_thread.RLock"): "rlock_acquire"}
#: the outermost frames of a Python thread: where they stand tells the printing order
_ENTRY_FUNCS = frozenset({"<module>", "_bootstrap", "__bootstrap", "_bootstrap_inner", "__bootstrap_inner",
                          "_run_module_as_main", "_run_code"})
#: py-spy-like short paths: what follows site-packages/ or the stdlib directory
_PY_PREFIX = re.compile(r"^.*/(?:site-packages|dist-packages)/|^.*/python\d(?:\.\d+)?[a-z]?/")
_SNIFF_TB = re.compile(r'(?m)^[ \t]*File:? "[^"\n]+", line \d+, in \S')

# An IDE's call-stack copy (VS Code / CLion / Visual Studio): ``lib.so!func(args) (file:line)``,
# ``python311.dll!take_gil(...) Line 285 C``, WinDbg ``ntdll!NtWaitForSingleObject+0x14``.
_IDE_FRAME = re.compile(r"^\s*>?\s*(?P<mod>[A-Za-z_][\w.+-]*)!(?P<func>[^\s!(][^!]*?)"
                        r"(?:\s+\((?P<file>[^()]*?):(?P<line>\d+)\)|\s+Line (?P<vsline>\d+)(?:\s.*)?)?\s*$")
_IDE_BINARY = re.compile(r"(?:\.so(?:\.\d+)*|\.dll|\.dylib|\.exe|\.pyd)$|^(?:lib|python)", re.I)
_IDE_OTHER = re.compile(r"^\s*\[(?:External Code|Unknown/Just-In-Time compiled code|Frames below may be incorrect[^\]]*)\]\s*$")


def _is_native_file(file: str) -> bool:
    return not (file.endswith((".py", ".pyw", ".pyx")) or file.startswith("<"))


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
    return sys.intern(name), sys.intern(file), int(line), _is_native_file(file)


def _clean_native(name: str) -> str:
    """``c10d::Work::wait(std::chrono...)`` -> ``c10d::Work::wait``; hex addresses stay."""
    if "(" in name and not name.startswith("("):
        cut = name.find("(")
        if cut > 0:
            name = name[:cut]
    return name[:200]


@dataclass
class _RawThread:
    tid: str
    name: str = ""
    active: bool | None = None
    gil: bool | None = None
    current: bool = False
    frames: list[tuple[str, str, int, bool]] = field(default_factory=list)


@dataclass
class _RawProc:
    pid: int | None
    fmt: str
    threads: list[_RawThread] = field(default_factory=list)
    parent: int | None = None
    rank: int | None = None
    rank_source: str = ""
    local_rank: int | None = None
    seq: int = 0  # n-th dump of the same process in this file (a snapshot)
    truncated: bool = False


def _split_streams(lines: list[str]) -> list[tuple[str | None, list[str]]]:
    """Demultiplex launcher-prefixed lines (``[rank3]:``, ``[default0]:``) into one stream per
    prefix; a file without such prefixes is one stream."""
    head = lines[:2000]
    if not any(ln.startswith("[") for ln in head):
        return [(None, lines)]
    nonempty = [ln for ln in head if ln.strip()]
    prefixed = sum(1 for ln in nonempty if ln.startswith("[") and _PREFIX.match(ln))
    if not nonempty or prefixed < 0.3 * len(nonempty):
        return [(None, lines)]
    streams: dict[str | None, list[str]] = {}
    for ln in lines:
        m = _PREFIX.match(ln)
        if m:
            streams.setdefault(m.group(1), []).append(ln[m.end():])
        else:
            streams.setdefault(None, []).append(ln)
    # torchrun's tee prefix is "[default0]:", the excepthook's "[rank0]: " (one more space):
    # drop a space only when every line of the stream has it
    for key, stream in streams.items():
        if key is not None and all(ln.startswith(" ") for ln in stream if ln.strip()):
            streams[key] = [ln[1:] for ln in stream]
    return list(streams.items())


def _rank_from_prefix(prefix: str | None) -> tuple[int | None, int | None]:
    """(global rank, local rank) named by a launcher prefix."""
    if not prefix:
        return None, None
    m = _PREFIX_RANK.match(prefix)
    if m:
        return int(m.group(1)), None
    m = _PREFIX_LOCAL.match(prefix)
    if m:
        return None, int(m.group(1))
    return None, None


def _parse_pyspy_text(lines: list[str], notes: list[str]) -> list[_RawProc]:
    procs: list[_RawProc] = []
    cur: _RawProc | None = None
    thread: _RawThread | None = None
    pending_rank: int | None = None
    seen: Counter[int] = Counter()
    for ln in lines:
        if ln.startswith("    "):
            if ln.startswith("        "):
                continue  # --locals lines: never kept (secrets)
            if thread is not None and ln[4] != " ":
                fr = _frame_from_pyspy(ln[4:].rstrip())
                if fr is not None:
                    thread.frames.append(fr)
            continue
        if not ln.strip():
            continue
        head = ln[0]
        m = _PS_THREAD.match(ln) if head == "T" else None
        if m:
            if cur is None:  # threads without a Process header (pasted output)
                cur = _RawProc(None, "pyspy_text")
                procs.append(cur)
            status = m.group(2)
            thread = _RawThread(m.group(1) or "", m.group(3) or "", active=status.startswith("active"),
                                gil="gil" in status)
            cur.threads.append(thread)
            continue
        m = _PS_PROCESS.match(ln) if head == "P" else None
        if m:
            pid = int(m.group(1))
            cur = _RawProc(pid, "pyspy_text", seq=seen[pid])
            seen[pid] += 1
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
        m = _RANK_LINE.match(ln)
        if m:
            pending_rank = int(m.group(1) or m.group(2))
            thread = None
            continue
        if ln.startswith(("Error:", "Reason:", "Permission Denied")):
            notes.append(f"py-spy error in the file: {ln.strip()[:160]}")
            thread = None
    return procs


def _parse_faulthandler(lines: list[str], notes: list[str]) -> list[_RawProc]:
    procs: list[_RawProc] = []
    cur: _RawProc | None = None
    thread: _RawThread | None = None
    ids: set[str] = set()

    def new_dump() -> _RawProc:
        p = _RawProc(None, "faulthandler", seq=len(procs))
        procs.append(p)
        ids.clear()
        return p

    for ln in lines:
        m = _FH_FRAME.match(ln)
        if m and thread is not None:
            name = m.group(3)
            thread.frames.append((name, m.group(1), int(m.group(2)), False))
            continue
        if ln.startswith("  Garbage-collecting") and thread is not None:
            thread.frames.append(("Garbage-collecting", "<gc>", 0, False))
            continue
        m = _FH_THREAD.match(ln)
        if m or _FH_STACK.match(ln):
            tid = m.group(2) if m else "0x0"
            if cur is None or tid in ids:
                cur = new_dump()
            ids.add(tid)
            thread = _RawThread(tid, (m.group(3) or m.group(4) or "") if m else "",
                                current=bool(m and m.group(1) == "Current thread"))
            cur.threads.append(thread)
            continue
        if _FH_NEW_DUMP.match(ln):
            if ln.startswith("Fatal Python error"):
                notes.append(f"faulthandler: {ln.strip()[:160]}")
            cur, thread = new_dump(), None
            continue
        if not _FH_OTHER.match(ln):
            thread = None
    return [p for p in procs if p.threads]


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
    return (_clean_native(name) or "??", file, line, True)


def _join_gdb_lines(lines: list[str]) -> list[str]:
    """Join the continuation lines of frames an interactive gdb wrapped at the terminal width
    (pasted ``bt`` output) to their frame line; ``bt full`` locals (8 spaces) stay apart."""
    out: list[str] = []
    open_frame = False
    for ln in lines:
        if open_frame and _GDB_CONT.match(ln) and not _TB_FRAME.match(ln):
            out[-1] = out[-1].rstrip() + " " + ln.strip()
            continue
        open_frame = bool(_GDB_FRAME.match(ln))
        out.append(ln)
    return out


def _pybt_entry(ln: str) -> tuple[str, str, int, bool] | str | None:
    """A line of gdb's ``py-bt`` (or of a traceback): a frame, a marker frame, ``"skip"`` for
    lines that belong to the dump but say nothing, or None."""
    m = _TB_FRAME.match(ln)
    if m:
        return (sys.intern(m.group("func")), sys.intern(_short_py_path(m.group("file"))), int(m.group("line")), False)
    s = ln.strip()
    if s == "Waiting for the GIL":
        # libpython.py prints this for a ``take_gil`` frame (Python 3.9+; before, for any
        # PyThread_acquire_lock (2.7) or pthread_cond_timedwait (3.x) frame): keep it as that
        # native frame so the GIL pattern of doctor.probes.stackstate applies
        return ("take_gil", "Waiting for the GIL", 0, True)
    if s == "Garbage-collecting":
        return ("Garbage-collecting", "<gc>", 0, False)  # as faulthandler prints it
    m = _PYBT_BUILTIN.match(s)
    if m:
        meth, typ = m.group("meth"), m.group("type")
        name = _BUILTIN_C.get((meth, typ)) if meth else None
        return (sys.intern(name or meth or m.group("func")), "<built-in>", 0, True)
    if s.startswith(_PYBT_NOISE):
        return "skip"
    return None


def _short_py_path(path: str) -> str:
    """``/opt/lib/python3.9/site-packages/torch/x.py`` -> ``torch/x.py``, the stdlib's
    ``/usr/lib/python2.7/threading.py`` -> ``threading.py``: the short names py-spy prints, so
    the same frame reads the same whatever tool dumped it; other paths stay whole."""
    return _PY_PREFIX.sub("", path) if path.startswith("/") else path


def _parse_gdb(lines: list[str], notes: list[str]) -> list[_RawProc]:
    """``thread apply all bt`` (and ``py-bt``) with ``Thread N (...)`` headers, or a bare ``bt``
    of one thread without any header (pasted from an interactive session)."""
    procs: list[_RawProc] = []
    cur: _RawProc | None = None
    thread: _RawThread | None = None
    nums: set[int] = set()
    bare: _RawProc | None = None  # the process a headerless ``bt`` started
    for ln in _join_gdb_lines(lines):
        m = _GDB_FRAME.match(ln)
        if m:
            if thread is None or (cur is bare and m.group(1) == "0" and thread.frames):
                if cur is None or cur is not bare:
                    cur = bare = _RawProc(None, "gdb")
                    procs.append(cur)
                if m.group(1) != "0" and cur.threads:
                    thread = cur.threads[-1]  # the same bt, after a blank line
                else:  # a new ``bt`` (of another thread: ``thread 3`` then ``bt``)
                    thread = _RawThread("", "", current=not cur.threads)
                    cur.threads.append(thread)
            thread.frames.append(_gdb_frame(m.group(3)))
            continue
        if thread is not None:
            entry = _pybt_entry(ln)
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
                cur = _RawProc(None, "gdb")
                procs.append(cur)
                nums = set()
            nums.add(num)
            thread = _RawThread(m.group(3), m.group(4) or "")
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


def tb_is_exception(lines: list[str]) -> bool:
    """Do these traceback-style lines end in a raised exception (``SomeError: message`` after the
    frames, or a chained-exception line)? Then they are a log's crash report, which the log
    reader owns, not a dump of where threads wait."""
    after_frame = False
    for ln in lines[:4000]:
        if not ln.strip():
            continue
        if _TB_FRAME.match(ln):
            after_frame = True
            continue
        if ln[0] in " \t":  # source lines, carets, py-bt markers
            continue
        s = ln.strip()
        if s.startswith(_TB_CHAINED):
            return True
        if after_frame and _TB_EXC.match(s) and not _TB_THREAD.match(s):
            return True
        after_frame = False
    return False


@dataclass
class _TbThread:
    """A thread of a traceback-style dump, entries in printed order until the order is known."""

    raw: _RawThread
    entries: list[tuple[str, str, int, bool]] = field(default_factory=list)
    order: str = ""  # inner (innermost first) | outer (outermost first) | "" (not said)


def _tb_order(t: _TbThread) -> str:
    """The printing order a thread's own lines show: a header says it; py-bt's markers (GIL, C
    calls) only come innermost first; else where the entry frames (``<module>``, threading's
    ``_bootstrap``) stand."""
    if t.order:
        return t.order
    py = [e for e in t.entries if not e[3] and e[1] != "<gc>"]
    if not py:
        return ""
    first, last = py[0][0].rsplit(".", 1)[-1], py[-1][0].rsplit(".", 1)[-1]
    if first in _ENTRY_FUNCS and last not in _ENTRY_FUNCS:
        return "outer"
    if last in _ENTRY_FUNCS and first not in _ENTRY_FUNCS:
        return "inner"
    return ""


def _parse_pytb(lines: list[str], notes: list[str]) -> list[_RawProc]:
    """Header-less Python stacks: gdb ``py-bt`` (innermost first) and tracebacks printed by
    ``traceback.print_stack``/``format_stack`` (outermost first), one thread or several (recipe
    headers ``# Thread: name(id)``, or ``Traceback (...)`` lines, start a thread). The order is
    decided per thread (see _tb_order), then for the file; Python prints outermost first."""
    threads: list[_TbThread] = []
    cur: _TbThread | None = None
    pybt = False

    def start(tid: str = "", name: str = "") -> _TbThread:
        t = _TbThread(_RawThread(tid, name))
        threads.append(t)
        return t

    after_frame = False
    for ln in lines:
        if not ln.strip():
            continue
        entry = _pybt_entry(ln)
        if entry is not None:
            after_frame = isinstance(entry, tuple) and not entry[3] and entry[1] != "<gc>"
            if isinstance(entry, tuple):
                if cur is None:
                    cur = start()
                cur.entries.append(entry)
                if entry[3] or entry[1] == "<gc>":  # only py-bt prints these markers
                    cur.order, pybt = "inner", True
            continue
        was_frame, after_frame = after_frame, False
        if was_frame and not _TB_HEAD.match(ln.strip()) and not _TB_THREAD.match(ln.strip()):
            continue  # the frame's source line (pastes often lose its indentation)
        s = ln.strip()
        m = _TB_HEAD.match(s)
        if m:
            if cur is None or cur.entries:
                cur = start()
            cur.order = "inner" if m.group("order") == "first" else "outer"
            pybt = pybt or cur.order == "inner"
            continue
        m = _TB_THREAD.match(s)
        if m:
            rest = m.group("rest")
            named = _TB_THREAD_NAMED.match(rest)
            if named:
                cur = start(named.group("tid"), named.group("name"))
            else:
                cur = start(rest if rest.isdigit() else "", "" if rest.isdigit() else rest)
            continue
        if ln[0] in " \t":
            continue  # a frame's source line
        if cur is not None and cur.entries:
            cur = None  # other text ends the thread (the next frames start another)
    orders = Counter(o for o in (_tb_order(t) for t in threads) if o)
    default = orders.most_common(1)[0][0] if orders else "outer"
    proc = _RawProc(None, "gdb_pybt" if pybt else "traceback")
    for t in threads:
        if not t.entries:
            continue
        order = _tb_order(t) or default
        t.raw.frames = t.entries if order == "inner" else t.entries[::-1]
        proc.threads.append(t.raw)
    return [proc] if proc.threads else []


def _parse_ide(lines: list[str], notes: list[str]) -> list[_RawProc]:
    """An IDE's call-stack copy, innermost first, one thread: native frames ``module!function``
    with the source location when the IDE had it."""
    t = _RawThread("", "")
    for ln in lines:
        m = _IDE_FRAME.match(ln)
        if not m:
            continue
        func = re.sub(r"\+0x[0-9a-fA-F]+$", "", m.group("func").strip())  # WinDbg offsets
        if m.group("file"):
            file, line = m.group("file").removeprefix("./"), int(m.group("line"))
        else:
            file, line = m.group("mod"), int(m.group("vsline") or 0)
        t.frames.append((_clean_native(func) or "??", sys.intern(file), line, True))
    return [_RawProc(None, "ide", threads=[t])] if t.frames else []


def _ide_frames(lines: list[str]) -> int:
    """IDE frame lines whose module is recognisably a binary (``.so``, ``.dll``, ``lib*``)."""
    n = 0
    for ln in lines:
        if "!" in ln:
            m = _IDE_FRAME.match(ln)
            n += bool(m and _IDE_BINARY.search(m.group("mod")))
    return n


def parse_text(text: str) -> tuple[list[_RawProc], list[str]]:
    """Every process dump in a text file, whatever the format; prefixed streams demultiplexed.

    Exposed for other evidence kinds (a log probe can hand it an embedded faulthandler dump).
    """
    notes: list[str] = []
    lines = text.splitlines()
    if text and not text.endswith("\n") and lines:
        # an unterminated last line is a cut-off file: keep it only when it is a whole frame
        notes.append("file ends mid-line (truncated); parsed what is there")
    out: list[_RawProc] = []
    streams = _split_streams(lines) if text.startswith("[") or "\n[" in text else [(None, lines)]
    for prefix, stream in streams:
        rank, local = _rank_from_prefix(prefix)
        joined_head = text[:65536] if prefix is None else "\n".join(stream[:400])
        if _SNIFF_PYSPY.search(joined_head) or any(_PS_PROCESS.match(ln) for ln in stream[:50]):
            procs = _parse_pyspy_text(stream, notes)
        elif _SNIFF_FH.search(joined_head):
            procs = _parse_faulthandler(stream, notes)
        elif _SNIFF_GDB.search(joined_head) or _SNIFF_GDB_BARE.search(joined_head):
            procs = _parse_gdb(stream, notes)
        elif _SNIFF_TB.search(joined_head) and not tb_is_exception(stream):
            procs = _parse_pytb(stream, notes)
        elif _ide_frames(stream[:400]) >= 2:
            procs = _parse_ide(stream, notes)
        else:
            procs = []
        for p in procs:
            if rank is not None:
                p.rank, p.rank_source = rank, "prefix"
            elif local is not None:
                p.local_rank = local
        out.extend(procs)
    if notes and notes[0].startswith("file ends") and out:
        out[-1].truncated = True
    return out, notes


# ---------------------------------------------------------------------------------------------
# JSON (py-spy dump --json)


def _json_values(text: str, notes: list[str]) -> list[Any]:
    """Top-level JSON values; several concatenated documents and a cut-off array are salvaged."""
    try:
        return [json.loads(text)]
    except json.JSONDecodeError:
        pass
    dec = json.JSONDecoder()
    vals: list[Any] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n:
            break
        try:
            v, i = dec.raw_decode(text, i)
            vals.append(v)
            continue
        except json.JSONDecodeError:
            pass
        if text[i] == "[":  # a cut-off array: take its complete elements
            i += 1
            while i < n:
                while i < n and text[i] in " \t\r\n,":
                    i += 1
                if i >= n or text[i] == "]":
                    i += 1
                    break
                try:
                    v, i = dec.raw_decode(text, i)
                    vals.append(v)
                except json.JSONDecodeError:
                    notes.append("JSON is cut off (truncated); parsed the complete threads")
                    return vals
            continue
        notes.append(f"unparseable JSON at offset {i}; parsed what came before")
        break
    return vals


def _flatten_json(vals: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for v in vals:
        if isinstance(v, list):
            out.extend(_flatten_json(v))
        elif isinstance(v, dict):
            if isinstance(v.get("threads"), list):  # a process object holding its threads
                for t in v["threads"]:
                    if isinstance(t, dict):
                        out.append({**t, "pid": t.get("pid", v.get("pid"))})
            else:
                out.append(v)
    return out


def parse_json(text: str) -> tuple[list[_RawProc], list[DumpError], list[str]]:
    notes: list[str] = []
    objs = _flatten_json(_json_values(text, notes))
    errors: list[DumpError] = []
    by_pid: dict[Any, _RawProc] = {}
    for o in objs:
        err = o.get("mldoctor_stack_error")
        if isinstance(err, dict):
            errors.append(DumpError(_int(err.get("rank")), _int(err.get("pid")), str(err.get("kind", "error")),
                                    str(err.get("reason", ""))[:300], _int(err.get("snapshot")) or 0))
            continue
        frames = o.get("frames")
        if not isinstance(frames, list):
            continue
        pid = _int(o.get("pid"))
        proc = by_pid.get(pid)
        if proc is None:
            proc = by_pid[pid] = _RawProc(pid, "pyspy_json")
            info = o.get("process_info")
            if isinstance(info, dict) and isinstance(info.get("parent"), dict):
                proc.parent = _int(info["parent"].get("pid"))
        tid = o.get("os_thread_id") or o.get("thread_id") or ""
        t = _RawThread(str(tid), str(o.get("thread_name") or ""), active=_bool(o.get("active")),
                       gil=_bool(o.get("owns_gil")))
        for f in frames:
            if not isinstance(f, dict):
                continue
            file = str(f.get("short_filename") or f.get("filename") or "")
            native = f.get("module") is not None or _is_native_file(file)
            t.frames.append((str(f.get("name", "?")), file, _int(f.get("line")) or 0, native))
        proc.threads.append(t)
    procs = list(by_pid.values())
    if notes and procs:
        procs[-1].truncated = True
    return procs, errors, notes


def _int(v: Any) -> int | None:
    try:
        return int(v) if v is not None and not isinstance(v, bool) else None
    except (TypeError, ValueError):
        return None


def _bool(v: Any) -> bool | None:
    return v if isinstance(v, bool) else None


# ---------------------------------------------------------------------------------------------
# from raw threads to summaries


def _pick_main(proc: _RawProc) -> _RawThread | None:
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


_SUMMARY_CACHE: dict[tuple[Any, ...], ThreadSum] = {}


def summarize(t: _RawThread) -> ThreadSum:
    """Classify one thread and reduce it to what the analysis needs. Threads with the same frames
    and activity share one classification (thousands of ranks wait in the same frames)."""
    key = (tuple(t.frames), t.active, t.gil)
    hit = _SUMMARY_CACHE.get(key)
    if hit is None:
        hit = _summarize(t)
        if len(_SUMMARY_CACHE) > 200_000:
            _SUMMARY_CACHE.clear()
        _SUMMARY_CACHE[key] = hit
    return ThreadSum(t.tid, t.name, t.active, t.gil, hit.state, hit.op, hit.top, hit.anchor, hit.site,
                     hit.sig, hit.exact, hit.frames, "", hit.native, hit.role)


def _summarize(t: _RawThread) -> ThreadSum:
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


def _to_dump(p: _RawProc, snapshot_base: int, path: str) -> ProcDump:
    main_raw = _pick_main(p)
    main = summarize(main_raw) if main_raw is not None else None
    others = [summarize(t) for t in p.threads if t is not main_raw]
    role = main.role if main is not None else "rank"
    if role == "worker" and main is not None and main_raw is not None:
        main.worker = ss.worker_activity(main_raw.frames, main_raw.active)
    native = (main is not None and main.native) or any(t.native for t in others)
    return ProcDump(pid=p.pid, rank=p.rank, role=role, fmt=p.fmt, native=native,
                    snapshot=snapshot_base + p.seq, main=main, others=others, parent=p.parent,
                    local_rank=p.local_rank, rank_source=p.rank_source, truncated=p.truncated, path=path)


# ---------------------------------------------------------------------------------------------
# the probe

#: Follow-up probe names the rules ask for, and the stacks-probe options they mean (for the agent).
# Follow-up names that ask this probe for more (stacks_native, stacks_snapshot, stacks_workers)
# are mapped to collect() options in doctor/live/agent.py FOLLOW_UPS.

MAX_GROUPS = 48
MAX_LIST = 64


class StacksProbe(Probe):
    name: ClassVar[str] = "stacks"
    title: ClassVar[str] = "Thread stacks"
    collects: ClassVar[str] = (
        "Every rank's thread stacks (py-spy dump --json, optionally --native; DataLoader workers "
        "on request) with the pause each dump caused; also reads saved py-spy text/JSON, "
        "faulthandler and gdb dumps. Local variables are never kept."
    )
    priority: ClassVar[int] = 60
    build_order: ClassVar[int] = 50
    live_first_round: ClassVar[bool] = True
    live_snapshots: ClassVar[bool] = True
    follow_ups: ClassVar[dict[str, dict[str, Any]]] = {
        "stacks": {}, "stacks_native": {"native": True}, "stacks_workers": {"workers": True}}
    shows_state: ClassVar[bool] = True
    state_order: ClassVar[int] = 30
    max_bytes: ClassVar[int] = 64 * 1024 * 1024
    facts_schema: ClassVar[dict[str, str]] = {
        "stacks.n_ranks": "int: ranks with a main-thread stack (latest snapshot)",
        "stacks.n_members": "int: processes analysed as ranks, including dumps whose rank is unknown",
        "stacks.n_unranked": "int: rank processes whose rank could not be told (no prefix, RANK= line, manifest or file name)",
        "stacks.formats": "list<string>: dump formats read: pyspy_text, pyspy_json, faulthandler, gdb (thread apply all bt, or a bare bt), gdb_pybt (gdb py-bt), traceback (traceback-style Python stacks: format_stack/print_stack), ide (an IDE's call-stack copy)",
        "stacks.native": "bool: some dump has native (C/C++) frames (py-spy --native, gdb)",
        "stacks.snapshots": "int: distinct snapshots (a file named *snap<k>*, or repeated dumps of one process in a file)",
        "stacks.states": "list<string>: every thread state the classifier knows (see probes/stackstate.py STATES)",
        "stacks.state_counts": "map<string,int>: main threads per state (every state present, 0 when none)",
        "stacks.state_ranks": "map<string,list<int>>: ranks per main-thread state (only states that occur)",
        "stacks.waiting_share": "float: share of main threads waiting on their peers: in a collective, or in a GPU wait (with NCCL a collective is asynchronous, so a rank whose peer is missing blocks later in .item()/synchronize rather than in the Python collective call)",
        "stacks.majority_state": "string: the state most main threads are in (ties: collective, init, dataloader_wait, io, lock_wait, cuda_sync, ... in that order)",
        "stacks.majority_share": "float: share of main threads in majority_state (0-1)",
        "stacks.majority_op": "string: the most common op among main threads in a collective ('' when none)",
        "stacks.majority_group": "string: id of the largest stack group (ByteRobust: the dominant group is presumed healthy)",
        "stacks.outliers": "list<int>: ranks not in the largest stack group (the suspects)",
        "stacks.groups": "list<map>: STAT-style equivalence classes of main-thread stacks (function+file, no lines), largest first, at most 48 (the rest merged per state)",
        "stacks.groups[].id": "string: group id (g0 is the largest)",
        "stacks.groups[].state": "string: the members' state",
        "stacks.groups[].op": "string: what in that state: collective op (all_reduce, barrier, ...), io kind (torch.save, socket, ...), lock kind, dataloader phase",
        "stacks.groups[].ranks": "list<int>: member ranks",
        "stacks.groups[].size": "int: members, ranked or not",
        "stacks.groups[].share": "float: size / stacks.n_members",
        "stacks.groups[].majority": "bool: this is the largest group",
        "stacks.groups[].top": "string: innermost Python frame with line of the lowest member, 'func (file:line)'",
        "stacks.groups[].anchor": "string: the frame that decided the state, with line",
        "stacks.groups[].site": "string: the innermost frame of the user's own code (where it called into the library)",
        "stacks.groups[].frames": "list<string>: the first 8 frames of the signature, 'func (file)'",
        "stacks.groups[].n_active": "int: members whose main thread was running (py-spy active) rather than blocked",
        "stacks.groups[].active": "bool: most members were running (a busy rank, not a blocked one)",
        "stacks.groups[].native": "bool: some member's dump has native frames",
        "stacks.groups[].n_frozen": "int: members whose stack was identical in all of 2+ snapshots",
        "stacks.groups[].workers_blocked": "int: members with DataLoader worker evidence showing a blocked worker and no busy one",
        "stacks.groups[].workers_idle": "int: members whose DataLoader workers were all waiting in their loop (the batch is in transit, not stuck)",
        "stacks.groups[].unranked": "list<string>: 'host:pid' of members whose rank is unknown (at most 16)",
        "stacks.by_rank": "map<string,map>: per rank: state, op, top, group, active, frozen, workers_blocked, and pin_memory ('state (op) at frame' of the DataLoader pin-memory thread, when there is one)",
        "stacks.collective_splits": "list<map>: main threads in a typed, non-p2p collective, split by (op, call site); more than one entry means ranks wait in different collectives",
        "stacks.collective_splits[].key": "string: op@site",
        "stacks.collective_splits[].op": "string: the collective op",
        "stacks.collective_splits[].site": "string: the user's call site with line",
        "stacks.collective_splits[].ranks": "list<int>: ranks in it",
        "stacks.collective_splits[].size": "int: members",
        "stacks.collective_splits[].majority": "bool: the largest split",
        "stacks.frozen": "list<int>: ranks whose main stack (frames and lines) was identical across 2+ snapshots",
        "stacks.moving": "list<int>: ranks whose main stack changed between snapshots",
        "stacks.progress": "string: frozen (most ranks with 2+ snapshots unchanged: hung, or very slow), moving (most changed: progressing), unknown (one snapshot)",
        "stacks.lock_holders": "list<map>: for ranks whose main thread waits on a lock or the GIL: the other threads of that process that could hold it (running, owning the GIL, or blocked outside a plain wait; for the GIL only its owner); outlier ranks first, at most 64",
        "stacks.lock_holders[].rank": "int: the rank",
        "stacks.lock_holders[].thread": "string: thread name (or id)",
        "stacks.lock_holders[].state": "string: that thread's state",
        "stacks.lock_holders[].op": "string: that thread's op",
        "stacks.lock_holders[].top": "string: that thread's innermost frame",
        "stacks.lock_holders[].active": "bool: the thread was running",
        "stacks.lock_holders[].gil": "bool: the thread held the GIL",
        "stacks.workers": "map<string,map>: per rank with DataLoader worker dumps: n, waiting, busy, blocked, top (a blocked worker's innermost frame)",
        "stacks.workers_blocked": "list<int>: ranks with a blocked DataLoader worker and no busy one",
        "stacks.missing_ranks": "list<int>: ranks below job.world_size with no stack dump (known only when world_size is)",
        "stacks.gone_ranks": "list<int>: ranks whose live dump failed because the process no longer exists",
        "stacks.dump_errors": "list<map>: live dumps that failed: rank, kind (gone|permission|unsupported|timeout|error), reason",
        "stacks.dump_errors[].rank": "int: the rank (-1 when unknown)",
        "stacks.dump_errors[].kind": "string: gone | permission | unsupported | timeout | error",
        "stacks.dump_errors[].reason": "string: py-spy's message, shortened",
        "stacks.notes": "list<string>: parsing remarks (truncated files, duplicate dumps, ranks from local prefixes)",
    }

    # -- recognize ----------------------------------------------------------------------------


    def wants_another_look(self, facts: dict[str, Any]) -> bool:
        """Some ranks frozen and some moving: a slow step or a real hang; another look tells."""
        st = facts.get("stacks") or {}
        return bool(st.get("frozen")) and bool(st.get("moving"))

    def observed_state(self, facts: dict[str, Any]) -> str:
        """Hung or progressing from two or more snapshots.

        A rank is frozen when its main-thread stack (with line numbers) is identical in every
        snapshot and, when /proc readings exist, its main thread did not wake up between them (a
        training loop in steady state can show the same line twice; a blocked thread never
        wakes). The job is hung when at least half of the ranks seen are frozen.
        """
        st = facts.get("stacks") or {}
        if int(st.get("snapshots") or 0) < 2:
            return ""
        n = int(st.get("n_ranks") or 0)
        if not n:
            return ""
        procs = facts.get("procs") or {}
        frozen = set(st.get("frozen") or []) - set(procs.get("main_waking_ranks") or [])
        return "hung" if len(frozen) / n >= 0.5 else "progressing"

    def sniff(self, sample: Sample) -> bool:
        text = sample.text
        if _JSON_START.match(text):
            head = text[:65536]
            return ('"frames"' in head and ('"owns_gil"' in head or '"os_thread_id"' in head)) \
                or '"mldoctor_stack_error"' in head[:4096]
        pyspy = bool(_SNIFF_PYSPY.search(text) and (_SNIFF_PYSPY_FRAME.search(text) or "Process " in text[:4096]))
        if pyspy or _SNIFF_FH.search(text) or _SNIFF_GDB.search(text) or _SNIFF_GDB_BARE.search(text):
            return _mostly_dump(text.splitlines()[:2000])
        # looser shapes pasted into issue threads: traceback-style Python stacks (py-bt,
        # format_stack) and IDE call stacks; an exception traceback is a log's crash report
        lines = text.splitlines()[:2000]
        if len(_SNIFF_TB.findall(text)) >= 2 and not tb_is_exception(lines):
            return _mostly_dump(lines)
        if _ide_frames(lines) >= 2:
            return _mostly_dump(lines)
        return False

    # -- parse --------------------------------------------------------------------------------

    def parse(self, path: Path, rel: str, hints: Hints) -> list[Parsed]:
        raw = path.read_bytes()
        if b"\x00" in raw[:4096]:
            raise EvidenceError(rel, "binary data, not a stack dump")
        text = raw.decode("utf-8", errors="replace")
        snap_m = _SNAP.search(rel.rsplit("/", 1)[-1])
        snapshot = int(snap_m.group(1)) if snap_m else 0
        errors: list[DumpError] = []
        if _JSON_START.match(text):
            procs, errors, notes = parse_json(text)
        else:
            procs, notes = parse_text(text)
        if not procs and not errors:
            raise EvidenceError(rel, "no thread stacks found (expected py-spy, faulthandler, gdb or traceback-style output)")
        dumps = [_to_dump(p, snapshot, rel) for p in procs]
        if _WORKER_NAME.search(rel.rsplit("/", 1)[-1]):
            # a file of a rank's child process: never the rank itself, even when its stack does
            # not show a DataLoader worker loop (then it is some other child, left out)
            for d in dumps:
                if d.role == "rank":
                    d.role = "child"
        self._assign_ranks(dumps, hints, notes)
        out: list[Parsed] = []
        for d in dumps:
            d.host = hints.host
            r = d.rank if d.role in ("rank", "worker", "child") else None
            out.append(Parsed(self.name, rel, d, r, hints.host, list(notes)))
        for e in errors:
            if e.rank is None:
                e.rank = hints.rank
            e.snapshot = e.snapshot or snapshot
            out.append(Parsed(self.name, rel, e, e.rank, hints.host, list(notes)))
        return out

    @staticmethod
    def _assign_ranks(dumps: list[ProcDump], hints: Hints, notes: list[str]) -> None:
        """Content first (prefixes, RANK= lines), then the manifest's pid, then the file name;
        DataLoader workers take their parent's rank."""
        if hints.pid is not None and hints.rank is not None:
            for d in dumps:
                if d.pid == hints.pid and d.rank is None:
                    d.rank, d.rank_source = hints.rank, "manifest"
        ranks = [d for d in dumps if d.role == "rank"]
        by_pid = {d.pid: d for d in ranks if d.pid is not None}
        unranked = [d for d in ranks if d.rank is None]
        distinct_pids = {d.pid for d in ranks}
        if hints.rank is not None and unranked and len(distinct_pids) == 1:
            for d in unranked:
                d.rank, d.rank_source = hints.rank, "file name"
        for d in ranks:
            if d.rank is None and d.local_rank is not None:
                d.rank, d.rank_source = d.local_rank, "local prefix"
                notes.append(f"rank {d.rank} taken from a local-rank launcher prefix (single node assumed)")
        for d in dumps:
            if d.role in ("worker", "child") and d.rank is None:
                parent = by_pid.get(d.parent)
                if parent is not None and parent.rank is not None:
                    d.rank, d.rank_source = parent.rank, "parent"
                elif hints.rank is not None and not ranks:
                    d.rank, d.rank_source = hints.rank, "file name"

    # -- combine ------------------------------------------------------------------------------

    def build(self, parsed: list[Parsed], facts: dict[str, Any]) -> None:
        dumps = [p.data for p in parsed if isinstance(p.data, ProcDump)]
        errs = [p.data for p in parsed if isinstance(p.data, DumpError)]
        notes: list[str] = []
        for p in parsed:
            for n in p.notes:
                line = f"{p.path}: {n}"
                if line not in notes and len(notes) < 20:
                    notes.append(line)
        facts["stacks"] = analyze(dumps, errs, int((facts.get("job") or {}).get("world_size") or 0), notes)

    # -- live ---------------------------------------------------------------------------------

    def collect(self, ctx: Any) -> dict[str, Any]:
        exe = find_pyspy()
        if exe is None:
            raise ProbeSkipped("py-spy is not installed (pip install py-spy); no stacks collected")
        targets = [(p.rank, p.pid, "rank", None) for p in ctx.ranks]
        if not targets:
            raise ProbeSkipped("no rank processes on this host")
        if ctx.options.get("workers"):
            rank_pids = {p.pid: p.rank for p in ctx.ranks}
            targets += [(rank_pids[w.parent], w.pid, "worker", w.parent) for w in ctx.procs
                        if w.role == "worker" and w.parent in rank_pids]
        snap = int(ctx.options.get("snapshot", 0) or 0)
        native = bool(ctx.options.get("native"))
        timeout = float(ctx.timeout)

        def one(t: tuple[int | None, int, str, int | None]) -> tuple[tuple, dict[str, Any]]:
            return t, dump_pid(exe, t[1], native=native, timeout=timeout)

        with ThreadPoolExecutor(max_workers=max(1, min(len(targets), 32))) as ex:
            results = list(ex.map(one, targets))
        ok = failed = 0
        first_problem = ""
        for (rank, pid, role, _parent), res in results:
            who = f"rank{rank}" if rank is not None else f"pid{pid}"
            if role == "worker":
                who = f"worker{pid}-of-{who}"
            meta = {"pause_s": res["wall_s"], "snapshot": snap, "native": native, "format": "pyspy_json",
                    "command": "py-spy dump --json" + (" --native" if native else "") + f" --pid {pid}"}
            if res["ok"]:
                ok += 1
                ctx.add(f"pyspy-{who}-snap{snap}.json", res["stdout"], rank=rank, pid=pid, meta=meta)
            else:
                failed += 1
                first_problem = first_problem or f"{who} (pid {pid}): {res['reason']} {res['advice']}".strip()
                body = json.dumps({"mldoctor_stack_error": {
                    "rank": rank, "pid": pid, "kind": res["kind"], "reason": res["reason"],
                    "advice": res["advice"], "snapshot": snap}})
                ctx.add(f"pyspy-{who}-snap{snap}.error.json", body, rank=rank, pid=pid, meta=meta)
        if ok == 0:
            raise ProbeFailed(first_problem or "every py-spy dump failed")
        return {"dumped": ok, "failed": failed, "snapshot": snap, "native": native}


def _mostly_dump(lines: list[str]) -> bool:
    """A log with a dump inside belongs to the log reader unless the dump is most of it (seen: a
    console log of a GPU test run with one py-spy dump among its lines). Indented lines right
    after a dump line (a wrapped gdb frame, a traceback frame's source line) count with it;
    markdown fences around a pasted dump count for nothing."""
    body = [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("```")]
    n = 0
    prev = False
    for ln in body:
        prev = _dump_line(ln) or (prev and ln[0] in " \t")
        n += prev
    return bool(body) and n >= 0.5 * len(body)


def _dump_line(ln: str) -> bool:
    """Is this line part of a stack dump (py-spy, faulthandler, gdb) rather than other log text?"""
    m = _PREFIX.match(ln)
    if m:
        ln = ln[m.end():]
        ln = ln[1:] if ln.startswith(" ") and not ln.startswith("  File") else ln
    if ln.startswith("    ") or ln.startswith(("Process ", "Python v", "Parent Process ", "Thread ")):
        return True  # py-spy frames, locals and headers
    return bool(_FH_FRAME.match(ln) or _FH_STACK.match(ln) or _FH_NEW_DUMP.match(ln)
                or _GDB_FRAME.match(ln) or ln.startswith(("[New LWP", "[Thread debugging", "[Inferior ", "Current thread "))
                or _RANK_LINE.match(ln) or (_FH_OTHER.match(ln) and ln.strip())
                or _GDB_PROMPT.match(ln) or _TB_FRAME.match(ln) or _TB_HEAD.match(ln.strip())
                or _TB_THREAD.match(ln.strip()) or _pybt_entry(ln) is not None
                or ("!" in ln and _IDE_FRAME.match(ln)) or _IDE_OTHER.match(ln))


# ---------------------------------------------------------------------------------------------
# live helpers


def find_pyspy() -> str | None:
    """py-spy on PATH, or the one installed next to this interpreter (a venv not activated)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


_ADVICE = {
    "permission": ("py-spy may not ptrace this process: run mldoctor as the job's user or root; in "
                   "containers add CAP_SYS_PTRACE (docker --cap-add SYS_PTRACE, k8s securityContext); "
                   "check kernel.yama.ptrace_scope (0 or 1)."),
    "unsupported": ("py-spy could not read this interpreter: upgrade py-spy (new CPython versions need "
                    "a newer py-spy), or the pid is not a Python process (a launcher stub)."),
    "gone": "The process exited before or during the dump: check the launcher log for its exit.",
    "timeout": ("py-spy did not finish in time: the process may be wedged in the kernel (D state) or "
                "the host overloaded; try gdb/pstack or /proc/PID/stack."),
    "error": "",
}


def classify_failure(returncode: int | None, stderr: str, pid: int) -> tuple[str, str]:
    """(kind, one-line reason) from py-spy's exit and message."""
    text = stderr.strip()
    low = text.lower()
    first = next((ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip()[0].isdigit()), "")
    if "permission denied" in low or "operation not permitted" in low or "os error 1)" in low:
        return "permission", "permission denied (ptrace)"
    if not Path(f"/proc/{pid}").exists() or "no such process" in low or "check that the process is running" in low:
        return "gone", "process no longer exists"
    if "failed to find python version" in low or "unsupported version" in low or "python interpreter" in low:
        return "unsupported", first[:200] or "unsupported Python"
    return "error", (first or f"py-spy exited with {returncode}")[:200]


def dump_pid(exe: str, pid: int, *, native: bool = False, timeout: float = 10.0) -> dict[str, Any]:
    """One ``py-spy dump --json`` with its wall time (the pause it caused); never raises."""
    argv = [exe, "dump", "--json", "--pid", str(pid)] + (["--native"] if native else [])
    t0 = time.perf_counter()
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        wall = round(time.perf_counter() - t0, 4)
        return {"ok": False, "kind": "timeout", "reason": f"py-spy did not answer within {timeout:g} s",
                "advice": _ADVICE["timeout"], "wall_s": wall, "stdout": ""}
    except OSError as exc:
        return {"ok": False, "kind": "error", "reason": f"cannot run py-spy: {exc.strerror or exc}",
                "advice": "", "wall_s": 0.0, "stdout": ""}
    wall = round(time.perf_counter() - t0, 4)
    if r.returncode == 0 and r.stdout.strip().startswith("["):
        return {"ok": True, "wall_s": wall, "stdout": r.stdout, "kind": "", "reason": "", "advice": ""}
    kind, reason = classify_failure(r.returncode, r.stderr or r.stdout, pid)
    return {"ok": False, "kind": kind, "reason": reason, "advice": _ADVICE[kind], "wall_s": wall, "stdout": ""}


# ---------------------------------------------------------------------------------------------
# cross-rank analysis


def _score(d: ProcDump) -> tuple[int, int]:
    m = d.main
    specific = m is not None and m.state not in ("python", "unknown", "idle")
    has_py = d.fmt not in ("gdb", "ide")  # gdb bt and IDE stacks show only native frames
    return (4 * specific + 2 * has_py + d.native, len(d.others))


def _better(a: ProcDump, b: ProcDump) -> ProcDump:
    """Of two dumps of one rank in one snapshot keep the more telling: a specific state first,
    then Python frames (py-spy over gdb), then native frames, then more threads."""
    return a if _score(a) >= _score(b) else b


_STATE_PRIORITY = {s: i for i, s in enumerate(
    ["collective", "init", "dataloader_wait", "io", "lock_wait", "cuda_sync", "dataloader_fetch",
     "ipc_wait", "gc", "sleeping", "python", "unknown", "idle"])}
_PLAIN_WAITS = {"lock_wait", "sleeping", "dataloader_wait", "ipc_wait", "idle", "collective"}


def analyze(dumps: list[ProcDump], errs: list[DumpError], world_size: int, notes: list[str]) -> dict[str, Any]:
    """Group ranks by state and stack signature; majority, outliers, frozen ranks, lock holders.

    Everything is keyed by dicts (one pass over the dumps, one over the members), so 16k ranks
    cost milliseconds beyond parsing.
    """
    # 1. one dump per member and snapshot (member: rank, or host:pid when the rank is unknown)
    pid_rank: dict[tuple[str | None, int], int] = {}
    pid_only: dict[int, set[int]] = {}
    for d in dumps:
        if d.role == "rank" and d.rank is not None and d.pid is not None:
            pid_rank[(d.host, d.pid)] = d.rank
            pid_only.setdefault(d.pid, set()).add(d.rank)

    def rank_of_pid(host: str | None, pid: int | None) -> int | None:
        """A dump without a rank takes the rank another dump of the same process names (the same
        host, or any host when the pid is unambiguous: one file named the host, the other not)."""
        if pid is None:
            return None
        r = pid_rank.get((host, pid))
        if r is None and len(pid_only.get(pid, ())) == 1:
            r = next(iter(pid_only[pid]))
        return r

    for d in dumps:
        if d.role == "rank" and d.rank is None and d.pid is not None:
            r = rank_of_pid(d.host, d.pid)
            if r is not None:
                d.rank, d.rank_source = r, "pid"
    per: dict[Any, dict[int, ProcDump]] = {}
    workers: dict[int, dict[int | None, ProcDump]] = {}
    dup = 0
    for d in dumps:
        if d.role == "worker":
            if d.rank is None and d.parent is not None:
                d.rank = rank_of_pid(d.host, d.parent)
            if d.rank is not None:
                snaps = workers.setdefault(d.rank, {})
                key = d.pid if d.pid is not None else len(snaps)
                prev = snaps.get(key)
                if prev is None or d.snapshot >= prev.snapshot:
                    snaps[key] = d
            continue
        if d.role != "rank" or d.main is None:
            continue
        key: Any = d.rank if d.rank is not None else f"{d.host or ''}:{d.pid if d.pid is not None else id(d)}"
        snaps2 = per.setdefault(key, {})
        if d.snapshot in snaps2:
            dup += 1
            snaps2[d.snapshot] = _better(snaps2[d.snapshot], d)
        else:
            snaps2[d.snapshot] = d
    if dup:
        notes.append(f"{dup} extra dump(s) of a rank in the same snapshot: kept the most telling (specific state, Python frames, native frames)")

    # 2. current (latest) dump per member, frozen/moving across snapshots
    current: dict[Any, ProcDump] = {}
    frozen: list[int] = []
    moving: list[int] = []
    frozen_keys: set[Any] = set()
    n_multi = n_moving = 0
    all_snaps: set[int] = set()
    for key, snaps in per.items():
        all_snaps.update(snaps)
        latest = snaps[max(snaps)]
        current[key] = latest
        if len(snaps) >= 2:
            n_multi += 1
            exacts = {s.main.exact for s in snaps.values() if s.main is not None}
            if len(exacts) == 1:
                frozen_keys.add(key)
                # the same Python stack all along: a native dump of an earlier snapshot explains
                # the latest plain one (a plain dump cannot see the C call it is blocked in)
                best = max(snaps.values(), key=_score)
                if _score(best)[0] > _score(latest)[0]:
                    current[key] = best
                if isinstance(key, int):
                    frozen.append(key)
            else:
                n_moving += 1
                if isinstance(key, int):
                    moving.append(key)
    progress = "unknown" if n_multi == 0 else ("moving" if n_moving * 2 > n_multi else "frozen")

    # 3. DataLoader workers per rank
    worker_facts: dict[str, dict[str, Any]] = {}
    workers_blocked: set[int] = set()
    workers_idle: set[int] = set()
    for rank, ws in workers.items():
        counts = Counter(w.main.worker or "waiting" for w in ws.values() if w.main is not None)
        blocked_top = next((w.main.top for w in ws.values() if w.main is not None and w.main.worker == "blocked"), "")
        worker_facts[str(rank)] = {"n": len(ws), "waiting": counts.get("waiting", 0), "busy": counts.get("busy", 0),
                                   "blocked": counts.get("blocked", 0), "top": blocked_top}
        if counts.get("blocked", 0) and not counts.get("busy", 0):
            workers_blocked.add(rank)
        elif counts.get("waiting", 0) == len(ws):
            workers_idle.add(rank)

    # 4. groups by signature
    n_members = len(current)
    sig_members: dict[str, list[Any]] = {}
    for key, d in current.items():
        sig_members.setdefault(d.main.sig, []).append(key)  # type: ignore[union-attr]

    def min_rank(keys: list[Any]) -> float:
        rs = [k for k in keys if isinstance(k, int)]
        return min(rs) if rs else float("inf")

    ordered = sorted(sig_members.items(), key=lambda kv: (
        -len(kv[1]), _STATE_PRIORITY.get(current[kv[1][0]].main.state, 99), min_rank(kv[1])))  # type: ignore[union-attr]
    if len(ordered) > MAX_GROUPS:
        keep, rest = ordered[:MAX_GROUPS - 8], ordered[MAX_GROUPS - 8:]
        merged: dict[str, list[Any]] = {}
        for _sig, keys in rest:
            st = current[keys[0]].main.state  # type: ignore[union-attr]
            merged.setdefault(f"{st}|(several stacks)|", []).extend(keys)
        ordered = keep + sorted(merged.items(), key=lambda kv: -len(kv[1]))
        notes.append(f"{len(rest)} small stack groups merged per state")
    groups: list[dict[str, Any]] = []
    by_rank: dict[str, dict[str, Any]] = {}
    state_counts: Counter[str] = Counter()
    state_ranks: dict[str, list[int]] = {}
    op_counts: Counter[str] = Counter()
    splits: dict[str, dict[str, Any]] = {}
    for gi, (sig, keys) in enumerate(ordered):
        gid = f"g{gi}"
        rep_key = min(keys, key=lambda k: (not isinstance(k, int), k if isinstance(k, int) else 0))
        rep = current[rep_key].main
        assert rep is not None
        merged_group = sig.endswith("|(several stacks)|")
        ranks = sorted(k for k in keys if isinstance(k, int))
        unr = [k for k in keys if not isinstance(k, int)]
        n_active = 0
        n_frz = 0
        n_wb = 0
        n_wi = 0
        native = False
        for k in keys:
            d = current[k]
            m = d.main
            assert m is not None
            if m.active:
                n_active += 1
            if k in frozen_keys:
                n_frz += 1
            native = native or d.native
            if isinstance(k, int):
                wb = k in workers_blocked
                n_wb += wb
                n_wi += k in workers_idle
                entry = {"state": m.state, "op": m.op, "top": m.top, "group": gid,
                         "active": bool(m.active), "frozen": k in frozen_keys, "workers_blocked": wb}
                pin = next((t for t in d.others if "_pin_memory_loop@" in t.sig), None)
                if pin is not None:  # the DataLoader's pin-memory thread feeds the main thread
                    entry["pin_memory"] = f"{pin.state} ({pin.op}) at {pin.top}"
                by_rank[str(k)] = entry
                state_ranks.setdefault(m.state, []).append(k)
            state_counts[m.state] += 1
            if m.state == "collective" and m.op:
                op_counts[m.op] += 1
                if m.op not in ss.P2P_OPS and m.op not in ss.VAGUE_OPS:
                    skey = f"{m.op}@{m.site}"
                    sp = splits.setdefault(skey, {"key": skey, "op": m.op, "site": m.site, "ranks": [], "size": 0})
                    sp["size"] += 1
                    if isinstance(k, int):
                        sp["ranks"].append(k)
        groups.append({
            "id": gid, "state": rep.state, "op": "" if merged_group else rep.op, "ranks": ranks,
            "size": len(keys), "share": round(len(keys) / n_members, 4) if n_members else 0.0,
            "majority": gi == 0, "top": "(several stacks)" if merged_group else rep.top,
            "anchor": "" if merged_group else rep.anchor, "site": "" if merged_group else rep.site,
            "frames": [] if merged_group else list(rep.frames),
            "n_active": n_active, "active": n_active * 2 > len(keys), "native": native,
            "n_frozen": n_frz, "workers_blocked": n_wb, "workers_idle": n_wi,
            "unranked": [str(u) for u in unr[:16]],
        })
    for sp in splits.values():
        sp["ranks"].sort()
    split_list = sorted(splits.values(), key=lambda s: (-s["size"], s["ranks"][0] if s["ranks"] else 1 << 30))
    for i, sp in enumerate(split_list):
        sp["majority"] = i == 0
    split_list = split_list[:32]

    if state_counts:
        maj_state, maj_n = min(state_counts.items(), key=lambda kv: (-kv[1], _STATE_PRIORITY.get(kv[0], 99)))
    else:
        maj_state, maj_n = "", 0
    majority_op = min(op_counts.items(), key=lambda kv: (-kv[1], kv[0]))[0] if op_counts else ""
    outliers = sorted(r for g in groups[1:] for r in g["ranks"])

    # 5. lock holders: for ranks blocked on a lock/GIL (or on an unknown call), the other threads
    lock_holders: list[dict[str, Any]] = []
    suspects = [k for k, d in current.items() if isinstance(k, int) and d.main is not None
                and d.main.state == "lock_wait"]
    suspects.sort(key=lambda k: (k not in outliers, k))
    for k in suspects:
        d = current[k]
        wants_gil = d.main is not None and d.main.op == "gil"
        for t in d.others:
            holds = (t.gil is True) if wants_gil else (
                t.active is True or t.gil is True or t.state not in _PLAIN_WAITS)
            if holds and len(lock_holders) < MAX_LIST:
                lock_holders.append({"rank": k, "thread": t.name or t.tid, "state": t.state, "op": t.op,
                                     "top": t.top, "active": bool(t.active), "gil": bool(t.gil)})
        if len(lock_holders) >= MAX_LIST:
            break

    # 6. dump failures, ranks without stacks
    have = {k for k in current if isinstance(k, int)}
    dump_errors = [{"rank": e.rank if e.rank is not None else -1, "kind": e.kind, "reason": e.reason}
                   for e in errs if e.rank is None or e.rank not in have][:MAX_LIST]
    gone = sorted({e.rank for e in errs if e.kind == "gone" and e.rank is not None and e.rank not in have})
    missing = sorted(set(range(world_size)) - have) if world_size and have else []
    for d in current.values():
        if d.truncated:
            notes.append(f"{d.path}: truncated dump; its last thread may be incomplete")
    formats = sorted({d.fmt for d in dumps})
    return {
        "n_ranks": len(have), "n_members": n_members, "n_unranked": n_members - len(have),
        "formats": formats, "native": any(d.native for d in current.values()),
        "snapshots": len(all_snaps), "states": list(ss.STATES),
        "state_counts": {s: state_counts.get(s, 0) for s in ss.STATES},
        "state_ranks": {s: sorted(v) for s, v in state_ranks.items()},
        "waiting_share": round((state_counts.get("collective", 0) + state_counts.get("cuda_sync", 0)) / n_members, 4)
        if n_members else 0.0,
        "majority_state": maj_state, "majority_share": round(maj_n / n_members, 4) if n_members else 0.0,
        "majority_op": majority_op, "majority_group": groups[0]["id"] if groups else "",
        "outliers": outliers, "groups": groups, "by_rank": by_rank,
        "collective_splits": split_list,
        "frozen": sorted(frozen), "moving": sorted(moving), "progress": progress,
        "lock_holders": lock_holders, "workers": worker_facts, "workers_blocked": sorted(workers_blocked),
        "missing_ranks": missing, "gone_ranks": gone, "dump_errors": dump_errors, "notes": notes[:20],
    }


PROBE = StacksProbe()
