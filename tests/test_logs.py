"""The logs evidence kind: the signature library, streaming scans, what a log file tells about
which rank failed first, the rules built on it, and live collection of the job's own logs.

Evidence is real: tests/fixtures/logs/<case> (real torchrun jobs on CPU and on an H200, each with
a README saying how), tests/fixtures/evidence and tests/fixtures/gpu (other kinds' captures,
which carry launcher logs too). Processes started here are killed and checked gone.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from doctor.probes import logs as L
from doctor.probes.common.text import strip_prefixes
from doctor.probes.logs import facts as F
from doctor.probes.logs import library as LB
from doctor.probes.logs import scan as S
from typer.testing import CliRunner

from doctor.cli import app
from doctor.engine import facts as facts_mod
from doctor.engine.ruleset import load_ruleset
from doctor.engine.ruletest import run_rule_tests
from doctor.evidence.bundle import Bundle
from doctor.evidence.contract import CollectContext, Hints, ProbeSkipped, RankProcess, Sample
from doctor.evidence.errors import EvidenceError

from .conftest import FIXTURES, diagnose_json

LOGS = FIXTURES / "logs"
EV = FIXTURES / "evidence"
PROBE = L.PROBE
MY_RULES = [f"CRASH00{i}" for i in range(1, 8)] + [f"NET00{i}" for i in range(2, 8)] + \
    [f"LOG00{i}" for i in range(1, 7)]


def logs_facts(path: Path) -> dict:
    facts, _ = facts_mod.build(facts_mod.items_from_folder(path), "loose")
    return facts


def scan_lines(tmp_path: Path, lines: list[str], name: str = "x.log") -> S.Scan:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return S.scan_file(p, name)


# -- the signature library ------------------------------------------------------------------

LIB = S.library()


def test_library_loads_with_unique_ids_and_examples():
    ids = [s.id for s in LIB.signatures]
    assert len(ids) == len(set(ids)) and len(ids) >= 80
    for s in LIB.signatures:
        assert s.examples, f"{s.id} has no example"
        assert s.means and s.source, s.id
    # Loaded with yaml.safe_load: a YAML tag that would build an object is refused.
    with pytest.raises(Exception):  # noqa: B017 - yaml's ConstructorError
        LB._load_file("evil.yaml", "signatures: !!python/object/apply:os.system ['true']")


@pytest.mark.parametrize("sig", LIB.signatures, ids=lambda s: s.id)
def test_every_example_matches_its_signature_through_the_scanner(sig, tmp_path):
    for ex in sig.examples:
        body, _ = strip_prefixes(ex)
        assert sig in LIB.candidates(body), f"prefilter drops: {ex!r}"
        assert sig.regex.search(body), f"regex misses: {ex!r}"
        scan = scan_lines(tmp_path, [ex])
        assert scan.sig_counts.get(sig.id, 0) + sum(  # a sibling signature of the same kind may win the line
            scan.sig_counts.get(o.id, 0) for o in LIB.signatures if o.kind == sig.kind and o.id != sig.id) >= 1, ex
        assert scan.counts.get(sig.kind) == 1, (ex, scan.counts)


def test_named_groups_become_typed_fields(tmp_path):
    wd = next(s for s in LIB.signatures if s.id == "watchdog_timeout")
    scan = scan_lines(tmp_path, list(wd.examples))
    ev = scan.events[0]
    assert ev["rank"] == 3 and ev["fields"]["seq"] == 80078 and ev["fields"]["op"] == "ALLREDUCE"
    assert ev["fields"]["timeout_ms"] == 600000 and ev["fields"]["ran_ms"] == 600013
    assert scan.waits[1]["rank"] == 7 and scan.waits[1]["numel_in"] is None


def test_watchdog_lines_with_one_seq_and_two_ops_are_a_mismatch(tmp_path):
    wd = next(s for s in LIB.signatures if s.id == "watchdog_timeout")
    # The library's own examples: rank 3 ALLREDUCE and rank 7 BROADCAST at SeqNum 80078
    # (NVIDIA/nccl#1409 as quoted in hang-diagnosis-anchors.md).
    scan = scan_lines(tmp_path, list(wd.examples[:2]))
    summary = F._wait_summary(scan.waits)
    assert summary["same_seq_ops_differ"] and summary["seqs"] == [80078] and summary["ranks"] == [3, 7]
    assert 1.0 <= summary["max_ran_ratio"] < 1.01


# -- sniffing: logs, and the files other kinds own ------------------------------------------

def _sniff(path: Path) -> bool:
    return PROBE.sniff(Sample.read(path))


@pytest.mark.parametrize("rel", [
    "logs/worker_kill/torchrun.log", "logs/host_oom/dmesg.txt", "logs/nccl_healthy/torchrun.log",
    "logs/worker_kill_rankfiles/rank1.stderr.log", "logs/recompile/torchrun.log",
    "evidence/healthy/torchrun.log", "gpu/h200/stuck/torchrun.log",
])
def test_sniff_claims_real_logs(rel):
    assert _sniff(FIXTURES / rel)


def test_sniff_leaves_other_kinds_alone(tmp_path):
    others = [EV / "healthy" / "pyspy-rank0.txt", EV / "healthy" / "env-rank0.txt",
              next((EV / "extra_collective" / "fr").glob("*.pkl")), LOGS / "jobs.py", LOGS / "README.md",
              FIXTURES / "metrics" / "stable" / "metrics.csv", FIXTURES / "metrics" / "divergence" / "metrics.jsonl"]
    for p in others:
        assert p.exists(), p
        assert not _sniff(p), p
    junk = tmp_path / "blob.log"
    junk.write_bytes(os.urandom(20000))
    assert not _sniff(junk)


def _kinds(path: Path) -> dict[str, int]:
    return S.scan_file(path, path.name).counts


@pytest.mark.parametrize("rel", ["logs/shm_small/torchrun.log", "logs/worker_kill/torchrun.log",
                                 "logs/nccl_bad_ifname/torchrun.log", "logs/gpu_oom/torchrun.log"])
def test_messages_wrapped_at_a_terminal_width_are_still_recognized(rel, tmp_path):
    """Pasted into a ticket or a notebook, an error line arrives wrapped; the real log's error
    lines are re-wrapped at 60 columns (prefixes stripped) and must show the same kinds."""
    src = FIXTURES / rel
    want = {k for k, n in _kinds(src).items() if n}
    lines = []
    for ln in src.read_text(errors="replace").splitlines():
        body, _ = strip_prefixes(ln)
        if S.library().candidates(body):  # an evidence line: paste it wrapped
            lines += textwrap.wrap(body, 60, break_on_hyphens=False)
    pasted = tmp_path / "pasted.txt"
    pasted.write_text("\n".join(lines) + "\n")
    assert _sniff(pasted)
    got = {k for k, n in _kinds(pasted).items() if n}
    assert want <= got | {"nccl_init_start", "nccl_init_complete", "nccl_transport", "nccl_version", "nccl_net",
                          "nccl_bootstrap", "nccl_warn"}, want - got  # NCCL INFO/WARN lines start records of their own
    assert got - want <= {"nccl_warn"}, got - want


def test_joining_lines_adds_nothing_to_real_unwrapped_logs(monkeypatch):
    """Every real log we have, scanned with and without the soft-wrap joining: same counts."""
    logs = sorted(p for p in FIXTURES.rglob("*") if p.is_file() and p.suffix in (".log", ".txt")
                  and _sniff(p))
    assert len(logs) > 15
    with_join = {p: S.scan_file(p, p.name).sig_counts for p in logs}
    monkeypatch.setattr(S, "wraps", lambda prev, cur: False)
    monkeypatch.setattr(L.scan, "wraps", lambda prev, cur: False)
    for p in logs:
        assert S.scan_file(p, p.name).sig_counts == with_join[p], p


def test_empty_or_unreadable_log_is_one_line_error(tmp_path):
    empty = tmp_path / "rank0.log"
    empty.write_text("")
    with pytest.raises(EvidenceError, match="empty log"):
        PROBE.parse(empty, "rank0.log", Hints())
    with pytest.raises(EvidenceError, match="cannot read"):
        PROBE.parse(tmp_path / "gone.log", "gone.log", Hints())


# -- what the scans say ---------------------------------------------------------------------

def test_failure_summary_exits_and_cascade():
    lf = logs_facts(LOGS / "worker_kill")["logs"]
    exits = {x["rank"]: x for x in lf["exited_ranks"]}
    assert exits[1]["root_cause"] and exits[1]["exitcode"] == 1 and not exits[1]["cascade"]
    assert exits[0]["signal"] == "SIGTERM" and exits[0]["cascade"]
    assert lf["dead_ranks"] == [1] and lf["waiting_ranks"] == [0]
    assert lf["first_failure"]["kind"] == "dataloader_worker_died" and lf["first_failure"]["rank"] == 1
    assert lf["by_rank"]["1"]["state"] == "dead" and "killed by signal" in lf["by_rank"]["1"]["exception"]


def test_rank_that_died_of_a_timeout_is_not_a_culprit():
    lf = logs_facts(LOGS / "timeout_short")["logs"]
    exit1 = next(x for x in lf["exited_ranks"] if x["rank"] == 1)
    assert exit1["root_cause"] and exit1["cascade"] and "waiting for peers" in exit1["why"]
    assert lf["dead_ranks"] == [] and lf["long_work"][0]["rank"] == 0
    assert lf["waits"][0]["backend"] == "gloo" and lf["waits"][0]["timeout_ms"] == 5000


def test_oom_kill_in_dmesg_is_mapped_to_its_rank_by_pid():
    lf = logs_facts(LOGS / "host_oom")["logs"]
    kill = lf["by_kind"]["host_oom_kill"][0]
    assert kill["rank"] == 1 and kill["file"] == "dmesg.txt" and kill["fields"]["comm"] == "python"
    assert lf["first_failure"]["kind"] == "host_oom_kill"
    assert next(x for x in lf["exited_ranks"] if x["rank"] == 1)["signal"] == "SIGKILL"


def test_first_failure_prefers_the_specific_error_over_the_exit():
    lf = logs_facts(EV / "order_mismatch")["logs"]
    assert lf["first_failure"]["kind"] == "collective_mismatch"
    assert lf["mismatch"][0]["sig"] == "gloo_size_mismatch"


def test_first_failure_orders_by_time_beyond_the_window():
    early = {"priority": 50, "ts": 1000.0, "line": 9, "_fi": 1}
    late_but_specific = {"priority": 10, "ts": 1000.0 + F.FIRST_FAILURE_WINDOW_S + 5, "line": 1, "_fi": 0}
    close_and_specific = {"priority": 10, "ts": 1002.0, "line": 1, "_fi": 0}
    assert F._pick_first([late_but_specific, early]) is early
    assert F._pick_first([close_and_specific, early]) is close_and_specific


def test_nested_prefixes_interleaved_tracebacks_and_detail_culprit():
    lf = logs_facts(LOGS / "recompile")["logs"]
    assert lf["compile"]["recompiles"] >= 8 and lf["compile"]["limit_hits"] == 2
    assert {e["rank"] for e in lf["by_kind"]["recompile_limit"]} == {0, 1}  # "[default1]:[rank1]:V..."
    lf = logs_facts(LOGS / "detail_mismatch")["logs"]
    tbs = {t["rank"]: t for t in lf["tracebacks"] if t["rank"] is not None}
    assert sorted(tbs) == [0, 1, 2] and all(t["exc_type"] == "RuntimeError" for t in tbs.values())
    assert lf["mismatch_culprits"] == [1]


def test_nccl_lines_hosts_versions_and_duplicate_gpu():
    lf = logs_facts(LOGS / "nccl_shared_gpu")["logs"]
    assert lf["nccl"]["versions"]["vm"] == ["2.28.9"] and lf["nccl"]["nets"] == ["Socket"]
    assert lf["nccl"]["ifaces"] == ["eth0"]
    assert lf["duplicate_gpu"][0]["ranks"] == [0, 1] and lf["duplicate_gpu"][0]["host"] == "vm"
    lf = logs_facts(LOGS / "nccl_bad_ifname")["logs"]
    ev = lf["by_kind"]["net_interface_missing"][0]
    assert ev["host"] == "vm" and ev["rank"] == 0 and ev["time"] == "2026-12-02 13:46:52"


def test_init_timeout_names_the_rank_that_never_arrived():
    lf = logs_facts(LOGS / "store_barrier")["logs"]
    assert lf["init_timeouts"][0]["world_size"] == 2 and lf["init_timeouts"][0]["joined"] == 1
    assert lf["init_missing_ranks"] == [1]


def test_event_text_is_scrubbed(tmp_path):
    token = "hf_" + "S" * 30
    scan = scan_lines(tmp_path, [f"node07:2912:3010 [0] NCCL WARN Connect to 10.0.0.8<45123> failed : "
                                 f"Connection refused (auth token={token})"])
    assert scan.counts["net_connect_failed"] == 1
    assert all(token not in e["text"] for e in scan.events)


def test_streaming_a_2gb_sparse_log_keeps_memory_flat(tmp_path):
    """A 2 GiB file (real lines, a 2 GiB hole of NULs - what a crashed node's log can hold -,
    real lines after it) through the whole facts pipeline, in a child process whose peak RSS is
    measured."""
    big = tmp_path / "rank1.log"
    head = (LOGS / "timeout_short" / "torchrun.log").read_bytes()
    tail = (LOGS / "gpu_oom" / "torchrun.log").read_bytes()
    with open(big, "wb") as fh:
        fh.write(head)
        fh.truncate(2 * 2**30)
        fh.seek(0, os.SEEK_END)
        fh.write(b"\n" + tail)
    code = textwrap.dedent(r"""
        import json, re, sys
        from pathlib import Path
        from doctor.engine import facts
        f, _ = facts.build(facts.items_from_folder(Path(sys.argv[1])), "loose")
        # VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec, so a child started by a big
        # parent (pytest after an in-process torch import) would report the parent's size
        hwm = int(re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1))
        print(json.dumps({"rss_mb": hwm / 1024,
                          "logs": f.get("logs", {}), "errors": f["evidence"]["errors"]}))
    """)
    try:
        res = subprocess.run([sys.executable, "-c", code, str(big)], capture_output=True, text=True, timeout=300)
    finally:
        big.unlink()
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    assert out["errors"] == []
    assert out["rss_mb"] < 200, out["rss_mb"]
    lf = out["logs"]
    assert lf["counts"]["gloo_timeout"] == 1 and lf["counts"]["gpu_oom"] == 1  # before and after the hole
    assert lf["first_failure"]["kind"] == "gpu_oom"


@pytest.mark.parametrize("gap", [b"\n", b""], ids=["nul_hole_then_line", "nul_hole_inside_line"])
def test_a_run_of_nuls_before_an_oom_line_does_not_hide_it(gap, tmp_path):
    """Issue 18 (#13): a hole of NULs before a CUDA OOM line (a crashed node's unflushed pages,
    or a writer that kept its offset over a truncated log) left the file unclaimed and the
    verdict healthy. Whether or not a newline ends the hole, the OOM line is found."""
    oom = next(ln for ln in (LOGS / "gpu_oom" / "torchrun.log").read_bytes().splitlines()
               if b"torch.OutOfMemoryError: CUDA out of memory" in ln)
    log = tmp_path / "torchrun.log"
    log.write_bytes(b"\0" * 100000 + gap + oom + b"\n")
    assert _sniff(log)
    lf = logs_facts(tmp_path)["logs"]
    assert lf["counts"].get("gpu_oom") == 1 and lf["first_failure"]["kind"] == "gpu_oom"
    assert lf["first_failure"]["rank"] == 1  # the [rank1]: prefix after the hole is still read
    res = CliRunner().invoke(app, ["diagnose", "--from", str(tmp_path), "--json"])
    report = json.loads(res.stdout)
    assert report["verdict"]["state"] != "healthy" and report["findings"][0]["cause"] == "gpu_oom"


# -- rules and the verdict ------------------------------------------------------------------

def test_log_rules_pass_their_cases():
    ruleset = load_ruleset()
    ids = {r.id for r in ruleset.rules}
    assert set(MY_RULES) <= ids
    results = [r for rid in MY_RULES for r in run_rule_tests(ruleset, rid)]
    bad = [f"{r.rule} {r.name}: {r.detail}" for r in results if not r.ok]
    assert not bad, bad
    for rid in MY_RULES:
        kinds = {r.detail.split()[0] for r in results if r.rule == rid}
        assert {"fired", "not_fired"} <= kinds, rid


CASES = [
    ("logs/worker_kill", "host_oom", [1]),  # a SIGKILLed worker, no kernel log: the OOM killer is the usual sender
    ("logs/size_mismatch", "collective_mismatch", []),
    ("logs/detail_mismatch", "collective_mismatch", [1]),
    ("logs/store_barrier", "init_hang", [1]),
    ("logs/timeout_short", "timeout_too_short", [0]),
    ("logs/host_oom", "host_oom", [1]),
    ("logs/shm_small", "shm_too_small", [0, 1]),
    ("logs/fd_limit", "resource_limit", None),
    ("logs/gpu_oom", "gpu_oom", [1]),
    ("logs/nccl_bad_ifname", "nccl_network_misconfig", [0]),
    ("logs/nccl_shared_gpu", "duplicate_gpu", [0, 1]),
    ("logs/recompile", "torch_compile_recompiles", [0, 1]),
    ("evidence/rank_exit", "rank_process_dead", [2]),
    ("logs/timeout_silent", "rank_outside_collective", [0]),
    ("logs/anomaly_nan", "loss_nan", []),
    ("logs/cuda_assert", "cuda_kernel_fault", [1]),
    ("logs/cuda_illegal", "cuda_kernel_fault", [1]),
]


@pytest.mark.parametrize("rel,cause,ranks", CASES, ids=[c[0] for c in CASES])
def test_diagnose_names_the_right_cause_first(rel, cause, ranks):
    res = CliRunner().invoke(app, ["diagnose", "--from", str(FIXTURES / rel), "--json"])
    assert res.exit_code == 1, res.output[-500:]
    report = json.loads(res.stdout)
    top = report["findings"][0]
    assert top["cause"] == cause, [(f["cause"], f["rule"]) for f in report["findings"]]
    if ranks is not None:
        assert top["ranks"] == ranks
    assert top["evidence"], top


@pytest.mark.parametrize("rel", ["logs/worker_kill", "logs/shm_small", "logs/timeout_silent",
                                 "logs/nccl_bad_ifname", "logs/host_oom"])
@pytest.mark.parametrize("style", ["cri", "docker", "kubectl-prefix"])
def test_container_runtime_prefixes_do_not_change_the_diagnosis(rel, style, tmp_path):
    """The same real logs as Kubernetes node logs (CRI), `docker logs --timestamps` and
    `kubectl logs --prefix` write them: every line gets the runtime's prefix."""
    def first(path: Path) -> list:
        report = json.loads(CliRunner().invoke(app, ["diagnose", "--from", str(path), "--json"]).stdout)
        return [(f["cause"], f["ranks"]) for f in report["findings"]][:2]

    pre = {"cri": "2026-12-02T13:31:{:02d}.123456789Z stderr F ", "docker": "2026-12-02T13:31:{:02d}.123456789Z ",
           "kubectl-prefix": "[pod/trainer-0/main] "}[style]
    out = tmp_path / rel.split("/")[1]
    out.mkdir()
    for src in (FIXTURES / rel).iterdir():
        if src.suffix in (".log", ".txt"):
            lines = src.read_text(errors="replace").splitlines()
            (out / src.name).write_text("".join(pre.format(i % 60) + ln + "\n" for i, ln in enumerate(lines)))
    assert first(out) == first(FIXTURES / rel)


