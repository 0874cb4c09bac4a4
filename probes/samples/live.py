"""Live helpers of the sampling profile: the text of the source lines main threads stood on (a
C call such as ``loss.item()`` shows only its caller's line), read through ``/proc`` as the
process sees its files and scrubbed, and py-spy's failures in words.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from doctor.probes.common.files import regular_file_key
from doctor.probes.common.text import strip_prefixes
from doctor.probes.samples import timeshare as ts
from doctor.probes.samples.profiles import ThreadSamples

from doctor.evidence.jobpaths import JobFileRefused, read_job_file
from doctor.evidence.redact import scrub

MAX_LINES = 400  # source lines kept per rank
MAX_SOURCE_BYTES = 4 * 2**20
PYSPY_DONE = re.compile(r"Samples: (\d+) Errors: (\d+)")


def source_line(pid: int, file: str, line: int, cache: dict[str, list[str] | None]) -> str:
    """The text of ``file:line`` as the process sees it (its root and cwd), scrubbed; '' if not
    readable. Only ``.py`` files, only up to MAX_SOURCE_BYTES."""
    if line <= 0 or not file.endswith(".py"):
        return ""
    if file not in cache:
        cache[file] = None
        try:  # a frame's file name is the job's to choose: opened with its user's rights
            data, size, _ = read_job_file(file, pid, MAX_SOURCE_BYTES + 1)
            if size <= MAX_SOURCE_BYTES:
                cache[file] = data.decode("utf-8", errors="replace").splitlines()
        except (OSError, JobFileRefused):
            pass
    lines = cache[file]
    if not lines or line > len(lines):
        return ""
    return scrub(lines[line - 1].strip())[:200]


def source_lines(pid: int, thread: ThreadSamples | None, cache: dict[str, list[str] | None]) -> dict[str, str]:
    """Texts of the innermost Python lines of the main thread's stacks, most samples first."""
    if thread is None:
        return {}
    counts: dict[tuple[str, int], int] = {}
    for stack, n in thread.stacks.items():
        keys = set()
        if stack and not stack[0][3]:
            keys.add((stack[0][1], stack[0][2]))  # the line a running sample stands on
        site = ts.user_site(stack)  # the user's own line (the report's hot lines)
        if site:
            file, _, line = site.rpartition(":")
            keys.add((file, int(line)))
        for key in keys:
            counts[key] = counts.get(key, 0) + n
    out: dict[str, str] = {}
    for (file, line), _n in sorted(counts.items(), key=lambda kv: -kv[1])[:MAX_LINES]:
        text = source_line(pid, file, line, cache)
        if text:
            out[f"{file}:{line}"] = text
    return out


