"""The in-job hang hook (``doctor.torch.install``): its watchdog and signal dumps in a plain
subprocess (no torch), and one real 4-rank torchrun gloo job whose dumps mldoctor diagnoses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A process that steps a few times, then stalls for a while: the watchdog must dump once the
# stall passes watchdog_s, again after each further watchdog_s, and stop at max_dumps.
_STALL = """
import os, signal, sys, time
from doctor import torch as hook
h = hook.install(sys.argv[1], watchdog_s=0.4, max_dumps={max_dumps}, rank=5)
for _ in range(10):
    time.sleep(0.05)
    hook.step()
assert h.dumps == 0, "dumped while steps were coming"
{body}
hook.uninstall()
assert "torch" not in sys.modules, "the hook imported torch"
print("alive", h.dumps)
"""


def _run(tmp_path: Path, body: str, max_dumps: int = 3) -> tuple[subprocess.CompletedProcess[str], str]:
    code = _STALL.format(body=textwrap.dedent(body), max_dumps=max_dumps)
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    text = (tmp_path / "faulthandler-rank5.txt").read_text()
    return proc, text


def test_watchdog_dumps_each_stall_up_to_max(tmp_path: Path) -> None:
    proc, text = _run(tmp_path, "time.sleep(3.0)", max_dumps=2)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["alive", "2"]
    assert text.count("mldoctor-hook: rank 5 ") == 2
    assert "watchdog: no step() for" in text
    # the main thread's stack, in the format the stacks kind reads
    assert "(most recent call first):" in text and "in <module>" in text


def test_watchdog_rearms_after_steps_resume(tmp_path: Path) -> None:
    body = """
    time.sleep(0.9)             # first stall: one dump (0.4 s), maybe a second (0.8 s)
    first = h.dumps
    for _ in range(5):
        time.sleep(0.05)
        hook.step()
    time.sleep(0.7)             # second stall: dumps again
    assert h.dumps > first >= 1, (first, h.dumps)
    """
    proc, text = _run(tmp_path, body)
    assert proc.returncode == 0, proc.stderr


def test_signal_dump_keeps_the_process_alive(tmp_path: Path) -> None:
    """SIGUSR2's default action kills; the hook must not chain onto it."""
    body = """
    os.kill(os.getpid(), signal.SIGUSR2)
    time.sleep(0.2)
    """
    proc, text = _run(tmp_path, body, max_dumps=0)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == "alive"
    assert "Current thread" in text and "in <module>" in text


def test_signal_chains_onto_a_python_handler(tmp_path: Path) -> None:
    code = textwrap.dedent("""
        import os, signal, sys, time
        seen = []
        signal.signal(signal.SIGUSR2, lambda *a: seen.append(1))
        from doctor import torch as hook
        hook.install(sys.argv[1], watchdog_s=None, rank=5)
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.2)
        print("handler ran", len(seen))
    """)
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["handler", "ran", "1"]
    assert "(most recent call first):" in (tmp_path / "faulthandler-rank5.txt").read_text()


def test_debug_server_missing_packages_warn(monkeypatch: pytest.MonkeyPatch) -> None:
    from doctor import torch as hook

    monkeypatch.setattr(hook, "DEBUG_SERVER_PACKAGES", ("mldoctor_no_such_package_x",))
    with pytest.warns(RuntimeWarning, match="mldoctor_no_such_package_x"):
        assert hook.start_debug_server(None) is False


def test_hook_dumps_diagnosed_offline(tmp_path: Path) -> None:
    """Two watchdog dumps from a stalled process read as stacks of rank 5 (file name)."""
    _run(tmp_path, "time.sleep(1.0)", max_dumps=2)
    out = subprocess.run([sys.executable, "-m", "doctor.cli", "diagnose", "--from", str(tmp_path), "--json"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    report = json.loads(out.stdout)
    assert report["evidence"]["kinds"] == ["stacks"], report["evidence"]
    assert list(report["ranks"]) == ["5"], report["ranks"]
    # two dumps of the same sleep: the stack did not move between the snapshots
    assert report["ranks"]["5"]["stacks"]["frozen"] is True, report["ranks"]


def _dumps_per_rank(folder: Path, n: int) -> list[int]:
    counts = []
    for r in range(n):
        f = folder / f"faulthandler-rank{r}.txt"
        counts.append(f.read_text().count("mldoctor-hook: ") if f.exists() else 0)
    return counts


@pytest.mark.live
def test_real_gloo_job_hook_dumps_name_the_culprit(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from doctor.live import demo
    from doctor.scenarios import free_port

    dumps = tmp_path / "dumps"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-addr",
            "127.0.0.1", "--master-port", str(free_port()), str(ROOT / "tests" / "hook_job.py"),
            "--dump-dir", str(dumps), "--watchdog-s", "3", "--fault-rank", "2", "--fault-step", "3"]
    log = (tmp_path / "job.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and min(_dumps_per_rank(dumps, 4)) < 2:
            assert proc.poll() is None, (tmp_path / "job.log").read_text()[-3000:]
            time.sleep(0.5)
        assert min(_dumps_per_rank(dumps, 4)) >= 2, (_dumps_per_rank(dumps, 4), (tmp_path / "job.log").read_text()[-3000:])
    finally:
        # our own test job (not a diagnosed one): kill torchrun and every rank below it
        known = demo.descendants(proc.pid)
        demo.stop(proc)
        log.close()
    assert demo.leftovers(proc, known) == [], "a process of the job survived"
    out = subprocess.run([sys.executable, "-m", "doctor.cli", "diagnose", "--from", str(dumps), "--json"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    report = json.loads(out.stdout)
    top = report["findings"][0] if report["findings"] else None
    assert top is not None, json.dumps(report.get("verdict"))[:2000]
    assert top["cause"] == "collective_mismatch", (top["cause"], top.get("summary"))
    assert top["ranks"] == [2], top["ranks"]
