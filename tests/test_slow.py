"""Slow jobs: where the step time goes on every rank (samples evidence, time shares, stragglers).

Offline tests read bundles captured from real torchrun jobs (tests/fixtures/slow, made by
tests/fixtures/slow/capture.py). Live tests start the same real jobs, sample them with real
py-spy for a 4 s window, and check the diagnosis; one job per scenario serves all its checks.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from doctor.probes import samples as sp
from doctor.probes.samples import profiles
from doctor.probes.samples import timeshare as ts

from doctor.evidence.contract import Hints
from doctor.evidence.errors import EvidenceError
from doctor.scenarios import SCENARIOS, STEP_LINE_RE, job_command

from .conftest import FIXTURES, mldoctor

SLOW = FIXTURES / "slow"
SCENARIO_NAMES = ["slow_rank", "dataloader_heavy", "host_sync", "compile_recompile", "checkpoint_sync",
                  "cpu_oversubscription", "healthy"]
SERIOUS = ("critical", "high", "medium")


def _facts(path: Path) -> dict:
    res = mldoctor("facts", "--from", str(path))
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _report(path: Path, *extra: str) -> dict:
    res = mldoctor("diagnose", "--from", str(path), "--json", *extra)
    assert res.returncode in (0, 1), res.stderr
    return json.loads(res.stdout)


def _check_shares(samples: dict) -> None:
    """Every rank's shares are a partition of its samples: they add up to 100%."""
    assert samples["by_rank"], "no per-rank shares"
    for rank, s in samples["by_rank"].items():
        total = sum(s["shares"].values())
        assert 0.99 <= total <= 1.01, f"rank {rank}: shares add up to {total}"
        assert set(s["shares"]) == set(ts.CATEGORIES)
        assert s["samples"] >= ts.MIN_SAMPLES, f"rank {rank}: only {s['samples']} samples"


def _check_diagnosis(name: str, report: dict) -> None:
    sc = SCENARIOS[name]
    findings = report["findings"]
    if sc.cause is None:
        # HANG011 judges starvation from one snapshot, so it defers to a sampling window when
        # there is one: no rule may flag the healthy job.
        mine = [f for f in findings if f["severity"] in SERIOUS]
        assert mine == [], mine
        assert report["verdict"]["state"] != "hung", report["verdict"]
        return
    assert findings, f"{name}: nothing found; verdict {report['verdict']}"
    top = findings[0]
    assert top["cause"] in (sc.cause, *sc.also_acceptable), f"{name}: {top['cause']} ({top['summary']})"
    assert top["ranks"] == sc.culprit_ranks, f"{name}: ranks {top['ranks']}"
    assert report["verdict"]["state"] == sc.state, report["verdict"]


# --- parsing real py-spy output ------------------------------------------------------------------

def test_raw_profile_with_threads_keeps_the_main_thread():
    raw = SLOW / "slow_rank" / "bundle" / "hosts" / "vm" / "samples" / "samples-r1-rank3.txt"
    pf = sp.parse_raw(raw.read_text(), raw.name)
    assert pf.thread_ids and len(pf.threads) >= 2  # main + the job's helper threads
    main = sp.main_thread(pf)
    assert main is not None and main.name == "MainThread"
    inner = [s[0] for s in main.stacks]  # innermost first
    assert any(f[0].endswith("_augment") for f in inner), "rank 3's main thread should be in its dataset code"
    helpers = [t for t in pf.threads if t is not main]
    assert all(any(profiles._is_bootstrap(f) for s in t.stacks for f in s) for t in helpers)


def test_raw_and_speedscope_without_thread_ids_read_the_same_way():
    """py-spy record without --threads mixes the threads: bootstrap-rooted stacks are helpers."""
    fmt = SLOW / "formats"
    pf = sp.parse_raw((fmt / "healthy-rank0-nothreads.txt").read_text(), "x")
    assert not pf.thread_ids
    main = sp.main_thread(pf)
    assert main is not None and not any(profiles._is_bootstrap(f) for s in main.stacks for f in s)
    doc = json.loads((fmt / "healthy-rank0.speedscope.json").read_text())
    ss = sp.parse_speedscope(doc, "x")
    smain = sp.main_thread(ss)
    assert smain is not None and smain.name == "MainThread"
    for pfile in (pf, ss):
        prof = ts.merge_counts(sp.main_thread(pfile).stacks.items())
        summ = prof.summarize()
        assert summ["top"] == "collective" and summ["shares"]["collective"] > 0.5