def find_pyspy() -> str | None:
    """py-spy on PATH, or beside this interpreter (a venv that is not activated)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def failure(rc: int | None, text: str, pid: int) -> str:
    low = text.lower()
    if "permission denied" in low or "operation not permitted" in low:
        return "permission denied (ptrace): run as the job's user or root, or add CAP_SYS_PTRACE"
    if not Path(f"/proc/{pid}").exists() or "no such process" in low:
        return "the process exited during sampling"
    first = next((ln.strip() for ln in text.splitlines() if ln.strip() and "py-spy>" not in ln), "")
    return (first or f"py-spy exited with {rc}")[:200]


# --- ending a window early: every rank's step counter, read from its log ----------------------

#: A training step counter in a log line: ``step 120``, ``Step: 120``, ``iter=120``,
#: ``iteration 120/5000``, ``global_step=120``; the number is the counter.
STEP_WORD = re.compile(r"(?i)(?:\b|_)(?:step|iter|iteration)\b\s*[:=#]?\s*(\d{1,12})\b")
#: A rank named in the line's text (``rank 3``, ``rank=3``, ``[rank3]``) when no launcher prefix says it.
RANK_WORD = re.compile(r"(?i)\brank\s*[:=#]?\s*(\d{1,6})\b")
#: Bytes read per log file per poll: a job that logs faster than this is shown by the newest part.
POLL_BYTES = 1 << 20


class StepWatch:
    """Counts, per rank, the distinct step numbers its log lines name while a window runs.

    Why: a sampling window only has to cover a few steps of every rank to settle healthy versus
    straggler versus hung (``doctor.live.window``). A rank whose log names ``need`` new step
    numbers since the window began has completed that many steps: it is not hung, and the
    samples taken so far span those steps. The logs are the files behind each rank's stdout and
    stderr, opened through ``/proc/PID/fd`` (the file the process holds, as the logs probe does;
    only regular files: a pipe or a terminal gives no counter, and then the window runs its full
    length). A line belongs to the rank its launcher prefix (``[rank3]:``) or its text
    (``rank 3``) names, or, in a file only one rank writes, to that rank; a line naming no
    rank in a shared file counts for none. Only bytes written after the window began are read.
    """

    def __init__(self, ranks: list[tuple[int, int]], need: int) -> None:
        self.need = max(1, need)
        self.ranks = {r for r, _ in ranks}
        self.seen: dict[int, set[int]] = {r: set() for r in self.ranks}
        # (dev, inode) -> [fh, offset, partial line, ranks writing to it]
        self.files: dict[tuple[int, int], list[Any]] = {}
        for rank, pid in ranks:
            for fd in (1, 2):
                self._attach(f"/proc/{pid}/fd/{fd}", rank)

    def _attach(self, path: str, rank: int) -> None:
        found = regular_file_key(path)
        if found is None:
            return
        key, size = found
        if key in self.files:
            self.files[key][3].add(rank)
            return
        try:
            fh = open(path, "rb")  # noqa: SIM115 - kept open for the window, closed in close()
        except OSError:
            return
        self.files[key] = [fh, size, b"", {rank}]

    def usable(self) -> bool:
        """Some rank's output is a regular file: there is a counter to watch."""
        return bool(self.files)

    def poll(self) -> None:
        """Read what was appended since the last poll and note the step numbers per rank."""
        for entry in self.files.values():
            fh, offset, partial, writers = entry
            try:
                size = os.fstat(fh.fileno()).st_size
                if size < offset:  # truncated (rotated in place): start again from its end
                    entry[1], entry[2] = size, b""
                    continue
                if size == offset:
                    continue
                start = max(offset, size - POLL_BYTES)
                fh.seek(start)
                data = fh.read(size - start)
            except OSError:
                continue
            entry[1] = size
            if start > offset:  # skipped ahead: the first line is cut
                partial, data = b"", data[data.find(b"\n") + 1:] if b"\n" in data else b""
            text = partial + data
            cut = text.rfind(b"\n")
            entry[2] = text[cut + 1:][-4096:]
            only = next(iter(writers)) if len(writers) == 1 else None
            for raw in text[:cut + 1].splitlines():
                self._line(raw.decode("utf-8", "replace"), only)

    def _line(self, line: str, only: int | None) -> None:
        m = STEP_WORD.search(line)
        if m is None:
            return
        body, rank = strip_prefixes(line)
        if rank is None:
            rm = RANK_WORD.search(body)
            rank = int(rm.group(1)) if rm else only
        if rank in self.seen:
            self.seen[rank].add(int(m.group(1)))

    def decisive(self) -> bool:
        """Every watched rank named at least ``need`` distinct step numbers since the start."""
        return bool(self.ranks) and all(len(s) >= self.need for s in self.seen.values())

    def summary(self) -> str:
        low = min((len(s) for s in self.seen.values()), default=0)
        return f"every rank's log named {low}+ new step numbers (at least {self.need} needed)"

    def close(self) -> None:
        for fh, *_ in self.files.values():
            fh.close()


def wait_decisive(watch: StepWatch, alive: Any, min_s: float, poll_s: float = 0.2) -> str:
    """Poll ``watch`` while ``alive()`` says the window runs; '' when it ran to its end, else
    why it may stop now (only after ``min_s`` seconds)."""
    t0 = time.monotonic()
    while alive():
        watch.poll()
        if time.monotonic() - t0 >= min_s and watch.decisive():
            return watch.summary()
        time.sleep(poll_s)  # the evidence comes from the job: look again shortly
    return ""


# --- the probe --------------------------------------------------------------------------------
