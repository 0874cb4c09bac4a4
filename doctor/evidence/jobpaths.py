"""Opening a file whose path the job chose: its environment, its command line, its stack frames.

Why a policy: mldoctor often runs as root, while a job's environment, its working folder and its
debug files are written by the job's user. ``NCCL_DEBUG_FILE=/etc/shadow``, or a symlink planted
where the job's flight-recorder dump should be, would otherwise make root copy into the bundle a
file that the job's user could never read, and a FIFO named like a log would hang the probe.
Every such open goes through :func:`open_job_file`, which applies one policy:

* The path is resolved as the process sees it: a relative path under ``/proc/PID/cwd``, an
  absolute one under ``/proc/PID/root`` (its container), one component at a time with
  ``O_NOFOLLOW``. A symlink among the folders is followed only when root or mldoctor's own user
  owns it (``/var/run -> /run``); a link any other user could have planted is refused.
* The last component is never followed (``O_NOFOLLOW``), the open never blocks (``O_NONBLOCK``:
  a FIFO or a device answers at once), and only a regular file is read.
* When mldoctor runs as another user than the job (root, typically), the file must be owned by
  the job's user, or be readable by everyone (``o+r``): what the job's user could read anyway.
  Checking what another uid may read through every folder's permissions is not done; the owner
  check plus refusing planted links is the bound.

Refusals raise :class:`JobFileRefused` whose message is the one-line note the probe keeps.
"""

from __future__ import annotations

import errno
import os
import stat

MAX_LINK_HOPS = 40


class JobFileRefused(Exception):
    """A path from the job was not opened; the message says why (a note for the bundle)."""


def process_uid(pid: int) -> int | None:
    """The effective uid of ``pid`` (from /proc/PID/status), None when it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Uid:"):
                    return int(line.split()[2])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _open_base(path: str, pid: int | None) -> tuple[int, int]:
    """(folder fd to start from, fd of the process's root) for ``path`` as ``pid`` sees it."""
    flags = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
    if pid is None:
        if not os.path.isabs(path):
            raise JobFileRefused(f"{path}: relative path with no process to resolve it against")
        root = os.open("/", flags)
        return os.dup(root), root
    try:  # the kernel's own links: the process's filesystem view (its container, its cwd)
        root = os.open(f"/proc/{pid}/root", flags)
    except OSError:
        if not os.path.isabs(path):
            raise JobFileRefused(f"{path}: process {pid} is gone or its folders are not readable") from None
        root = os.open("/", flags)
        return os.dup(root), root
    if os.path.isabs(path):
        return os.dup(root), root
    try:
        return os.open(f"/proc/{pid}/cwd", flags), root
    except OSError:
        os.close(root)
        raise JobFileRefused(f"{path}: the working folder of process {pid} is not readable") from None


def open_job_file(path: str, pid: int | None, uid: int | None = None) -> int:
    """A read-only fd of the regular file ``path`` names for process ``pid``, under the policy
    of this module; ``uid`` is the job's user (default: ``pid``'s). Raises JobFileRefused, or
    OSError when the file simply is not there."""
    if uid is None and pid is not None:
        uid = process_uid(pid)
    me = os.geteuid()
    cur, root = _open_base(path, pid)
    stack = [cur]  # folders walked so far: ".." goes back one without asking the filesystem
    parts = [p for p in path.split("/") if p not in ("", ".")]
    hops = 0
    try:
        while parts:
            name = parts.pop(0)
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                elif not _same_dir(stack[0], root):  # above a relative path's folder: ask the kernel
                    stack[0], old = os.open("..", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=stack[0]), stack[0]
                    os.close(old)
                # at the process's root ".." stays there, as the kernel does at "/": the host
                # folders above a container's root are never reached this way
                continue
            last = not parts
            flags = os.O_NOFOLLOW | os.O_CLOEXEC | (
                os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY if last else os.O_PATH | os.O_DIRECTORY)
            try:
                fd = os.open(name, flags, dir_fd=stack[-1])
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                st = os.stat(name, dir_fd=stack[-1], follow_symlinks=False)
                if not stat.S_ISLNK(st.st_mode):
                    raise
                if last:
                    raise JobFileRefused(f"{path}: a symbolic link; not followed (the job's user "
                                         "could point it at any file)") from None
                if st.st_uid not in (0, me):
                    raise JobFileRefused(f"{path}: folder {name!r} is a symbolic link owned by uid "
                                         f"{st.st_uid}; not followed") from None
                hops += 1
                if hops > MAX_LINK_HOPS:
                    raise JobFileRefused(f"{path}: too many symbolic links") from None
                target = os.readlink(name, dir_fd=stack[-1])
                if target.startswith("/"):
                    for d in stack[1:]:
                        os.close(d)
                    stack[:] = [stack[0]]
                    os.close(stack[0])
                    stack[0] = os.dup(root)
                parts = [p for p in target.split("/") if p not in ("", ".")] + parts
                continue
            if last:
                _check(fd, path, uid, me)
                return fd
            stack.append(fd)
        raise JobFileRefused(f"{path}: names a folder, not a file")
    finally:
        for d in stack:
            os.close(d)
        os.close(root)


def _same_dir(a: int, b: int) -> bool:
    sa, sb = os.fstat(a), os.fstat(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _check(fd: int, path: str, uid: int | None, me: int) -> None:
    """Only a regular file, and only one the job's user could read (see the module docstring)."""
    st = os.fstat(fd)
    problem = ""
    if not stat.S_ISREG(st.st_mode):
        problem = "not a regular file (a FIFO, device or folder); not read"
    elif uid is None and me == 0:
        problem = "the job's user is unknown (its process is gone); not read as root"
    elif uid is not None and uid != me and st.st_uid != uid and not st.st_mode & stat.S_IROTH:
        problem = (f"owned by uid {st.st_uid}, not by the job's user (uid {uid}); mldoctor runs as "
                   f"uid {me} and reads only what the job's user could read")
    if problem:
        os.close(fd)
        raise JobFileRefused(f"{path}: {problem}")


def read_job_file(path: str, pid: int | None, limit: int, tail: bool = False,
                  uid: int | None = None) -> tuple[bytes, int, float]:
    """(up to ``limit`` bytes: the head, or the tail when ``tail``; the file's size; its mtime)
    of a file the job named, under :func:`open_job_file`'s policy."""
    fd = open_job_file(path, pid, uid)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if tail and st.st_size > limit:
            fh.seek(st.st_size - limit)
        return fh.read(limit), st.st_size, st.st_mtime
