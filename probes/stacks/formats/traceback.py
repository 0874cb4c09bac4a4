"""Traceback-style Python stacks (gdb ``py-bt``, ``traceback.format_stack`` recipes): they print
no order marker, so the order is read from where the entry frames stand; an exception
traceback is a log's crash report and is left to the log reader, except one: a traceback that
ends in ``KeyboardInterrupt`` is where the main thread was when someone pressed Ctrl-C on a job
that had stopped making progress, so it is read as that thread's stack (:func:`interrupted`).
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from dataclasses import dataclass, field

from doctor.probes.common.text import EXC_LINE
from doctor.probes.stacks.model import RawProc, RawThread

# Python frames printed traceback-style: gdb's ``py-bt`` (innermost first), ``traceback.print_stack``
# / ``format_stack`` of ``sys._current_frames()`` (outermost first), the ``File: "..."`` of a
# popular all-threads recipe. faulthandler's ``line N in f`` (no comma) is FH_FRAME.
TB_FRAME = re.compile(r'^[ \t]*File:? "(?P<file>[^"\n]+)", line (?P<line>\d+), in (?P<func>\S.*?)\s*$')
TB_HEAD = re.compile(r"^(?:Traceback|Stack) \(most recent call (?P<order>first|last)\):\s*$")
_TB_EXC = EXC_LINE  # an exception line exactly as the log reader sees one
_TB_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
#: recipe headers: ``# Thread: MainThread(1407...)``, ``# ThreadID: 1407...``
TB_THREAD = re.compile(r"^#\s*Thread(?:ID)?\s*:\s*(?P<rest>.*?)\s*$", re.I)
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
SNIFF_TB = re.compile(r'(?m)^[ \t]*File:? "[^"\n]+", line \d+, in \S')


def pybt_entry(ln: str) -> tuple[str, str, int, bool] | str | None:
    """A line of gdb's ``py-bt`` (or of a traceback): a frame, a marker frame, ``"skip"`` for
    lines that belong to the dump but say nothing, or None."""
    m = TB_FRAME.match(ln)
    if m:
        return (sys.intern(m.group("func")), sys.intern(_short_py_path(m.group("file"))), int(m.group("line")), False)
    s = ln.strip()
    if s == "Waiting for the GIL":
        # libpython.py prints this for a ``take_gil`` frame (Python 3.9+; before, for any
        # PyThread_acquire_lock (2.7) or pthread_cond_timedwait (3.x) frame): keep it as that
        # native frame so the GIL pattern of doctor.probes.stacks.classify applies
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


#: the exception a Ctrl-C raises in the main thread (``KeyboardInterrupt`` with or without a message)
_KBI = re.compile(r"^KeyboardInterrupt(?::.*)?$")


def interrupted(lines: list[str]) -> list[str]:
    """The lines of the first traceback that ends in ``KeyboardInterrupt``, [] when none.

    Why the first: a Ctrl-C that lands in a wait raises there; a second traceback chained to it
    ("During handling of the above exception ...") is cleanup code that ran afterwards, not where
    the thread was stuck. Why only the main thread's: Python delivers the signal to the main
    thread only, so the traceback is that thread's stack at the moment of the Ctrl-C. A launcher
    that forwards the signal (torchrun) makes every rank that was running Python print one; a
    rank blocked inside a C++ call (a NCCL or gloo wait) prints nothing until the call returns."""
    start = -1
    frames = 0
    chained = False
    # a pasted fragment often starts at a frame, its "Traceback" header cut off: read it from there
    first = next((i for i, ln in enumerate(lines[:200]) if ln.strip()), -1)
    if first >= 0 and TB_FRAME.match(lines[first]):
        start = first
    for i, ln in enumerate(lines[:20000]):
        s = ln.strip()
        if s.startswith("^C"):  # the terminal echoes the Ctrl-C on the traceback's first line
            s = s[2:]
        if s.startswith("Traceback (most recent call last)"):
            # a traceback chained to an earlier exception is the handler's, not the wait's
            start, frames, chained = (-1 if chained else i), 0, False
            continue
        if s.startswith(_TB_CHAINED) or s == "Error in sys.excepthook:":
            # the handler's traceback (an exception while handling one, or in the hook that
            # prints it) says where the handler was, not where the thread was stuck
            chained, start = True, -1
            continue
        if start < 0:
            continue
        if TB_FRAME.match(ln):
            frames += 1
            continue
        if not s or ln[0] in " \t" or s.startswith(("^", "~")):
            continue  # source lines and carets under a frame
        if _KBI.match(s) and frames:
            return lines[start:i + 1]
        if _TB_EXC.match(s):
            start = -1  # another exception: its traceback is a crash report, not a stack
    return []


def tb_is_exception(lines: list[str]) -> bool:
    """Do these traceback-style lines end in a raised exception (``SomeError: message`` after the
    frames, or a chained-exception line)? Then they are a log's crash report, which the log
    reader owns, not a dump of where threads wait."""
    after_frame = False
    for ln in lines[:4000]:
        if not ln.strip():
            continue
        if TB_FRAME.match(ln):
            after_frame = True
            continue
        if ln[0] in " \t":  # source lines, carets, py-bt markers
            continue
        s = ln.strip()
        if s.startswith(_TB_CHAINED):
            return True
        if after_frame and _TB_EXC.match(s) and not TB_THREAD.match(s):
            return True
        after_frame = False
    return False


@dataclass
class _TbThread:
    """A thread of a traceback-style dump, entries in printed order until the order is known."""

    raw: RawThread
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


def parse_pytb(lines: list[str], notes: list[str]) -> list[RawProc]:
    """Header-less Python stacks: gdb ``py-bt`` (innermost first) and tracebacks printed by
    ``traceback.print_stack``/``format_stack`` (outermost first), one thread or several (recipe
    headers ``# Thread: name(id)``, or ``Traceback (...)`` lines, start a thread). The order is
    decided per thread (see _tb_order), then for the file; Python prints outermost first."""
    threads: list[_TbThread] = []
    cur: _TbThread | None = None
    pybt = False

    def start(tid: str = "", name: str = "") -> _TbThread:
        t = _TbThread(RawThread(tid, name))
        threads.append(t)
        return t

    after_frame = False
    for ln in lines:
        if not ln.strip():
            continue
        entry = pybt_entry(ln)
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
        if was_frame and not TB_HEAD.match(ln.strip()) and not TB_THREAD.match(ln.strip()):
            continue  # the frame's source line (pastes often lose its indentation)
        s = ln.strip()
        m = TB_HEAD.match(s)
        if m:
            if cur is None or cur.entries:
                cur = start()
            cur.order = "inner" if m.group("order") == "first" else "outer"
            pybt = pybt or cur.order == "inner"
            continue
        m = TB_THREAD.match(s)
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
    proc = RawProc(None, "gdb_pybt" if pybt else "traceback")
    for t in threads:
        if not t.entries:
            continue
        order = _tb_order(t) or default
        t.raw.frames = t.entries if order == "inner" else t.entries[::-1]
        proc.threads.append(t.raw)
    return [proc] if proc.threads else []