@pytest.mark.parametrize("rel", ["logs/worker_kill", "logs/shm_small", "logs/timeout_silent", "logs/size_mismatch"])
def test_srun_label_prefixes_give_ranks(rel, tmp_path):
    """`srun --label` output: each rank's lines start with its task number ("1: ..."). The real
    torchrun logs are rewritten that way (their "[defaultN]:" tee prefix becomes "N: ", launcher
    lines get task 0's label) and must diagnose the same, ranks included."""
    def first(path: Path) -> list:
        report = json.loads(CliRunner().invoke(app, ["diagnose", "--from", str(path), "--json"]).stdout)
        return [(f["cause"], f["ranks"]) for f in report["findings"]][:2]

    out = tmp_path / "job"
    out.mkdir()
    lines = []
    for ln in (FIXTURES / rel / "torchrun.log").read_text(errors="replace").splitlines():
        m = re.match(r"\[default(\d+)\]:(.*)", ln)
        lines.append(f"{m.group(1)}: {m.group(2)}" if m else f"0: {ln}")
    (out / "slurm-4242.out").write_text("\n".join(lines) + "\n")
    assert first(out) == first(FIXTURES / rel)


def test_diagnose_cli_process_on_a_healthy_nccl_log():
    report = diagnose_json(LOGS / "nccl_healthy")
    assert report["findings"] == [] and report["verdict"]["state"] == "healthy"


