"""Issue #18: a rule-asked sampling slice ends early only on decisive evidence.

The rule (doctor/live/window.py): every sampled rank's own log names ``STEPS_PER_SLICE`` new step
numbers since the slice began, and the slice has lasted ``MIN_EARLY_S``. These tests watch real
processes' stdout through /proc (a ``sleep`` whose stdout is a file the test appends to, as a
job appends to its log): a per-rank log, a shared log with rank prefixes, lines that name no
rank, a hang (no new step), a pipe, and that lines written before the slice do not count.
The last test runs the samples probe with py-spy on a small Python process that logs steps.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from doctor.probes.samples.live import StepWatch, wait_decisive

from doctor.live import window


def _sleeper(out: Path | None) -> subprocess.Popen[bytes]:
    """A process whose stdout is ``out`` (appended to) or a pipe when ``out`` is None."""
    fh = open(out, "ab") if out is not None else subprocess.PIPE  # noqa: SIM115 - closed below
    p = subprocess.Popen(["sleep", "60"], stdout=fh, stderr=subprocess.DEVNULL)
    if out is not None:
        fh.close()  # type: ignore[union-attr]
    return p


def _write(path: Path, lines: list[str]) -> None:
    with open(path, "a") as fh:
        fh.write("".join(ln + "\n" for ln in lines))


@pytest.fixture
def procs():
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


def test_per_rank_logs_count_for_their_rank(tmp_path, procs):
    logs = [tmp_path / f"rank{r}.log" for r in range(2)]
    for log in logs:
        _write(log, ["step 1 loss 2.0"])  # before the slice: not counted
    procs += [_sleeper(log) for log in logs]
    w = StepWatch([(r, p.pid) for r, p in enumerate(procs)], 3)
    try:
        assert w.usable()
        _write(logs[0], [f"Epoch 0 | step {s} | loss 1.0" for s in (2, 3, 4)])
        _write(logs[1], [f"iter={s} lr=0.1" for s in (2, 3)])
        w.poll()
        assert not w.decisive()  # rank 1 named only two new steps
        _write(logs[1], ["iter=4 lr=0.1"])
        w.poll()
        assert w.decisive(), w.seen
    finally:
        w.close()


def test_a_shared_log_counts_a_line_for_the_rank_it_names(tmp_path, procs):
    log = tmp_path / "launcher.log"
    procs += [_sleeper(log), _sleeper(log)]
    w = StepWatch([(0, procs[0].pid), (1, procs[1].pid)], 3)
    try:
        _write(log, [f"[rank0]: step {s}" for s in (1, 2, 3)] + ["step 9 (no rank)"])
        w.poll()
        assert not w.decisive() and len(w.seen[1]) == 0  # a line naming no rank counts for none
        _write(log, [f"[mldoctor-scenario] rank 1 step {s}" for s in (1, 2)])
        w.poll()
        assert not w.decisive()
        _write(log, ["[mldoctor-scenario] rank 1 st", "ep 3"])  # a line cut by the poll is read whole later
        w.poll()
        assert not w.decisive()
        _write(log, ["[mldoctor-scenario] rank 1 step 3"])
        w.poll()
        assert w.decisive(), w.seen
    finally:
        w.close()


def test_a_hung_job_or_a_repeated_step_never_ends_the_slice(tmp_path, procs):
    log = tmp_path / "r0.log"
    procs.append(_sleeper(log))
    w = StepWatch([(0, procs[0].pid)], 3)
    try:
        _write(log, ["waiting in all_reduce, step 7"] * 20)  # the same step over and over: no progress
        w.poll()
        assert not w.decisive()
        t0 = time.monotonic()
        # the slice's own py-spy processes end at its length: then it ran its course ('')
        assert wait_decisive(w, lambda: time.monotonic() - t0 < 0.5, 0.1, poll_s=0.05) == ""
    finally:
        w.close()


def test_a_pipe_gives_no_counter(procs):
    procs.append(_sleeper(None))
    w = StepWatch([(0, procs[0].pid)], 3)
    assert not w.usable() and not w.decisive()
    w.close()


def test_the_minimum_length_holds_even_when_steps_come_at_once(tmp_path, procs):
    log = tmp_path / "r0.log"
    procs.append(_sleeper(log))
    w = StepWatch([(0, procs[0].pid)], 3)
    try:
        _write(log, [f"step {s}" for s in range(10)])
        t0 = time.monotonic()
        why = wait_decisive(w, lambda: True, 0.4, poll_s=0.05)
        assert why and time.monotonic() - t0 >= 0.4
    finally:
        w.close()


def test_the_options_a_rule_asked_slice_gets():
    opts = window.early_end()
    assert opts == {"stop_after_steps": int(window.STEPS_PER_SLICE), "min_window_s": window.MIN_EARLY_S}
    assert window.MIN_EARLY_S < window.MIN_SLICE


JOB = textwrap.dedent("""
    import sys, time
    i = 0
    while True:
        i += 1
        sum(x * x for x in range(3000))
        print(f"[rank0]: step {i} loss 0.5", flush=True)
        time.sleep(0.02)
