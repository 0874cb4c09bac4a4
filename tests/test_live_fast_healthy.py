"""Issue #18: a healthy job's live verdict comes fast, and a rule-asked sampling window is only as
long as the evidence needs (doctor/live/window.py), without losing hung versus slow.

The unit tests pin the window's decisions on facts and bundles: the first slice's length, when a
slice is extended, the gate that starts a slice early, and that an early slice's artifacts stay
out of the bundle until they are kept. The live tests (marked ``live``) run real torchrun jobs:
a healthy 8-rank job is judged healthy with at most one short slice and the progress lines on
stderr name the window; a straggler job is still slow, with the straggler named.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from doctor.engine import facts as facts_mod
from doctor.evidence.bundle import Bundle
from doctor.live import window
from doctor.live.agent import _Context

FIXTURES = Path(__file__).parent / "fixtures"


# -- the first slice ------------------------------------------------------------------------------

def test_first_slice_is_short_without_a_step_time_and_capped_by_duration():
    assert window.first_slice({}, 10.0) == window.MIN_SLICE
    assert window.first_slice(None, 1.0) == 1.0  # never past what the user allowed


@pytest.mark.parametrize("step_s, want", [(0.05, 2.0), (1.5, 5.0), (2.0, 6.0), (30.0, 10.0)])
def test_first_slice_covers_three_steps(step_s, want):
    facts = {"metrics": {"step_time": {"median": step_s}}}
    assert window.first_slice(facts, 10.0) == want


def test_step_time_from_the_in_job_timer_and_not_from_nonsense():
    assert window.step_time({"samples": {"steps": {"step_time_median": 0.4}}}) == 0.4
    assert window.step_time({"metrics": {"step_time": {"median": 0}}}) is None
    assert window.step_time({"metrics": {"step_time": {"median": True}}}) is None
    assert window.step_time({"metrics": "odd"}) is None


# -- when a slice is not enough ---------------------------------------------------------------------

def _samples(progress: str, frozen: list[int]) -> dict:
    return {"samples": {"progress": progress, "frozen_ranks": frozen, "n_windows": 1, "duration_s": 2.0}}


def test_a_progressing_window_settles_it():
    assert window.still_ambiguous(_samples("progressing", []), 2.0) == ""


def test_a_window_that_says_hung_is_extended():
    assert "never left" in window.still_ambiguous(_samples("hung", [1, 2, 3]), 2.0)


def test_a_frozen_rank_whose_thread_wakes_is_a_waiter_not_a_hang():
    facts = {**_samples("progressing", [0]), "procs": {"main_waking_ranks": [0, 1, 2, 3]}}
    assert window.still_ambiguous(facts, 2.0) == ""
    facts["procs"]["main_waking_ranks"] = [1, 2, 3]
    assert "rank(s) 0" in window.still_ambiguous(facts, 2.0)


def test_a_slice_shorter_than_three_steps_is_extended():
    facts = {**_samples("progressing", []), "metrics": {"step_time": {"median": 4.0}}}
    assert "steps" in window.still_ambiguous(facts, 2.0)
    assert window.still_ambiguous(facts, 12.0) == ""


def test_no_window_nothing_to_extend_and_too_few_samples_is_ambiguous():
    assert window.still_ambiguous({}, 0.0) == ""
    assert "too few" in window.still_ambiguous(_samples("", []), 2.0)


def test_real_windows_slow_settles_hung_extends():
    """The captured 4-rank windows: a straggler's window settles it; a hang around rank 0 does not."""
    def facts(name: str) -> dict:
        return facts_mod.build(facts_mod.items_from_folder(FIXTURES / "slow" / name / "bundle"), "bundle")[0]

    assert window.still_ambiguous(facts("slow_rank"), 10.0) == ""
    assert window.still_ambiguous(facts("rank0_exclusive_window"), 2.0) != ""


# -- the early slice's gate and its held artifacts --------------------------------------------------

def _procs_bundle(tmp_path: Path, switches: list[tuple[int, int]]) -> Bundle:
    """Two process readings of 4 ranks; ``switches``: (first, second) voluntary switches per rank."""
    b = Bundle.create(tmp_path / "b", {"type": "live"})
    for snap in (0, 1):
        procs = [{"pid": 100 + r, "rank": r, "role": "rank", "parent": 99, "state": "S", "cpu_s": 1.0 + snap,
                  "threads": 4, "main_cpu_s": 1.0, "main_voluntary_switches": sw[snap], "rss_mb": 10.0,
                  "wchan": "", "task_states": {"S": 4}} for r, sw in enumerate(switches)]
        doc = {"schema": "mldoctor.procs/1", "host": "h", "snapshot": snap, "t": 10.0 + snap, "wall": 0.0,
               "layout": {"world_size": 4, "local_world_size": 4}, "procs": procs}
        b.add_artifact(f"hosts/h/procs/procs-snap{snap}.json", json.dumps(doc), "procs", host="h")
    return b


