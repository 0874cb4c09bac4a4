"""Live collection: the tail of the job's own log files, found from its processes.

Why through ``/proc``: the ranks' stdout/stderr are often files nobody named (a scheduler's
output file, a shell redirect), and reading ``/proc/PID/fd/1`` finds them, even deleted but still
open. Only the tail is copied, since the failure is at the end and a log can be gigabytes.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Any

from doctor.probes.common.files import regular_file_key

from doctor.evidence.contract import ProbeSkipped
from doctor.evidence.jobpaths import JobFileRefused, open_job_file

DEFAULT_TAIL_BYTES = 16 * 2**20   # live: bytes read from the end of each log file
MAX_LIVE_FILES = 64


def collect(ctx: Any) -> None:
    """Copy each log's tail into the bundle (see the module docstring)."""
    tail = int(ctx.options.get("log_tail_bytes") or DEFAULT_TAIL_BYTES)
    fds: list[int] = []  # files the job named, opened under doctor.evidence.jobpaths' policy
    try:
        sources = _live_sources(ctx, fds)
        if not sources:
            raise ProbeSkipped("no log files to read: the job's stdout/stderr are pipes or terminals "
                               "and no --logs were given")
        for i, (path, rank, pid, why) in enumerate(sources[:MAX_LIVE_FILES]):
            try:
                data, size = read_tail(path, tail)
            except OSError:
                continue
            name = f"{i:02d}-{_safe_name(why)}.log"
            ctx.add(name, data, rank=rank, pid=pid,
                    meta={"source": why, "size": size, "tail_bytes": len(data)})
    finally:
        for fd in fds:
            os.close(fd)


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")[:80] or "log"


def _live_sources(ctx: Any, fds: list[int]) -> list[tuple[Path, int | None, int | None, str]]:
    """Files to read: --logs paths, then regular files behind each process's fd 1/2 (read
    through /proc so a deleted-but-open log still counts), then NCCL_DEBUG_FILE targets. The
    job chose those paths, so they are opened with the job's rights (``open_job_file``: no
    planted symlink, no FIFO, only its user's files), the fd kept in ``fds``; a refusal is a
    note in the bundle."""
    found: list[tuple[Path, int | None, int | None, str]] = []
    seen: dict[tuple[int, int], int] = {}

    def add(path: Path, rank: int | None, pid: int | None, why: str) -> None:
        found_key = regular_file_key(path)
        if found_key is None:
            return
        key = found_key[0]
        if key in seen:  # one log shared by several processes: no single rank owns it
            i = seen[key]
            p, r, q, w = found[i]
            found[i] = (p, r if r == rank else None, q if q == pid else None, w)
            return
        seen[key] = len(found)
        found.append((path, rank, pid, why))

    for item in ctx.options.get("logs") or []:
        p = Path(item)
        if p.is_dir():
            files = sorted((f for f in p.rglob("*") if f.is_file() and not f.name.startswith(".")),
                           key=lambda f: f.stat().st_mtime, reverse=True)
            for f in files[:MAX_LIVE_FILES]:
                add(f, None, None, f"logs-{f.name}")
        else:
            add(p, None, None, f"logs-{p.name}")
    host = socket.gethostname()
    for proc in ctx.procs:
        rank = proc.rank if proc.role == "rank" else None
        for fd, label in ((1, "stdout"), (2, "stderr")):
            add(Path(f"/proc/{proc.pid}/fd/{fd}"), rank, proc.pid, f"{proc.role}{'' if rank is None else rank}-{proc.pid}-{label}")
        target = (proc.env or {}).get("NCCL_DEBUG_FILE", "")
        if target:
            try:
                fd = open_job_file(target.replace("%h", host).replace("%p", str(proc.pid)), proc.pid)
            except JobFileRefused as exc:
                ctx.bundle.note(f"logs: NCCL_DEBUG_FILE of pid {proc.pid}: {exc}")
                continue
            except OSError:
                continue
            fds.append(fd)
            add(Path(f"/proc/self/fd/{fd}"), rank, proc.pid, f"nccl-{proc.pid}")
    return found


def read_tail(path: Path, nbytes: int) -> tuple[bytes, int]:
    """The last ``nbytes`` of a file, starting at a line boundary (a newline or a NUL hole,
    after which text starts a record of its own); and the file's size."""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        start = max(0, size - nbytes)
        fh.seek(start)
        data = fh.read(nbytes)
    if start > 0:
        nl, nul = data.find(b"\n"), data.find(b"\x00")
        cuts = [i for i in (nl + 1 if nl >= 0 else -1, nul) if i >= 0]
        data = data[min(cuts):] if cuts else b""
    return data, size
