"""SLURM: the ``slurm`` evidence kind, fragment merging, and ``diagnose --slurm-job`` on a real
two-node localhost cluster (munged + slurmctld + two slurmd, see tests/slurm_cluster.py).

The cluster tests run one real 2-node job (4 gloo ranks, 2 per node, one srun task per rank)
hung on global rank 3, which lives on node2: its main thread blocks on a lock its own
metrics thread holds (scenario lock_self; plain py-spy cannot see the lock, so the diagnosis
needs a follow-up round of native stacks on node2). The same job serves the all-nodes
diagnosis, the offline replay of its bundle, and the diagnosis with node2's slurmd stopped
(SIGSTOP: node2 cannot answer, like a hung node).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from doctor.probes import slurm as slurm_probe

from doctor.engine import facts as facts_mod
from doctor.evidence.bundle import Bundle
from doctor.evidence.contract import Hints
from doctor.evidence.errors import UserError
from doctor.live.slurm import FanOut, Merger, srun_command

from .conftest import FIXTURES, mldoctor
from .slurm_cluster import slurm_cluster, train_job_script  # noqa: F401 - the fixture

SLURM = FIXTURES / "slurm"


# -- the evidence kind (captured output of real jobs) --------------------------------------------
@pytest.mark.parametrize("expr, names", [
    ("node[1-2]", ["node1", "node2"]),
    ("gpu-a[01-03,7],login", ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-a7", "login"]),
    ("r[1-2]-n[08-09]", ["r1-n08", "r1-n09", "r2-n08", "r2-n09"]),
    ("node1", ["node1"]),
    ("(null)", []),
])
def test_expand_hostlist(expr, names):
    assert slurm_probe.expand_hostlist(expr) == names


def test_expand_hostlist_refuses_huge_or_bad_lists():
    with pytest.raises(ValueError):
        slurm_probe.expand_hostlist("n[0-99999999]")
    with pytest.raises(ValueError):
        slurm_probe.expand_hostlist("n[a-b]")


@pytest.mark.parametrize("text, secs", [("00:00:41", 41), ("1-02:03:04", 93784), ("05:30", 330),
                                        ("UNLIMITED", None), ("", None)])
def test_duration(text, secs):
    assert slurm_probe.duration_s(text) == secs


def _facts(path: Path) -> dict:
    facts, _ = facts_mod.build(facts_mod.items_from_folder(path), "loose")
    return facts


def test_running_job_record_from_scontrol_sacct_squeue():
    f = _facts(SLURM / "running_hung")
    s = f["slurm"]
    assert s["sources"] == ["sacct", "scontrol", "squeue"]
    assert (s["job_id"], s["state"], s["nodes"], s["node_list"]) == ("1", "RUNNING", 2, ["node1", "node2"])
    assert s["start_time"].startswith("20") and s["end_time"] == "" and s["run_time_s"] > 0
    assert s["time_limit_s"] == 0  # UNLIMITED
    assert [st["id"] for st in s["steps"]] == ["1.batch", "1.0"] and s["failed_steps"] == []
    assert f["evidence"]["errors"] == []


def test_failed_step_exit_codes():
    s = _facts(SLURM / "rank_exit")["slurm"]
    assert s["state"] == "FAILED" and (s["exit_status"], s["exit_signal"]) == (1, 0)
    step0 = next(st for st in s["steps"] if st["id"].endswith(".0"))
    assert (step0["state"], step0["exit_status"], step0["nodes"]) == ("FAILED", 1, ["node1", "node2"])
    assert {x["state"] for x in s["failed_steps"]} == {"FAILED"}


def test_node_fail_and_cancelled_states():
    assert "NODE_FAIL" in {x["state"] for x in _facts(SLURM / "node_fail")["slurm"]["failed_steps"]}
    s = _facts(SLURM / "cancelled")["slurm"]
    assert s["state"] == "CANCELLED" and s["failed_steps"] == []  # "CANCELLED by 0" is read as CANCELLED
    job_steps = [st for st in s["steps"] if st["name"] != "mldoctor-collect"]
    assert job_steps and all(st["exit_signal"] == 15 for st in job_steps)
    ours = [st for st in s["steps"] if st["name"] == "mldoctor-collect"]  # the capture's diagnoses
    assert {st["state"] for st in ours} == {"COMPLETED", "CANCELLED"}


def test_squeue_pending_reason(tmp_path):
    # squeue of the hung job's capture: job 2 waits behind job 1 with (Resources)
    rows = slurm_probe.parse_squeue((SLURM / "running_hung" / "squeue.txt").read_text())
    pending = [r for r in rows if r["ST"] == "PD"]
    assert pending and pending[0]["NODELIST(REASON)"] == "(Resources)"
    (tmp_path / "q.txt").write_text((SLURM / "running_hung" / "squeue.txt").read_text())
    (tmp_path / "sacct.txt").write_text("JobID|State\n2|PENDING\n")
    s = _facts(tmp_path)["slurm"]  # no fan-out record, no rank environment: the first job named
    assert (s["job_id"], s["state"], s["reason"], s["nodes"]) == ("2", "PENDING", "Resources", 2)


@pytest.mark.parametrize("name, text, needle", [
    ("sacct.txt", "JobID|JobName|State\n", "no job lines"),
    ("fanout.json", '{"schema": "mldoctor.slurm-fanout/1", ', "not valid JSON"),
    ("fanout2.json", '{"about": "mldoctor.slurm-fanout/1", "schema": "other/2"}', "not an mldoctor SLURM fan-out"),
])
def test_bad_slurm_files_are_one_line_errors(tmp_path, name, text, needle):
    (tmp_path / name).write_text(text)
    (tmp_path / "good").mkdir()
    for p in (SLURM / "running_hung").iterdir():
        (tmp_path / "good" / p.name).write_bytes(p.read_bytes())
    f = _facts(tmp_path)
    errs = [e for e in f["evidence"]["errors"] if e.startswith(name)]
    assert len(errs) == 1 and needle in errs[0] and "\n" not in errs[0]
    assert f["slurm"]["state"] == "RUNNING"  # the rest of the evidence still counts


def test_sacct_fixed_width_table_is_read():
    text = ("JobID           JobName  Partition      State ExitCode \n"
            "------------ ---------- ---------- ---------- -------- \n"
            "1            train-ext+      debug     FAILED      1:0 \n"
            "1.0                bash                FAILED      1:0 \n")
    rows = slurm_probe.parse_sacct(text)
    assert rows[1] == {"JobID": "1.0", "JobName": "bash", "Partition": "", "State": "FAILED", "ExitCode": "1:0"}


def test_sniff_by_content_not_name(tmp_path):
    from doctor.evidence.contract import Sample

    for src, dest in (("scontrol-show-job.txt", "a.log"), ("sacct.txt", "b.out"), ("squeue.txt", "c")):
        (tmp_path / dest).write_bytes((SLURM / "running_hung" / src).read_bytes())
        assert slurm_probe.PROBE.sniff(Sample.read(tmp_path / dest))
    (tmp_path / "env.txt").write_text("SLURM_JOB_ID=5\nSLURM_PROCID=0\nRANK=0\n")
    assert not slurm_probe.PROBE.sniff(Sample.read(tmp_path / "env.txt"))
    assert slurm_probe.PROBE.parse(tmp_path / "a.log", "a.log", Hints()).data["source"] == "scontrol"


# -- the fan-out pieces -------------------------------------------------------------------------
def test_srun_command_overlaps_and_writes_one_file_per_node(tmp_path):
    argv = srun_command("42", ["node1", "node2"], "node[1-2]", tmp_path, 20.0, ["mldoctor", "collect"])
    assert argv[:2] == ["srun", "--jobid=42"] and "--overlap" in argv
    assert {"--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=node[1-2]", "--mem=0"} <= set(argv)
    assert f"--output={tmp_path}/frag-%n.tar.gz" in argv and argv[-2:] == ["mldoctor", "collect"]
    assert not any(a.startswith("--gres") for a in argv)  # GRES stay shared through --overlap


def test_bad_job_id_is_a_one_line_usage_error():
    res = mldoctor("diagnose", "--slurm-job", "42;rm -rf /", "--json")
    assert res.returncode == 2 and "not a SLURM job id" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def _real_fragment(tmp_path: Path) -> bytes:
    """A fragment from the real ``mldoctor collect`` on a node with no process of the job."""
    res = subprocess.run([sys.executable, "-m", "doctor.cli", "collect", "--slurm-job", "999999999", "--out", "-"],
                         capture_output=True, timeout=120,
                         env={**os.environ, "SLURM_JOB_ID": "999999999", "SLURMD_NODENAME": "node7"})
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_merge_waits_for_a_whole_fragment_and_records_the_node(tmp_path):
    data = _real_fragment(tmp_path)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        assert any(m.name.endswith("manifest.json") for m in tar.getmembers())
    bundle = Bundle.create(tmp_path / "merged", {})
    merger = Merger(bundle)
    frag = tmp_path / "frag-0.tar.gz"
    frag.write_bytes(data[: len(data) // 2])  # still being written
    with pytest.raises(UserError):
        merger.add(frag, "node7")
    frag.write_bytes(data)
    node, _ = merger.add(frag, "node7")
    assert node == "node7"
    runs = bundle.manifest["probes"]
    assert any(r["name"] == "discover" and r["status"] == "failed" and r["host"] == "node7" for r in runs)
    rec = FanOut(["node7", "node8"], answered={"node7": 0.5}, missing={"node8": "did not answer within 5s"})
    doc = rec.record("42", 5.0, merger.seconds)
    assert doc["answered"] == ["node7"] and doc["missing"] == {"node8": "did not answer within 5s"}


def test_targets_node_filter_keeps_only_that_nodes_ranks():
    """With several slurmd on one host, node1's collector must not take node2's ranks."""
    from doctor.live import targets

    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "SLURM_JOB_ID": "77", "SLURMD_NODENAME": "node2"}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        found = []
        while time.monotonic() < deadline and not found:
            found = [r for j in targets.discover(slurm_job="77", node="node2") for r in j.ranks if r.pid == proc.pid]
            time.sleep(0.1)
        assert found and found[0].host == "node2"
        assert not [r for j in targets.discover(slurm_job="77", node="node1") for r in j.ranks if r.pid == proc.pid]
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


# -- the real cluster ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hung_job(slurm_cluster):  # noqa: F811
    """A 2-node job hung on rank 3 (node2) by a lock its own thread holds, past its fault."""
    job_id = slurm_cluster.sbatch(train_job_script("lock_self", 3))
    slurm_cluster.wait_state(job_id, "RUNNING", 60)
    log = slurm_cluster.root / "work" / f"slurm-{job_id}.out"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        if "rank 3 fault=lock_self injected" in text:
            break
        assert slurm_cluster.job_state(job_id) == "RUNNING", text[-2000:]
        time.sleep(0.3)
    else:
        pytest.fail("the job never reached its fault: " + log.read_text(errors="replace")[-2000:])
    time.sleep(1.0)  # ranks 0-2 reach the next step's all_reduce, where they will wait
    return job_id


def _no_collect_step_left(cluster, job_id: str) -> bool:  # noqa: ANN001
    """Our srun step ends with its collectors; the training step stays."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        steps = cluster.run("squeue", "-h", "-s", "-j", job_id, "-o", "%i %j").stdout
        if "mldoctor-collect" not in steps:
            return f"{job_id}.0 " in steps
        time.sleep(0.2)
    return False