def test_early_slice_starts_only_when_most_ranks_wake(tmp_path):
    assert window.progress_likely(_procs_bundle(tmp_path / "a", [(10, 60), (10, 70), (10, 50), (10, 10)]))
    assert not window.progress_likely(_procs_bundle(tmp_path / "b", [(10, 60), (10, 10), (10, 11), (10, 10)]))
    assert not window.progress_likely(Bundle.create(tmp_path / "c" / "b", {"type": "live"}))


def test_held_artifacts_enter_the_bundle_only_when_kept(tmp_path):
    b = Bundle.create(tmp_path / "b", {"type": "live"})
    ctx = _Context(b, "h", [], {}, 5.0, "samples", 2)
    ctx.held = []
    ctx.add("samples-r2-rank0.txt", "main;f (x.py:1) 5\n", rank=0)
    assert ctx.written == 1 and not b.manifest["artifacts"]
    ctx.commit()
    assert [a["path"] for a in b.manifest["artifacts"]] == ["hosts/h/samples/samples-r2-rank0.txt"]
    assert ctx.written == 1


# -- live -----------------------------------------------------------------------------------------

def _diagnose(pid: int, out: Path, *extra: str) -> tuple[dict, str, float]:
    """``mldoctor diagnose`` with progress lines (no --json): the report comes from --out."""
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "doctor.cli", "diagnose", "--pid", str(pid), "--out", str(out),
                          *extra], capture_output=True, text=True, timeout=240)
    wall = time.perf_counter() - t0
    assert res.returncode in (0, 1), res.stderr
    found = sorted(out.rglob("report.json"))
    assert found, res.stderr
    return json.loads(found[-1].read_text()), res.stderr, wall


@pytest.mark.live
def test_healthy_8_ranks_fast_verdict_with_at_most_one_short_slice():
    from doctor.live import demo

    with tempfile.TemporaryDirectory(prefix="mldoctor-fast-healthy-") as tmp:
        proc, log = demo.start("healthy", Path(tmp), nproc=8)
        try:
            assert demo.wait_until_stuck(proc, log, "healthy") == "running"
            report, err, _wall = _diagnose(proc.pid, Path(tmp) / "out")
        finally:
            demo.stop(proc)
    assert report["verdict"]["state"] == "healthy", report["verdict"]
    serious = [f for f in report["findings"] if f["severity"] in ("critical", "high", "medium")]
    assert serious == [], serious
    runs = [p for p in report["probes"] if p["name"] == "samples"]
    assert len(runs) <= 1, runs  # never extended: a healthy job has no rank that never leaves its wait
    steps = report["trace"]
    assert not any("window extended" in s["detail"] for s in steps)
    if any(s["action"] == "window" for s in steps):  # a slice was started: stderr says so, with its length
        assert f"sampling window: {window.MIN_SLICE:g} s of samples" in err, err
    # the verdict never waits out a long window: what was sampled is one short slice at most
    sampled = (report.get("facts") or {}).get("samples") or {}
    assert float(sampled.get("duration_s") or 0.0) <= window.MIN_SLICE, sampled.get("window")


@pytest.mark.live
def test_straggler_still_slow_with_the_adaptive_window():
    from doctor.live import demo
    from doctor.scenarios import SCENARIOS

    sc = SCENARIOS["slow_rank"]
    with tempfile.TemporaryDirectory(prefix="mldoctor-fast-slow-") as tmp:
        proc, log = demo.start("slow_rank", Path(tmp))
        try:
            assert demo.wait_until_stuck(proc, log, "slow_rank") == "running"
            time.sleep(2.0)  # past the fault step: rank 3 is the straggler now
            report, err, _wall = _diagnose(proc.pid, Path(tmp) / "out")
        finally:
            demo.stop(proc)
    assert report["verdict"]["state"] == "slow", report["verdict"]
    top = report["findings"][0]
    assert top["cause"] in (sc.cause, *sc.also_acceptable) and top["ranks"] == sc.culprit_ranks, top
    assert "sampling window:" in err, err