def test_bad_sample_files_are_one_line_errors(tmp_path):
    bad = tmp_path / "garbage.txt"
    bad.write_text("hello world 3\nnot a sample\n")
    with pytest.raises(EvidenceError):
        sp.parse_raw(bad.read_text(), "garbage.txt")
    with pytest.raises(EvidenceError):
        sp.parse_speedscope({"profiles": "x"}, "bad.json")
    steps = tmp_path / "steps.jsonl"
    steps.write_text('{"step": 0, "step_time": 1.0}\n')
    with pytest.raises(EvidenceError):
        sp.parse_steps(steps, "steps.jsonl", Hints())
    # a cut-off raw file: the complete lines still count, the rest is noted
    src = (SLOW / "slow_rank" / "bundle" / "hosts" / "vm" / "samples" / "samples-r1-rank3.txt").read_text()
    cut = tmp_path / "cut-rank3.txt"
    cut.write_text(src[: len(src) // 2])
    folder = tmp_path / "loose"
    folder.mkdir()
    (folder / "cut-rank3.txt").write_text(src[: len(src) // 2])
    (folder / "junk-rank1.txt").write_bytes(b"\x00\x01binary")
    facts = _facts(folder)
    assert "3" in facts["samples"]["by_rank"]
    assert facts["evidence"]["errors"] == [] or all("\n" not in e for e in facts["evidence"]["errors"])


def test_source_lines_decide_host_sync_only_for_running_code():
    frames = (("per_sample_log", "/job/train.py", 370, False), ("main", "/job/train.py", 497, False))
    lines = {"/job/train.py:370": "logits = [v.item() for v in out[i]]"}
    assert ts.classify_stack(frames, lines) == ("host_sync", "item")
    waiting = (("all_reduce", "/v/torch/distributed/distributed_c10d.py", 3252, False),) + frames
    assert ts.classify_stack(waiting, {"/v/torch/distributed/distributed_c10d.py:3252": "work.wait()"})[0] == "collective"
    assert ts.classify_stack(frames, {"/job/train.py:370": "os.fsync(f.fileno())"})[0] == "io"
    assert ts.classify_stack(frames, {})[0] == "compute"


def test_periodic_slow_steps_survive_stray_slow_steps():
    times = [0.03] * 60
    for s in range(0, 60, 10):
        times[s] = 0.5
    times[23] = times[47] = 0.4  # a noisy neighbour
    res = ts.periodic_slow_steps(list(range(60)), times)
    assert res["periodic"] and res["interval"] == 10
    noisy = [0.03] * 60
    for s in (3, 11, 29, 30, 44, 58):
        noisy[s] = 0.5
    assert not ts.periodic_slow_steps(list(range(60)), noisy)["periodic"]


# --- real captured bundles -----------------------------------------------------------------------

@pytest.mark.parametrize("name", SCENARIO_NAMES)
def test_captured_bundle_diagnosis(name):
    bundle = SLOW / name / "bundle"
    _check_shares(_facts(bundle)["samples"])
    _check_diagnosis(name, _report(bundle))


def test_straggler_cause_is_its_input_pipeline():
    st = _facts(SLOW / "slow_rank" / "bundle")["samples"]["straggler"]
    assert st["detected"] and st["ranks"] == [3] and st["cause"] == "input"
    assert st["peers_collective"] > 0.8 and st["straggler_collective"] < 0.2


def test_sampling_window_tells_slow_from_hung():
    """Ranks waiting 99% of each step for a straggler look frozen in snapshots; in a window
    they leave the collective now and then, so the job is progressing, not hung."""
    facts = _facts(SLOW / "slow_rank" / "bundle")
    assert facts["samples"]["progress"] == "progressing"
    assert facts["job"]["observed_state"] == "progressing"


def test_sampling_window_on_a_hung_job_says_hung():
    """Rank 0 evaluating alone forever, ranks 1-3 never leaving barrier: moving is not progress."""
    bundle = SLOW / "rank0_exclusive_window" / "bundle"
    facts = _facts(bundle)
    assert facts["samples"]["progress"] == "hung" and facts["samples"]["frozen_ranks"] == [1, 2, 3]
    report = _report(bundle)
    assert report["verdict"]["state"] == "hung"
    assert report["findings"][0]["cause"] == "rank_outside_collective" and report["findings"][0]["ranks"] == [0]
    assert not [f for f in report["findings"] if f["cause"] == "straggler_rank"]


def test_step_timer_output_feeds_the_rules(tmp_path):
    torch = pytest.importorskip("torch")
    from doctor.torch import StepTimer

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            h = i
            for _ in range(20000):
                h = (h * 6364136223846793005 + 1) & 0xFFFFFFFFFFFFFFFF
            return torch.full((8,), float(h % 5)), i % 2

    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(Slow(), batch_size=8)
    with StepTimer(tmp_path / "steps-rank0.jsonl", rank=0) as timer:
        timer.attach(opt)
        for x, y in timer.wrap(loader):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    lines = (tmp_path / "steps-rank0.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["schema"] == "mldoctor.steps/1"
    recs = [json.loads(ln) for ln in lines[1:]]
    assert len(recs) == 8 and all(r["data_time"] <= r["step_time"] for r in recs)
    report = _report(tmp_path)
    assert any(f["rule"] == "PERF004" or "PERF004" in f.get("also_fired", []) for f in report["findings"])


# --- live ----------------------------------------------------------------------------------------

def _pyspy_on(pids: set[int]) -> list[int]:
    """py-spy processes still attached to one of ``pids`` (other sessions' py-spy runs on this
    shared host are none of this test's business)."""
    out = subprocess.run(["pgrep", "-f", "py-spy (dump|record)"], capture_output=True, text=True).stdout
    left = []
    for p in out.split():
        try:
            argv = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--pid" in argv and argv.index(b"--pid") + 1 < len(argv) and int(argv[argv.index(b"--pid") + 1]) in pids:
            left.append(int(p))
    return left


MIN_STEPS = {"compile_recompile": 10, "checkpoint_sync": 12}


@pytest.mark.live
@pytest.mark.parametrize("name", SCENARIO_NAMES)
def test_slow_scenario_diagnosed_live(name):
    from doctor.live import demo

    sc = SCENARIOS[name]
    with tempfile.TemporaryDirectory(prefix=f"mldoctor-slow-{name}-") as tmp:
        argv, env = job_command(name, extra_env={"MLDOCTOR_SCRATCH_DIR": str(Path(tmp) / "scratch")})
        log = Path(tmp) / "job.log"
        with open(log, "wb") as fh:
            proc = subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, cwd=tmp)
        try:
            want = MIN_STEPS.get(name, 2 * sc.nproc + 4)
            deadline = time.monotonic() + 240
            while True:
                text = log.read_text(errors="replace")
                done = max((int(m.group(2)) + 1 for m in STEP_LINE_RE.finditer(text)), default=0)
                if done >= want:
                    break
                assert proc.poll() is None, f"{name}: job exited early:\n{text[-2000:]}"
                assert time.monotonic() < deadline, f"{name}: only {done} steps in time"
                time.sleep(0.5)
            res = subprocess.run([sys.executable, "-m", "doctor.cli", "diagnose", "--pid", str(proc.pid),
                                  "--symptom", "slow", "--duration", "4", "--logs", str(log), "--json",
                                  "--out", str(Path(tmp) / "out")],
                                 capture_output=True, text=True, timeout=300)
            assert res.returncode in (0, 1), res.stderr
            report = json.loads(res.stdout)
        finally:
            known = demo.descendants(proc.pid)
            left_pyspy = _pyspy_on({proc.pid, *known})
            demo.stop(proc)
            assert demo.leftovers(proc, known) == [], "a process of the job survived"
        assert left_pyspy == [], "py-spy was left running on the job"
        probes = {p["name"]: p["status"] for p in report["probes"]}
        assert probes.get("samples") == "ok", [p for p in report["probes"] if p["name"] == "samples"]
        _check_shares(_facts(Path(tmp) / "out" / "bundle")["samples"])
        _check_diagnosis(name, report)