""")


def test_the_samples_probe_ends_a_slice_of_a_progressing_process(tmp_path):
    """py-spy on a real process that logs a step every ~25 ms: a 6 s slice asked with the
    early-end options ends after about MIN_EARLY_S, and says so in its window document; the
    same slice without those options (the user's --symptom slow window) is not cut."""
    from doctor.probes.samples import PROBE
    from doctor.probes.samples.live import find_pyspy

    from doctor.evidence.bundle import Bundle
    from doctor.evidence.contract import RankProcess
    from doctor.live.agent import _Context

    if find_pyspy() is None:
        pytest.skip("py-spy is not installed")
    log = tmp_path / "job.log"
    with open(log, "ab") as fh:
        job = subprocess.Popen([sys.executable, "-c", JOB], stdout=fh, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        rp = RankProcess(pid=job.pid, rank=0, role="rank")
        b = Bundle.create(tmp_path / "b", {"type": "live"})
        ctx = _Context(b, "h", [rp], {"duration": 6, **window.early_end()}, 10.0, "samples", 2)
        t0 = time.monotonic()
        try:
            result = PROBE.collect(ctx)
        except Exception as exc:  # py-spy may not attach in a restricted sandbox
            pytest.skip(f"py-spy could not sample here: {exc}")
        took = time.monotonic() - t0
        assert result["ended_early"], result
        # the window lasted until py-spy stopped sampling: well short of the 6 s asked
        # (duration_s is rounded to 10 ms, so it may read up to 5 ms above the measured wall time)
        assert window.MIN_EARLY_S <= result["duration_s"] < 5.0 and result["duration_s"] <= took + 0.01, (took, result)
        doc = json.loads(next((tmp_path / "b").rglob("samples-r2-window.json")).read_text())
        assert doc["asked_s"] == 6 and doc["duration_s"] == result["duration_s"] and doc["ended_early"]
        assert doc["ranks"][0]["ok"] and doc["ranks"][0]["samples"] > 0
        user = _Context(b, "h", [rp], {"duration": 2}, 10.0, "samples", 3)  # no early-end options
        plain = PROBE.collect(user)
        assert not plain["ended_early"] and plain["duration_s"] == 2.0, plain
    finally:
        job.kill()
        job.wait()


# -- the first analysis reads a slice that has ended, never waits for one that runs ------------------

def test_a_finished_slice_is_read_by_the_first_analysis_a_running_one_is_not(tmp_path):
    import threading
    from types import SimpleNamespace

    from doctor.engine.trace import Trace
    from doctor.evidence.bundle import Bundle, ProbeRun
    from doctor.live import agent

    b = Bundle.create(tmp_path / "b", {"type": "live"})
    job = SimpleNamespace(host="h", procs=[], ranks=[], world_size=2, local_world_size=2, launcher=None)
    col = agent.Collector(b, job, Trace(), {})  # type: ignore[arg-type]
    gate = threading.Event()
    thread = threading.Thread(target=gate.wait, daemon=True)
    thread.start()
    slot: dict = {"held": True}
    col.early = {"started": ("samples", {"duration": 2}, thread, slot, time.perf_counter() + 30, 30.0),
                 "duration": 2.0, "ranks": [0, 1], "round": 2}
    assert not col.keep_early()  # still sampling: the first analysis does not wait for it
    assert not b.manifest["artifacts"] and col.window_taken == 0.0
    ctx = agent._Context(b, "h", [], {}, 5.0, "samples", 2)
    ctx.held = []
    ctx.add("samples-r2-rank0.txt", "main;f (x.py:1) 5\n", rank=0)
    slot.update(ctx=ctx, run=ProbeRun("samples", "ok", "", 1.3, "h", 1),
                result={"duration_s": 1.3, "ended_early": "every rank's log named 3+ new step numbers"})
    gate.set()
    thread.join()
    assert col.keep_early()  # ended: committed, and its real length counts as the window taken
    assert [a["path"] for a in b.manifest["artifacts"]] == ["hosts/h/samples/samples-r2-rank0.txt"]
    assert col.window_taken == 1.3 and col.window_round == 2
    assert any("ended after 1.3 s" in s["detail"] for s in col.trace.steps)
    assert col.take_early("samples", [0, 1]) == "kept"  # a rule asking for it later has its answer
    assert col.take_early("samples", [5]) == ""