# -- live collection ------------------------------------------------------------------------

JOB = r"""
import sys, time
print("step 0 loss 2.31 token=" + "hf_" + "L" * 34, flush=True)
print("x" * 5000, flush=True)
print("[rank0]: RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed. ", flush=True)
sys.stderr.write("stderr is a pipe\n"); sys.stderr.flush()
time.sleep(120)
"""


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie of ours counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
    except OSError:
        return True


def test_collect_reads_the_jobs_own_log_files(tmp_path):
    out = tmp_path / "job.out"
    extra = tmp_path / "nccl-node07.txt"
    extra.write_text((LOGS / "nccl_healthy" / "torchrun.log").read_text())
    with open(out, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-c", JOB], stdout=fh, stderr=subprocess.PIPE,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while "killed by signal" not in out.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        bundle = Bundle.create(tmp_path / "bundle")
        ctx = CollectContext(bundle, "node07", [RankProcess(proc.pid, 0, role="rank")],
                             {"logs": [str(extra)], "log_tail_bytes": 2000}, probe_name="logs")
        PROBE.collect(ctx)
        arts = {a["path"]: a for a in bundle.manifest["artifacts"]}
        mine = [a for a in arts.values() if a.get("pid") == proc.pid]
        assert len(mine) == 1 and mine[0]["rank"] == 0  # stdout is a file; stderr a pipe: skipped
        text = (tmp_path / "bundle" / mine[0]["path"]).read_text()
        assert "killed by signal" in text and "x" * 100 not in text[:10]  # tail, cut at a line start
        assert len(text.encode()) <= 2000
        assert any("nccl-node07" in p for p in arts)
        facts, _ = facts_mod.build(facts_mod.items_from_bundle(bundle), "bundle")
        assert facts["logs"]["by_kind"]["dataloader_worker_died"][0]["rank"] == 0
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    assert _gone(proc.pid)


def test_collect_skips_when_output_goes_to_pipes(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        ctx = CollectContext(Bundle.create(tmp_path / "b"), "h", [RankProcess(proc.pid, None, role="launcher")],
                             {}, probe_name="logs")
        with pytest.raises(ProbeSkipped, match="pipes or terminals"):
            PROBE.collect(ctx)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    assert _gone(proc.pid)


def test_collected_log_holds_no_secret(tmp_path):
    (tmp_path / "logs").mkdir()
    log = tmp_path / "logs" / "train.log"
    token = "hf_" + "T" * 34
    log.write_text(f"step 1 | WANDB_API_KEY={token}\nOSError: [Errno 24] Too many open files\n")
    bundle = Bundle.create(tmp_path / "b")
    ctx = CollectContext(bundle, "h", [], {"logs": [str(tmp_path / "logs")]}, probe_name="logs")
    PROBE.collect(ctx)
    written = "".join(p.read_text() for p in (tmp_path / "b").rglob("*.log"))
    assert "Too many open files" in written and token not in written
