"""Live helpers of the sampling profile: the text of the source lines main threads stood on (a
C call such as ``loss.item()`` shows only its caller's line), read through ``/proc`` as the
process sees its files and scrubbed, and py-spy's failures in words.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

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


# --- the probe --------------------------------------------------------------------------------
