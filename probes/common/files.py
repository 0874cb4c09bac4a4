"""Which open file a process's stdout/stderr is, shared by the logs probe (which reads it) and the
samples probe (which counts steps in it during a window)."""

from __future__ import annotations

import os
import stat


def regular_file_key(path: str | os.PathLike[str]) -> tuple[tuple[int, int], int] | None:
    """``((st_dev, st_ino), size)`` of the regular file behind ``path`` (``/proc/PID/fd/N``
    follows to the file the process holds, even deleted), or None for a pipe, a terminal, a
    socket or a path that cannot be read: those hold no log a reader could come back to. The key
    tells when several ranks write one shared file."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return (st.st_dev, st.st_ino), st.st_size
