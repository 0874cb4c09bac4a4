"""Live diagnosis of real 4-rank torchrun jobs (gloo, CPU) with injected faults.

Each scenario starts a real job, waits until its fault has happened (polling the job's own
output), diagnoses it live with real py-spy, and stops it. Every test also checks that no
process of the job, and no py-spy, is left behind.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from doctor.live import demo
from doctor.scenarios import SCENARIOS

pytestmark = pytest.mark.live


def _pyspy_procs(targets: set[int]) -> list[int]:
    """py-spy processes still attached to one of ``targets`` (other work on the host is ignored)."""
    out = subprocess.run(["pgrep", "-af", "py-spy (dump|record)"], capture_output=True, text=True).stdout
    left = []
    for line in out.splitlines():
        m = re.search(r"--pid[= ](\d+)", line)
        if m and int(m.group(1)) in targets:
            left.append(int(line.split()[0]))
    return left


def run_cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "doctor.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def job(request):
    """Start a scenario job; yield (proc, log); kill its whole session afterwards and verify."""
    started = []
    targets: set[int] = set()

    def _start(name: str):
        tmp = Path(tempfile.mkdtemp(prefix=f"mldoctor-test-{name}-"))
        proc, log = demo.start(name, tmp)
        started.append(proc)
        state = demo.wait_until_stuck(proc, log, name)
        return proc, log, state

    yield _start
    for proc in started:
        known = demo.descendants(proc.pid)
        targets.update([proc.pid, *known])
        assert _pyspy_procs(targets) == [], "py-spy was left running on the job"
        demo.stop(proc)
        assert demo.leftovers(proc, known) == [], "a process of the job survived"


def _check(report: dict, name: str) -> None:
    sc = SCENARIOS[name]
    top = report["findings"][0] if report["findings"] else None
    assert top is not None, f"{name}: no finding; verdict {report['verdict']}"
    assert top["cause"] in (sc.cause, *sc.also_acceptable), f"{name}: {top['cause']} ({top['summary']})"
    assert top["ranks"] == sc.culprit_ranks, f"{name}: ranks {top['ranks']}"


@pytest.mark.parametrize("name", ["extra_collective", "checkpoint_io", "lock_self", "rank0_exclusive"])
def test_hung_scenario_diagnosed_live(job, name):
    proc, log, state = job(name)
    assert state == "stuck"
    res = run_cli("diagnose", "--pid", str(proc.pid), "--logs", str(log), "--json")
    assert res.returncode == 1, res.stderr
    report = json.loads(res.stdout)
    _check(report, name)
    assert report["verdict"]["state"] == "hung"
    probes = {p["name"]: p["status"] for p in report["probes"]}
    assert probes.get("stacks") == "ok" and probes.get("procs") == "ok"
    assert probes.get("gpu") in ("skipped", "ok")


def test_dataloader_worker_hang_diagnosed_live(job):
    proc, log, _ = job("dataloader_hang")
    report = json.loads(run_cli("diagnose", "--pid", str(proc.pid), "--json").stdout)
    _check(report, "dataloader_hang")


def test_healthy_job_is_not_flagged(job):
    proc, log, state = job("healthy")
    assert state == "running"
    res = run_cli("diagnose", "--pid", str(proc.pid), "--json")
    report = json.loads(res.stdout)
    serious = [f for f in report["findings"] if f["severity"] in ("critical", "high", "medium")]
    assert serious == [], serious
    assert report["verdict"]["state"] == "healthy", report["verdict"]
    assert res.returncode in (0, 1)


def test_slow_job_is_slow_not_hung(job):
    proc, log, state = job("slow_rank")
    report = json.loads(run_cli("diagnose", "--pid", str(proc.pid), "--json").stdout)
    assert report["verdict"]["state"] != "hung", report["verdict"]
    assert not [f for f in report["findings"] if f["cause"] in ("rank_stuck_in_dataloader", "collective_mismatch")]


def test_dead_rank_found_from_the_launcher_log(job):
    proc, log, state = job("rank_exit")
    res = run_cli("diagnose", "--from", str(log), "--json")
    _check(json.loads(res.stdout), "rank_exit")


def test_diagnosis_sends_no_signal_to_the_job(job):
    """strace every process mldoctor starts (py-spy included) for signal-sending syscalls."""
    if not Path("/usr/bin/strace").exists():
        pytest.skip("strace is not installed")
    proc, log, _ = job("extra_collective")
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "strace.txt"
        res = subprocess.run(
            ["strace", "-f", "-qq", "-o", str(trace), "-e",
             "trace=kill,tkill,tgkill,rt_sigqueueinfo,rt_tgsigqueueinfo,pidfd_send_signal",
             sys.executable, "-m", "doctor.cli", "diagnose", "--pid", str(proc.pid), "--json"],
            capture_output=True, text=True, timeout=240)
        assert res.returncode == 1, res.stderr
        calls = [ln for ln in trace.read_text().splitlines() if re.search(r"\b(kill|tkill|tgkill|sigqueue|pidfd_send_signal)\(", ln)]
    job_pids = {proc.pid, *demo.descendants(proc.pid)}
    bad = []
    for ln in calls:
        m = re.search(r"(?:kill|tkill|tgkill|pidfd_send_signal)\((\d+), (?:\d+, )?(SIG\w+|0)", ln)
        if m and m.group(2) != "0" and int(m.group(1)) in job_pids:
            bad.append(ln)
    assert bad == [], bad
    # the job is still there, untouched
    assert os.path.exists(f"/proc/{proc.pid}")
