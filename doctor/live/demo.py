"""``mldoctor demo``: start a small real job with a fault, diagnose it live, clean up.

The job is a real torchrun gloo job on the CPU (doctor/scenarios/train_job.py). Every process
the demo starts lives in its own session and is killed with it, also on Ctrl-C.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from doctor.engine.report import Report
from doctor.evidence.errors import UserError
from doctor.live import targets

QUIET_FOR = 2.0      # seconds without a new step line: the job stopped making progress
START_DEADLINE = 180.0


def _log_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def start(name: str, workdir: Path, nproc: int | None = None) -> tuple[subprocess.Popen[bytes], Path]:
    from doctor.scenarios import SCENARIOS, job_command

    if name not in SCENARIOS:
        raise UserError(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}")
    if importlib.util.find_spec("torch") is None:
        raise UserError("the demo runs a real PyTorch job: install torch first (CPU build: pip install torch==2.13.0)")
    argv, env = job_command(name, nproc=nproc)
    log = workdir / f"{name}.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=workdir)
    return proc, log


def wait_until_stuck(proc: subprocess.Popen[bytes], log: Path, scenario: str) -> str:
    """Poll the job's output until its fault has happened and steps stopped (or it exited)."""
    from doctor.scenarios import FAULT_LINE_RE, SCENARIOS, STEP_LINE_RE

    sc = SCENARIOS[scenario]
    deadline = time.monotonic() + START_DEADLINE
    last_steps, last_change = -1, time.monotonic()
    while time.monotonic() < deadline:
        text = _log_text(log)
        if proc.poll() is not None:
            return "exited"
        steps = len(STEP_LINE_RE.findall(text))
        if steps != last_steps:
            last_steps, last_change = steps, time.monotonic()
        if sc.state in ("healthy", "slow"):
            if steps >= 2 * sc.nproc:
                return "running"
        elif (FAULT_LINE_RE.search(text) or sc.fault_rank is None) and time.monotonic() - last_change >= QUIET_FOR:
            return "stuck"
        time.sleep(0.2)
    raise UserError(f"scenario {scenario}: the job did not reach its fault within {START_DEADLINE:.0f}s; see {log}")


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (torchrun puts each rank in a session of its own)."""
    children: dict[int, list[int]] = {}
    for p in targets.all_procs().values():
        if p.state != "Z":
            children.setdefault(p.ppid, []).append(p.pid)
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill the job's launcher, every process below it and their groups; reap; verify."""
    victims = descendants(proc.pid)
    for pid in [proc.pid, *victims]:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in victims):
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    info = targets.read_proc(pid)
    return info is not None and info.state != "Z"


def leftovers(proc: subprocess.Popen[bytes], known: list[int]) -> list[int]:
    """Processes of the job still alive after ``stop`` (must be empty)."""
    return [p for p in [proc.pid, *known] if _alive(p)]


def run_demo(scenario: str, nproc: int | None = None, budget: float = 30.0,
             out: Path | None = None) -> tuple[Report, str]:
    """Start, wait, diagnose, stop. Returns the report and a line comparing it to the truth."""
    from doctor.engine.rule import format_ranks
    from doctor.live import agent
    from doctor.scenarios import SCENARIOS

    sc = SCENARIOS.get(scenario)
    if sc is None:
        raise UserError(f"unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}")
    with tempfile.TemporaryDirectory(prefix="mldoctor-demo-") as tmp:
        proc, log = start(scenario, Path(tmp), nproc)
        try:
            state = wait_until_stuck(proc, log, scenario)
            if state == "exited":
                from doctor.engine.diagnose import diagnose_path

                report = diagnose_path(log)
            else:
                report = agent.diagnose_live(pids=[proc.pid], logs=[log], budget=budget, out=out)
        finally:
            stop(proc)
    got = report.findings[0] if report.findings else None
    want = f"{sc.cause or 'nothing wrong'}" + (f" on ranks {format_ranks(sc.culprit_ranks)}" if sc.culprit_ranks else "")
    if got is None:
        ok = sc.cause is None
        line = f"expected {want}; mldoctor found nothing wrong"
    else:
        ok = got.cause in (sc.cause, *sc.also_acceptable) and (not sc.culprit_ranks or got.ranks == sc.culprit_ranks)
        line = f"expected {want}; mldoctor says {got.cause} on ranks {format_ranks(got.ranks)}"
    return report, ("MATCH: " if ok else "MISMATCH: ") + re.sub(r"\s+", " ", line)