def _diagnose(cluster, job_id: str, out: Path, *args: str, **env: str) -> tuple[dict, float]:
    t0 = time.monotonic()
    res = mldoctor("diagnose", "--slurm-job", job_id, "--json", "--out", str(out), *args, env={**cluster.env, **env},
                   timeout=180)
    took = time.monotonic() - t0
    assert res.returncode in (0, 1, 3), res.stderr
    return json.loads(res.stdout), took


@pytest.mark.slurm
@pytest.mark.live
def test_diagnose_slurm_job_names_cause_rank_and_node(slurm_cluster, hung_job, tmp_path):  # noqa: F811
    report, took = _diagnose(slurm_cluster, hung_job, tmp_path / "out")
    top = report["findings"][0]
    assert report["verdict"]["state"] == "hung"
    assert top["cause"] == "rank_stuck_in_lock", report["verdict"]
    assert top["ranks"] == [3] and top["hosts"] == ["node2"]
    follow = [s["detail"] for s in report["trace"] if s["action"] == "follow-up"]
    assert follow and "node2" in follow[0] and "[3]" in follow[0]  # native stacks, from node2 only
    assert "node2" in report["verdict"]["summary"]
    assert report["job"]["rank_hosts"] == {"0": "node1", "1": "node1", "2": "node2", "3": "node2"}
    collects = [s for s in report["trace"] if s["action"] == "fragment"]
    assert {s["detail"].split(":")[0] for s in collects} == {"node1", "node2"}  # + node2 again (follow-up)
    assert took < 60, f"{took:.1f}s: the default budget is 30 s (bench/bench_slurm.py measures the speed)"
    # The job is untouched: still RUNNING, its training step still there, ours gone.
    assert slurm_cluster.job_state(hung_job) == "RUNNING"
    assert _no_collect_step_left(slurm_cluster, hung_job)
    # The bundle replays offline to the same verdict, with SLURM's record in it.
    archive = next((tmp_path / "out").glob("mldoctor-*.tar.gz"))
    res = mldoctor("diagnose", "--from", str(archive), "--json")
    replay = json.loads(res.stdout)
    assert replay["findings"][0]["cause"] == "rank_stuck_in_lock" and replay["findings"][0]["hosts"] == ["node2"]
    bundle = Bundle.load(archive, workdir=tmp_path)
    kinds = {a["kind"] for a in bundle.manifest["artifacts"]}
    assert {"slurm", "stacks", "procs", "env"} <= kinds
    assert any(a["path"] == "slurm/fanout.json" for a in bundle.manifest["artifacts"])


