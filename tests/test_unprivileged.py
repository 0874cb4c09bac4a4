"""Issue #19's end-to-end case: mldoctor run as an unprivileged user, with no arguments, on the
host of a hung 4-rank job that root runs with torch's debug server on its default port.

No ptrace (py-spy is denied), no /proc/PID/environ (another user's): the job is found from its
launcher's process tree, the debug server answers for every rank, and the verdict names the cause
and the culprit; the report says which sources were unavailable and why. The periodic dumps, read
offline by the same user, give the same verdict. mldoctor runs from a virtualenv made with the
system Python, because this checkout's interpreter may live where the unprivileged user cannot go.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import FIXTURES, ROOT

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
PORT = 25999  # the debug server's default: mldoctor is given no URL


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp does: TIME_WAIT is no owner
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def shared_dir() -> Iterator[Path]:
    """A folder the unprivileged user can enter (pytest's tmp_path is private to root)."""
    d = Path(tempfile.mkdtemp(prefix="mldoctor-unpriv-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def nobody_mldoctor(shared_dir: Path) -> Path:
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run mldoctor as another user")
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system Python for the unprivileged user")
    venv = shared_dir / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(ROOT)],
                   check=True, timeout=600, capture_output=True)
    return venv / "bin" / "mldoctor"


@pytest.fixture(scope="module")
def root_job(shared_dir: Path) -> Iterator[Path]:
    """Root's 4-rank gloo job with the debug server on port 25999, rank 2 in an extra barrier."""
    for mod in ("aiohttp", "jinja2", "tabulate"):
        pytest.importorskip(mod)
    if not _port_free(PORT):
        pytest.skip(f"port {PORT} is taken: the debug server cannot use its default here")
    dumps = shared_dir / "dumps"
    env = dict(os.environ, CAP_MODE="mismatch", CAP_DUMPS=str(dumps), CAP_PORT=str(PORT),
               TORCH_FR_BUFFER_SIZE="2000", OMP_NUM_THREADS="1")
    with socket.socket() as s:
        s.bind(("", 0))
        master = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-port", str(master),
           str(FIXTURES / "debug_server" / "capture.py"), "--rank-main"]
    log = open(shared_dir / "torchrun.log", "wb")  # noqa: SIM115 - closed in the teardown
    job = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                           cwd=shared_dir)
    try:
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://localhost:{PORT}/tcpstore", timeout=5) as r:
                    if r.read().count(b"debug_server/rank") >= 4:
                        break
            except OSError:
                pass
            time.sleep(1)
        else:
            pytest.fail("the debug server did not come up: " + (shared_dir / "torchrun.log").read_text()[-2000:])
        deadline = time.time() + 60  # rank 2 reaches its extra barrier at step 3; a dump follows
        while time.time() < deadline and len(list(dumps.glob("stacks_*.txt"))) < 2:
            time.sleep(1)
        yield dumps
    finally:
        os.killpg(job.pid, signal.SIGTERM)  # the test's own job, not a diagnosed one
        try:
            job.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        log.close()


def _as_nobody(mldoctor: Path, *args: str) -> tuple[dict, str]:
    out = subprocess.run([*NOBODY, str(mldoctor), "diagnose", "--json", *args], capture_output=True, text=True,
                         cwd="/tmp", timeout=300)
    assert out.stdout.strip(), out.stderr[-2000:]
    return json.loads(out.stdout), out.stderr


@pytest.mark.live
def test_unprivileged_user_names_cause_and_culprit_live_and_offline(nobody_mldoctor: Path, root_job: Path) -> None:
    report, err = _as_nobody(nobody_mldoctor, "--budget", "40")
    assert report["verdict"]["state"] == "hung", err[-2000:]
    said = [(f["cause"], f["ranks"]) for f in report["findings"]]
    assert said and said[0] == ("collective_mismatch", [2]), (said, err[-2000:])
    sources = {p["name"]: p for p in report["probes"]}  # each probe (its last run)
    assert sources["debug_server"]["status"] == "ok"
    assert sources["stacks"]["status"] == "failed" and "ptrace" in sources["stacks"]["reason"], sources
    assert sources["env"]["status"] == "failed" and "environment" in sources["env"]["reason"], sources
    offline, _ = _as_nobody(nobody_mldoctor, "--from", str(root_job))
    assert offline["verdict"]["state"] == "hung"
    assert (offline["findings"][0]["cause"], offline["findings"][0]["ranks"]) == ("collective_mismatch", [2])
