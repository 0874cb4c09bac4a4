"""Families harvested from outside torch (vLLM, Kubernetes/containers, Ray, GPU-kernel libraries).

The coverage test checks that each template's example yields its kind; these tests check what the
coverage number cannot: that the new signatures do not turn neighbouring lines into the wrong
cause (docker's "OOMKilled": false, Ray's OutOfMemoryError read as a GPU OOM, a full /dev/shm read
as a full disk), that a bare exit 137 stays a low lead while an OOM report decides, and that a
whole log reaches the right finding through the real scanner and rules.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from doctor.probes.logs import coverage as C
from doctor.probes.logs.scan import scan_file
from typer.testing import CliRunner

from doctor.cli import app

NEW_FAMILIES = ("vllm", "kubernetes", "ray", "bitsandbytes", "flash_attn", "xformers", "triton", "fsdp_dcp")


def _kinds(tmp_path: Path, line: str) -> set[str]:
    """The kinds the real scanner makes of one line read from a file."""
    path = tmp_path / "one.log"
    path.write_text(line + "\n", encoding="utf-8")
    return {e["kind"] for e in scan_file(path, "one.log").events}


def _diagnose(folder: Path) -> dict:
    res = CliRunner().invoke(app, ["diagnose", "--from", str(folder), "--json"])
    return json.loads(res.stdout)


def _causes(report: dict) -> dict[str, dict]:
    return {f["cause"]: f for f in report["findings"]}


def test_new_families_are_harvested_and_fully_covered() -> None:
    rows = {r["family"]: r for r in C.coverage_rows()}
    for fam in NEW_FAMILIES:
        assert fam in rows, fam
        assert not rows[fam]["uncovered"], (fam, rows[fam]["uncovered"])
    for fam in C.families():
        if fam.name in NEW_FAMILIES:
            for t in fam.templates:
                assert t.fault is False or t.kind, (fam.name, t.template)  # every fault names its kind
                assert t.fault or t.note, (fam.name, t.template)  # informational ones say why


@pytest.mark.parametrize("line,want,not_want", [
    ('            "OOMKilled": false,', set(), {"host_oom_kill"}),
    ('            "OOMKilled": true,', {"host_oom_kill"}, set()),
    ("ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
     {"host_oom_kill"}, {"gpu_oom"}),
    ("OSError: [Errno 28] No space left on device: '/dev/shm/psm_1a2b3c4d'", {"shm_exhausted"}, {"disk_full"}),
    ("OSError: [Errno 28] No space left on device: '/checkpoints/step_1000/model.pt'", {"disk_full"}, {"shm_exhausted"}),
    ("      Exit Code:    137", {"container_sigkill"}, {"host_oom_kill"}),
    ("      Exit Code:    1", set(), {"container_sigkill", "native_crash", "signal_received"}),
    ("ERROR [multiproc_executor.py:154] Worker proc VllmWorker-2 died unexpectedly (exit code: -9), shutting down executor.",
     {"launcher_failed"}, {"host_oom_kill"}),
    ("Warning  Evicted  3m  kubelet  The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: 9Gi.",
     {"disk_full"}, {"host_oom_kill"}),
    ("The node with node id: 3a4b and address: 10.0.0.7 and node name: 10.0.0.7 has been marked dead because the detector "
     "has missed too many heartbeats from it. This can happen when a \t(1) raylet crashes unexpectedly (OOM, etc.)",
     {"launcher_failed"}, {"host_oom_kill"}),
    ("RuntimeError: CUDART error: invalid argument", set(), {"cuda_error"}),
    ("slurmstepd: error: *** STEP 4242.0 ON node07 CANCELLED AT 2024-03-01T03:12:44 DUE TO TASK FAILURE ***",
     {"launcher_teardown"}, {"external_kill"}),
    ("slurmstepd: error: *** STEP 4242.0 ON node07 CANCELLED AT 2024-03-01T03:12:44 DUE TO TIME LIMIT ***",
     {"external_kill"}, {"launcher_teardown"}),
    ("slurmstepd: error: StepId=4242.0 exceeded memory limit (68719476736 > 64424509440), being killed",
     {"host_oom_kill"}, set()),
    ("UserWarning: Forward order differs from that of the first iteration on rank 0. Collectives are unchecked "
     "and may give incorrect results or hang.", set(), {"collective_mismatch"}),
    ("RuntimeError: FlashAttention forward only supports head dimension at most 256", set(), {"cuda_setup"}),
])
def test_lines_map_to_their_kind_and_not_the_neighbouring_one(tmp_path: Path, line: str, want: set[str],
                                                            not_want: set[str]) -> None:
    kinds = _kinds(tmp_path, line)
    assert want <= kinds, kinds
    assert not (kinds & not_want), kinds


def test_vllm_kv_cache_failure_is_a_gpu_oom(tmp_path: Path) -> None:
    (tmp_path / "vllm.log").write_text(textwrap.dedent("""\
        INFO 03-11 08:10:01 [gpu_model_runner.py:2001] Model loading took 135.2 GiB and 41.3 seconds
        (EngineCore_DP0 pid=2311) ERROR 03-11 08:10:40 [core.py:1757] EngineCore failed to start.
        (EngineCore_DP0 pid=2311) Traceback (most recent call last):
        (EngineCore_DP0 pid=2311)   File "/usr/lib/python3/site-packages/vllm/v1/engine/core.py", line 1740, in run_engine_core
        (EngineCore_DP0 pid=2311)     engine_core = EngineCoreProc(*args, **kwargs)
        (EngineCore_DP0 pid=2311) ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.
        RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': 1}
        """), encoding="utf-8")
    report = _diagnose(tmp_path)
    causes = _causes(report)
    assert "gpu_oom" in causes and report["findings"][0]["cause"] == "gpu_oom"
    assert "host_oom" not in causes


def test_exit_137_alone_is_a_low_lead_and_oomkilled_decides(tmp_path: Path) -> None:
    describe = textwrap.dedent("""\
        Name:             trainer-0
        Containers:
          trainer:
            Last State:     Terminated
              Reason:       {reason}
              Exit Code:    137
            Restart Count:  3
        """)
    bare, oom = tmp_path / "bare", tmp_path / "oom"
    for folder, reason in ((bare, "Error"), (oom, "OOMKilled")):
        folder.mkdir()
        (folder / "describe.txt").write_text(describe.format(reason=reason), encoding="utf-8")
    lead = _causes(_diagnose(bare))
    assert lead["host_oom"]["rule"] == "PY008" and lead["host_oom"]["severity"] == "low"
    sure = _causes(_diagnose(oom))
    assert sure["host_oom"]["rule"] != "PY008" and sure["host_oom"]["severity"] in ("high", "critical")


def test_docker_inspect_of_a_clean_exit_is_not_an_oom(tmp_path: Path) -> None:
    (tmp_path / "inspect.json").write_text(textwrap.dedent("""\
        [
            {
                "Id": "5f2c9a0e1b7d",
                "State": {
                    "Status": "exited",
                    "Running": false,
                    "OOMKilled": false,
                    "Dead": false,
                    "ExitCode": 0
                }
            }
        ]
        """), encoding="utf-8")
    assert "host_oom" not in _causes(_diagnose(tmp_path))


def test_kubernetes_memory_eviction_is_host_oom(tmp_path: Path) -> None:
    (tmp_path / "events.txt").write_text(
        "LAST SEEN   TYPE      REASON    OBJECT              MESSAGE\n"
        "3m          Warning   Evicted   pod/trainer-0       The node was low on resource: memory. Threshold quantity: "
        "100Mi, available: 52Ki. Container trainer was using 61Gi, request is 8Gi, has larger consumption of memory.\n",
        encoding="utf-8")
    found = _causes(_diagnose(tmp_path))
    assert "host_oom" in found and found["host_oom"]["severity"] in ("high", "critical")


def test_fsdp_order_mismatch_names_both_ranks(tmp_path: Path) -> None:
    (tmp_path / "rank1.log").write_text(
        "[rank1]: Traceback (most recent call last):\n"
        "[rank1]:   File \"/work/train.py\", line 88, in <module>\n"
        "[rank1]:     loss = model(batch).sum()\n"
        "[rank1]: RuntimeError: Forward order differs across ranks: rank 0 is all-gathering 12 parameters "
        "while rank 1 is all-gathering 11 parameters\n", encoding="utf-8")
    found = _causes(_diagnose(tmp_path))
    assert "collective_mismatch" in found
    assert set(found["collective_mismatch"]["ranks"]) <= {0, 1}


def test_exit_137_after_a_failed_liveness_probe_names_the_kubelet(tmp_path: Path) -> None:
    (tmp_path / "describe.txt").write_text(textwrap.dedent("""\
        Containers:
          trainer:
            Last State:     Terminated
              Reason:       Error
              Exit Code:    137
        Events:
          Warning  Unhealthy  71s (x6 over 3m21s)  kubelet  Liveness probe failed: HTTP probe failed with statuscode: 500
          Normal   Killing    71s (x2 over 3m1s)   kubelet  Container trainer failed liveness probe, will be restarted
        """), encoding="utf-8")
    report = _diagnose(tmp_path)
    assert not any(f["rule"] == "PY008" for f in report["findings"])
    assert "host_oom" not in _causes(report)