@pytest.mark.slurm
@pytest.mark.live
def test_a_node_that_does_not_answer_is_reported_and_the_rest_diagnosed(slurm_cluster, hung_job, tmp_path):  # noqa: F811
    slurm_cluster.pause_node("node2")  # our own test daemon: node2 stops answering
    try:
        report, took = _diagnose(slurm_cluster, hung_job, tmp_path / "out", MLDOCTOR_SLURM_NODE_TIMEOUT="8")
    finally:
        slurm_cluster.resume_node("node2")
    missing = [p for p in report["probes"] if p["name"] == "collect" and p["status"] == "failed"]
    assert [p["host"] for p in missing] == ["node2"] and "did not answer within 8s" in missing[0]["reason"]
    silent = [f for f in report["findings"] if f["rule"] == "SLURM001"]
    assert silent and (silent[0]["cause"], silent[0]["hosts"], silent[0]["ranks"]) == ("rank_process_dead", ["node2"], [2, 3])
    assert report["findings"][0]["hosts"] == ["node2"], report["verdict"]
    assert report["job"]["ranks_seen"] == [0, 1]  # node1 was diagnosed
    assert report["verdict"]["state"] == "hung"
    assert took < 8 + 15, f"{took:.1f}s: the 8 s per-node deadline did not hold (default is 22 s)"
    assert slurm_cluster.job_state(hung_job) == "RUNNING"


@pytest.mark.slurm
@pytest.mark.live
def test_symptom_slow_records_a_sampling_window_on_every_node(slurm_cluster, hung_job, tmp_path):  # noqa: F811
    report, _ = _diagnose(slurm_cluster, hung_job, tmp_path / "out", "--symptom", "slow", "--duration", "2")
    srun = [s["detail"] for s in report["trace"] if s["action"] == "srun"]
    assert "--symptom slow --duration 2" in srun[0]
    bundle = Bundle.load(next((tmp_path / "out").glob("mldoctor-*.tar.gz")), workdir=tmp_path)
    sampled = {a["path"].split("/")[1] for a in bundle.manifest["artifacts"] if a["kind"] == "samples"}  # hosts/<node>/...
    assert {"node1", "node2"} <= sampled, sorted(sampled)
    # Sampled or not, a hung rank is a hung rank: the window of a stuck job does not turn it into "slow".
    assert report["findings"][0]["cause"] == "rank_stuck_in_lock" and report["findings"][0]["ranks"] == [3]
    assert slurm_cluster.job_state(hung_job) == "RUNNING"
