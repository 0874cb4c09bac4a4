"""Sampling-profile files: py-spy ``record -f raw`` (with or without ``--threads``) and speedscope
JSON, reduced to per-thread stack counts; the main thread is picked here because only its
samples say where a training step spends its time.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from doctor.evidence.errors import EvidenceError

THREAD_HDR = re.compile(r"^thread \((0x[0-9A-Fa-f]+|\d+)\)(?:: ?(.*))?$")
PROC_HDR = re.compile(r"^process (\d+):?(.*)$")
RAW_LINE = re.compile(r"^(.*\)) (\d+)$")
_SPEEDSCOPE_NAME = re.compile(r"(?:Process (\d+) )?Thread (0x[0-9A-Fa-f]+|\d+)(?: \"(.*)\")?")

Frame = tuple  # (name, file, line, native), as doctor.probes.stacks.classify wants


@lru_cache(maxsize=1 << 16)
def parse_frame(text: str) -> Frame | None:
    """``name (file:line)`` or ``name (lib)`` as py-spy writes it; None for anything else."""
    if not text.endswith(")"):
        return None
    idx = text.rfind(" (")
    if idx <= 0:
        return None
    name, inner = text[:idx], text[idx + 2:-1]
    file, sep, line = inner.rpartition(":")
    if not (sep and line.isdigit()):
        file, line = inner, "0"
    native = not (file.endswith((".py", ".pyw", ".pyx")) or file.startswith("<"))
    return (sys.intern(name), sys.intern(file), int(line), native)


@dataclass
class ThreadSamples:
    """One thread of one process: its stacks (innermost first) and counts."""

    tid: str
    name: str = ""
    pid: int | None = None
    stacks: dict[tuple[Frame, ...], int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.stacks.values())


@dataclass
class ProfileFile:
    """A parsed sampling profile: threads, and what the file said about itself."""

    fmt: str  # raw | speedscope
    threads: list[ThreadSamples]
    thread_ids: bool  # the file separates threads (py-spy --threads / speedscope)
    notes: list[str] = field(default_factory=list)


def _is_bootstrap(fr: Frame) -> bool:
    return (not fr[3]) and fr[1].endswith("threading.py") and fr[0].endswith(("_bootstrap", "_bootstrap_inner"))


def parse_raw(text: str, rel: str) -> ProfileFile:
    """py-spy ``record -f raw`` (flamegraph.pl's collapsed format): ``a;b;c COUNT`` per line."""
    threads: dict[tuple[int | None, str], ThreadSamples] = {}
    bad = good = 0
    with_ids = False
    for ln in text.splitlines():
        ln = ln.rstrip()
        if not ln:
            continue
        m = RAW_LINE.match(ln)
        if not m:
            bad += 1
            continue
        parts = m.group(1).split(";")
        pid: int | None = None
        tid, tname = "", ""
        i = 0
        while i < len(parts):
            pm = PROC_HDR.match(parts[i])
            tm = THREAD_HDR.match(parts[i]) if not pm else None
            if pm:
                pid = int(pm.group(1))
            elif tm:
                tid, tname, with_ids = tm.group(1), (tm.group(2) or "").strip(), True
            else:
                break
            i += 1
        frames = []
        for p in parts[i:]:
            fr = parse_frame(p)
            if fr is None:
                break
            frames.append(fr)
        else:
            good += 1
            key = (pid, tid)
            th = threads.get(key)
            if th is None:
                th = threads[key] = ThreadSamples(tid, tname, pid)
            stack = tuple(reversed(frames))
            th.stacks[stack] = th.stacks.get(stack, 0) + int(m.group(2))
            continue
        bad += 1
    if not good:
        raise EvidenceError(rel, "no py-spy raw sample lines ('frame;frame;... COUNT') found")
    notes = [f"{bad} line(s) that are not samples were skipped"] if bad else []
    if not with_ids:
        threads = _split_unnamed(threads)
    return ProfileFile("raw", list(threads.values()), with_ids, notes)


def _split_unnamed(threads: dict[tuple[int | None, str], ThreadSamples]) -> dict[tuple[int | None, str], ThreadSamples]:
    """Without ``--threads`` all threads share one bag: stacks rooted in threading's bootstrap
    belong to helper threads, the rest to the main thread."""
    out: dict[tuple[int | None, str], ThreadSamples] = {}
    for (pid, _tid), th in threads.items():
        main = out.setdefault((pid, "main"), ThreadSamples("main", "MainThread", pid))
        other = out.setdefault((pid, "helpers"), ThreadSamples("helpers", "helper threads", pid))
        for stack, n in th.stacks.items():
            dest = other if any(_is_bootstrap(f) for f in stack[-3:]) else main
            dest.stacks[stack] = dest.stacks.get(stack, 0) + n
    return {k: v for k, v in out.items() if v.stacks}


def parse_speedscope(doc: dict[str, Any], rel: str) -> ProfileFile:
    """py-spy ``record -f speedscope``: one sampled profile per thread, frames shared."""
    try:
        frames_in = doc["shared"]["frames"]
        profiles = doc["profiles"]
    except (KeyError, TypeError):
        raise EvidenceError(rel, "speedscope file without shared.frames/profiles") from None
    table: list[Frame] = []
    for f in frames_in:
        if not isinstance(f, dict):
            raise EvidenceError(rel, "speedscope frame is not an object")
        file = str(f.get("file") or "")
        line = int(f.get("line") or 0)
        native = not (file.endswith((".py", ".pyw", ".pyx")) or file.startswith("<"))
        table.append((sys.intern(str(f.get("name") or "?")), sys.intern(file), line, native))
    threads = []
    for prof in profiles:
        if not isinstance(prof, dict) or prof.get("type") != "sampled":
            continue
        m = _SPEEDSCOPE_NAME.search(str(prof.get("name") or ""))
        th = ThreadSamples(m.group(2) if m else str(len(threads)), (m.group(3) or "") if m else "",
                           int(m.group(1)) if m and m.group(1) else None)
        for sample in prof.get("samples") or []:
            try:
                stack = tuple(table[i] for i in reversed(sample))
            except (IndexError, TypeError):
                raise EvidenceError(rel, "speedscope sample names a frame that does not exist") from None
            th.stacks[stack] = th.stacks.get(stack, 0) + 1
        if th.stacks:
            threads.append(th)
    if not threads:
        raise EvidenceError(rel, "speedscope file has no sampled profile")
    return ProfileFile("speedscope", threads, True)


def main_thread(pf: ProfileFile) -> ThreadSamples | None:
    """The training loop's thread: named MainThread in the main process (not a DataLoader
    worker), else the busiest thread whose stacks are not rooted in threading's bootstrap."""
    def is_worker(th: ThreadSamples) -> bool:
        return any(not f[3] and f[0].endswith("_worker_loop") and "torch/utils/data/_utils/worker" in f[1]
                   for s in list(th.stacks)[:20] for f in s)

    cands = [t for t in pf.threads if not is_worker(t)] or pf.threads
    named = [t for t in cands if t.name == "MainThread"]
    if named:
        return max(named, key=lambda t: t.total)
    rooted = [t for t in cands if not any(s and _is_bootstrap(s[-1]) for s in t.stacks)]
    pool = rooted or cands
    return max(pool, key=lambda t: t.total) if pool else None


# --- step timings from doctor.torch -----------------------------------------------------------
