"""The one /proc reader: same answers for live processes, gone ones and awkward names."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from doctor.evidence import procfs

from .conftest import ROOT


def test_own_process_reads_whole():
    me = os.getpid()
    assert me in procfs.pids()
    assert procfs.status(me)["Pid"] == str(me)
    assert procfs.cmdline(me)[0].endswith(("python", "python3")) or "python" in procfs.cmdline(me)[0]
    assert procfs.environ(me).get("PATH") == os.environ.get("PATH")
    fields = procfs.stat(me)
    assert fields[0] in "RSD" and int(fields[1]) == os.getppid()
    assert me in procfs.thread_ids(me)
    assert procfs.link(me, "cwd") == os.getcwd()
    assert procfs.meminfo()["MemTotal"] > 0
    assert procfs.read_error(me, "status") == ""


def test_a_gone_process_is_none_everywhere_and_says_gone():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    pid = child.pid
    assert (procfs.status(pid), procfs.cmdline(pid), procfs.environ(pid), procfs.stat(pid),
            procfs.link(pid, "cwd")) == (None, None, None, None, None)
    assert procfs.thread_ids(pid) == []
    assert procfs.read_error(pid, "environ") == "gone"


def test_stat_splits_after_a_name_with_spaces_and_parentheses(tmp_path: Path):
    odd = tmp_path / "a) b (c"
    odd.symlink_to(sys.executable)
    child = subprocess.Popen([str(odd), "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        fields = procfs.stat(child.pid)
        assert fields is not None and int(fields[1]) == os.getpid()
        assert int(fields[17]) >= 1  # threads
    finally:
        child.communicate(b"")


def test_another_users_environ_is_denied_not_gone():
    """Read as an unprivileged user: this process's environ (root's, under CI) or pid 1's.

    The reader is stdlib-only, so a copy of it runs under the system Python, which the
    unprivileged user can execute even when this checkout's virtualenv is private."""
    target = os.getpid() if os.geteuid() == 0 else 1
    with tempfile.TemporaryDirectory() as tmp:  # pytest's tmp_path is private to root
        folder = Path(tmp)
        folder.chmod(0o755)
        shutil.copy(Path(procfs.__file__), folder / "procfs.py")
        (folder / "procfs.py").chmod(0o644)
        out = _run_unprivileged(folder, target)
    assert out.stdout.split() == ["True", "denied", "True"], out.stderr


def _run_unprivileged(folder: Path, target: int) -> subprocess.CompletedProcess[str]:
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    code = ("import sys, procfs; p = int(sys.argv[1]); "
            "print(procfs.environ(p) is None, procfs.read_error(p, 'environ'), procfs.status(p) is not None)")
    kwargs = {"user": 65534, "group": 65534, "extra_groups": []} if os.geteuid() == 0 else {}
    try:
        return subprocess.run([python, "-c", code, str(target)], capture_output=True, text=True,
                              cwd=folder, timeout=60, **kwargs)
    except PermissionError:
        pytest.skip("no Python the unprivileged user may run")


def _reads_proc(node: ast.AST) -> bool:
    """A call that reads /proc itself (open/listdir/readlink/read_text of a /proc path)."""
    if not isinstance(node, ast.Call):
        return False
    text = ast.unparse(node)
    reader = any(name in text for name in ("open(", "listdir(", "readlink(", ".read_text(", ".read_bytes("))
    return reader and ('"/proc' in text or "'/proc" in text)


def test_nothing_else_reads_proc_directly():
    """Paths into a job's own filesystem view (``/proc/PID/root/...``, ``/proc/PID/fd/N``) are
    built elsewhere and opened as evidence files; reading process facts goes through procfs."""
    offenders = []
    for base in ("doctor", "probes", "bench"):
        for path in sorted((ROOT / base).rglob("*.py")):
            if path.name in ("procfs.py", "jobpaths.py"):  # the reader; the job's own files
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if _reads_proc(node):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []
