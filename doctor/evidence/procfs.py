"""The one reader of ``/proc``: every probe and the live layer read process facts through it.

Why one module: the readers it replaces (job discovery, the process-state probe, the host-limits
probe, the benchmark harness) each had their own error handling, and a rank that exits between
listing and reading, or a process of another user whose ``environ`` is denied, must mean the same
thing everywhere. The policy is: never raise; ``None`` means "not readable now" and
:func:`read_error` says whether the process is gone or the read was denied, so callers can tell a
user which of the two it was. Reads are plain ``open``/``read`` of pseudo-files: they never pause,
signal or attach to a process.
"""

from __future__ import annotations

import errno
import os

PROC = "/proc"


def _path(pid: int | None, name: str) -> str:
    return f"{PROC}/{name}" if pid is None else f"{PROC}/{pid}/{name}"


def read_error(pid: int | None, name: str) -> str:
    """Why ``name`` of ``pid`` cannot be read: ``""`` (it can), ``gone``, ``denied`` or the
    error's short text. A second read, only used to explain a failure to the user."""
    try:
        with open(_path(pid, name), "rb") as fh:
            fh.read(1)
        return ""
    except FileNotFoundError:
        return "gone"
    except PermissionError:
        return "denied"
    except ProcessLookupError:
        return "gone"
    except OSError as exc:
        if exc.errno in (errno.ESRCH, errno.ENOENT):
            return "gone"
        if exc.errno in (errno.EACCES, errno.EPERM):
            return "denied"
        return exc.strerror or type(exc).__name__


def read_bytes(pid: int | None, name: str) -> bytes | None:
    """``/proc/<pid>/<name>`` (or ``/proc/<name>`` for ``pid=None``) whole; ``None`` when the
    process is gone or the file is not readable."""
    try:
        with open(_path(pid, name), "rb") as fh:
            return fh.read()
    except OSError:
        return None


def read_text(pid: int | None, name: str) -> str | None:
    raw = read_bytes(pid, name)
    return None if raw is None else raw.decode(errors="replace")


def pids() -> list[int]:
    """Every process id visible now (a process may be gone by the time it is read)."""
    try:
        return [int(e) for e in os.listdir(PROC) if e.isdigit()]
    except OSError:
        return []


def thread_ids(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(_path(pid, "task")) if t.isdigit()]
    except OSError:
        return []


def status(pid: int) -> dict[str, str] | None:
    """``/proc/<pid>/status`` as ``{field: value}`` (``State``, ``PPid``, ``Uid`` ...)."""
    text = read_text(pid, "status")
    if text is None:
        return None
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def cmdline(pid: int) -> list[str] | None:
    raw = read_bytes(pid, "cmdline")
    return None if raw is None else [c.decode(errors="replace") for c in raw.split(b"\0") if c]


def environ(pid: int) -> dict[str, str] | None:
    """The process's environment at exec time; ``None`` when denied (another user's process
    without root, or a ptrace-restricted one) or gone."""
    raw = read_bytes(pid, "environ")
    if raw is None:
        return None
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.decode(errors="replace").partition("=")
        if sep:
            env[key] = value
    return env


def stat(pid: int, tid: int | None = None) -> list[str] | None:
    """The fields of ``stat`` after the command name: ``[0]`` is the run state, ``[1]`` the
    parent pid, ``[11]``/``[12]`` user/system ticks, ``[17]`` threads, ``[21]`` RSS pages (the
    man page's numbering minus three). The name may hold spaces and parentheses, so the split
    happens after its last ``)``."""
    text = read_text(pid, "stat" if tid is None else f"task/{tid}/stat")
    if not text or ")" not in text:
        return None
    return text[text.rfind(")") + 2:].split()


def link(pid: int, name: str) -> str | None:
    """Where ``/proc/<pid>/<name>`` points (``cwd``, ``exe``, ``fd/1``); ``None`` if unreadable."""
    try:
        return os.readlink(_path(pid, name))
    except OSError:
        return None


def meminfo() -> dict[str, int]:
    """``/proc/meminfo`` in bytes (fields given in kB there)."""
    out: dict[str, int] = {}
    for line in (read_text(None, "meminfo") or "").splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if parts and parts[0].isdigit():
            out[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def loadavg() -> str:
    """The one-minute load average as printed, ``?`` when unknown."""
    text = read_text(None, "loadavg")
    return text.split()[0] if text else "?"
