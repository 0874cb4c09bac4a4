"""`mldoctor check`: host checks on this machine, the gloo path for real, GPU checks skipped (and
never counted as passed) without a GPU, planted bad conditions becoming findings with the right
cause, the GPU judgement on a fake NVML, and the report valid against the published schema."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest
from doctor.probes import check as check_kind
from doctor.probes.check import comm, gpu, host
from doctor.probes.check.result import FAILED, PASSED, SKIPPED, MiB

from doctor.engine.diagnose import analyze, diagnose_path
from doctor.engine.facts import items_from_folder

sys.path.insert(0, str(Path(__file__).parent))
from fake_nvml import FakeNvml, device  # noqa: E402

from tests.slurm_cluster import slurm_cluster  # noqa: E402, F401 - the fixture

FIXTURES = Path(__file__).parent / "fixtures" / "check"
HAS_TORCH = __import__("importlib").util.find_spec("torch") is not None


def _schema() -> dict[str, Any]:
    return json.loads(resources.files("doctor.engine").joinpath("schemas/report.schema.json").read_text())


def _report_of(doc: dict[str, Any], tmp_path: Path):  # noqa: ANN202 - Report
    """The report the engine builds from one check document (as if read from a bundle)."""
    folder = tmp_path / "ev"
    folder.mkdir(exist_ok=True)
    (folder / "check.json").write_text(json.dumps(doc))
    return analyze(items_from_folder(folder), {"type": "loose", "path": str(folder)})


def _no_gpu_no_comm(monkeypatch: pytest.MonkeyPatch) -> None:
    """GPU checks see no NVML; communication is skipped (fast tests of the host path)."""
    monkeypatch.setattr(gpu, "open_nvml", lambda: (None, "NVML library not found (libnvidia-ml.so.1): no NVIDIA driver on this host"))


# -- host checks on this machine --------------------------------------------------------------------

def test_host_checks_run_here_and_judge() -> None:
    recs = host.shm() + host.ulimits() + host.governor() + host.memory()
    ids = {r["id"]: r for r in recs}
    assert {"host.shm", "host.ulimit.nofile", "host.ulimit.memlock", "host.ulimit.nproc", "host.governor",
            "host.memory"} <= set(ids)
    for key in ("host.shm", "host.ulimit.nofile", "host.memory"):  # readable on any Linux
        assert ids[key]["status"] in (PASSED, FAILED), ids[key]
        assert ids[key]["value"], "a judged check keeps the numbers it judged"
    gov = ids["host.governor"]
    if not Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor").exists():
        assert gov["status"] == SKIPPED and "cpufreq" in gov["reason"]
    for r in recs:
        assert (r["status"] == FAILED) == bool(r["cause"]), "a cause on failures only"


def test_folder_throughput_is_measured_and_cleans_up(tmp_path: Path) -> None:
    (rec,) = host.folder_io(tmp_path, 8 * MiB)
    assert rec["status"] in (PASSED, FAILED)
    assert rec["value"]["write_bps"] > 0 and rec["value"]["read_bps"] > 0
    assert list(tmp_path.iterdir()) == [], "the test file is removed"


# -- planted bad conditions become findings with the right cause -------------------------------------

def test_planted_small_shm_and_low_memlock_are_findings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real_statvfs = os.statvfs

    def statvfs(path: Any) -> Any:
        st = real_statvfs(path)
        if str(path) == "/dev/shm":  # a container's default 64 MiB /dev/shm
            return SimpleNamespace(f_blocks=16384, f_frsize=4096, f_bavail=16384, f_bfree=16384)
        return st

    monkeypatch.setattr(host.os, "statvfs", statvfs)
    monkeypatch.setattr(host, "_limits", lambda: {"nofile": 1048576, "memlock": 64 * 1024, "nproc": 100000})
    _no_gpu_no_comm(monkeypatch)
    doc = check_kind.run_checks({"level": "quick", "skip_comm": True}, "node7")
    report = _report_of(doc, tmp_path)
    causes = {f.cause: f for f in report.findings}
    assert "shm_too_small" in causes and "resource_limit" in causes
    assert causes["shm_too_small"].hosts == ["node7"]
    assert "64 MiB" in causes["shm_too_small"].evidence[0]
    assert "memlock" in " ".join(causes["resource_limit"].evidence)
    assert causes["shm_too_small"].fix, "the playbook's fix comes with the finding"
    assert report.exit_code == 1


def test_planted_full_folder_is_a_slow_storage_finding(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(host.os, "statvfs", lambda p: SimpleNamespace(f_blocks=256, f_frsize=4096, f_bavail=100, f_bfree=100))
    (rec,) = host.folder_io(tmp_path, 8 * MiB)
    assert rec["status"] == FAILED and rec["cause"] == "slow_storage" and "free" in rec["summary"]


# -- skipped is never passed --------------------------------------------------------------------------

def test_gpu_checks_skipped_without_gpu_and_never_counted_as_passed(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    _no_gpu_no_comm(monkeypatch)
    doc = check_kind.run_checks({"level": "quick", "skip_comm": True}, "cpu1")
    gpu_recs = [r for r in doc["checks"] if r["group"] == "gpu"]
    assert gpu_recs and all(r["status"] == SKIPPED for r in gpu_recs)
    assert all("no NVIDIA driver" in r["reason"] for r in gpu_recs)
    numa = next(r for r in doc["checks"] if r["id"] == "host.numa")
    assert numa["status"] == SKIPPED
    report = _report_of(doc, tmp_path)
    counts = report.facts["check"]["counts"]
    assert counts[SKIPPED] >= len(gpu_recs) + 3
    assert counts[PASSED] + counts[FAILED] + counts[SKIPPED] == len(doc["checks"])


def test_all_skipped_is_never_healthy(tmp_path: Path) -> None:
    doc = {"schema": check_kind.SCHEMA, "host": "h", "level": "quick",
           "checks": [{"id": "gpu.matmul", "group": "gpu", "title": "t", "status": SKIPPED, "summary": "not run",
                       "reason": "no GPU", "cause": "", "gpus": [], "value": {}, "seconds": 0.0}]}
    report = _report_of(doc, tmp_path)
    assert report.verdict["state"] == "unknown" and "skipped" in report.verdict["summary"]
    assert report.exit_code == 3


# -- GPU judgement (fake NVML, measured figures given) --------------------------------------------------

def test_gpu_below_peers_and_sick_gpu_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([device(), device(bus="00000000:2B:00.0", remapped=(0, 0, 1, 0), reasons=0x1 | 0x8),
                     device(bus="00000000:3B:00.0")])
    import doctor.probes.gpu.nvml as nvml

    monkeypatch.setattr(nvml, "load_nvml", lambda: fake)

    def measure(nv: Any, host_name: str, devices: list[dict[str, Any]], quick: bool, timeout: float) -> Any:
        tf = [790.0, 785.0, 520.0]  # gpu2 capped, as a lowered power limit does
        return ([{"index": d["index"], "name": "NVIDIA H200", "errors": {},
                  "matmul": {"bf16": {"tflops": t, "shape": [8192, 8192, 8192], "tried": 27}},
                  "membw": {"Bps": 4.2e12, "bytes": 2 << 30}} for d, t in zip(devices, tf, strict=True)],
                {"xid": [{"gpu": 1, "xid": 79, "t": 0.0}], "gen_under_load": {0: 5, 1: 5, 2: 5}, "xid_errors": [],
                 "window_s": 5.0})

    monkeypatch.setattr(gpu, "measure", measure)
    recs, info = gpu.run("n1", quick=True)
    by = {r["id"]: r for r in recs}
    assert info["n_gpus"] == 3
    assert by["gpu.health"]["status"] == FAILED and by["gpu.health"]["gpus"] == ["n1:gpu1"]
    assert by["gpu.throttle"]["cause"] == "gpu_throttling" and by["gpu.throttle"]["gpus"] == ["n1:gpu1"]
    assert by["gpu.xid"]["cause"] == "gpu_hardware_fault"
    mm = by["gpu.matmul.bf16"]
    assert mm["status"] == FAILED and mm["cause"] == "gpu_underperforming" and mm["gpus"] == ["n1:gpu2"]
    assert mm["value"]["gpus"]["n1:gpu2"]["spec"] == 989.5
    assert by["gpu.membw"]["status"] == PASSED


def test_h200_capture_reads_back(tmp_path: Path) -> None:
    """The quick check captured on the H200 device machine (docs/benchmarks.md)."""
    report = diagnose_path(FIXTURES / "h200-quick")
    ns = report.facts["check"]
    by = {c["id"]: c for c in ns["checks"]}
    assert by["gpu.matmul.bf16"]["status"] == PASSED
    assert by["gpu.matmul.bf16"]["value"]["gpus"]["vm:gpu0"]["value"] > 700
    assert by["gpu.membw"]["value"]["gpus"]["vm:gpu0"]["value"] > 4.0
    assert {f.cause for f in report.findings} <= {"resource_limit"}


# -- the gloo path for real, and the command --------------------------------------------------------

@pytest.mark.live
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_gloo_connectivity_and_busbw_for_real() -> None:
    recs = comm.run(n_gpus=0, nvlink=False, quick=True, nprocs=2)
    by = {r["id"]: r for r in recs}
    assert by["comm.connect"]["status"] == PASSED, by["comm.connect"]
    bw = by["comm.busbw"]
    assert bw["status"] in (PASSED, FAILED)
    sweep = bw["value"]["sweep"]
    assert [s["bytes"] for s in sweep] == [1 * MiB, 8 * MiB, 32 * MiB]
    for s in sweep:  # busbw = algbw * 2(n-1)/n; n = 2
        assert s["busbw_Bps"] == pytest.approx(s["algbw_Bps"])


@pytest.mark.live
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_check_command_json_is_schema_valid(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": ""}
    proc = subprocess.run([sys.executable, "-m", "doctor.cli", "check", "--json", "--path", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads(proc.stdout)
    jsonschema.Draft202012Validator(_schema()).validate(doc)
    assert doc["source"]["type"] == "check"
    assert doc["evidence"]["kinds"] == ["check"]
    for f in doc["findings"]:
        assert f["rule"].startswith("CHK")


def test_check_report_json_is_schema_valid_offline(tmp_path: Path) -> None:
    report = diagnose_path(FIXTURES / "cpu-vm")
    jsonschema.Draft202012Validator(_schema()).validate(report.to_json())
    gpu_checks = [c for c in report.facts["check"]["checks"] if c["group"] == "gpu"]
    assert gpu_checks and all(c["status"] == SKIPPED for c in gpu_checks)


def test_h200_contended_capture_is_caught() -> None:
    """Real H200, the check run while another process kept the GPU busy with bf16 matmuls (the
    GPU's own settings are left alone on the lent machine): throughput and bandwidth fall far
    below the spec, and the finding names the GPU."""
    report = diagnose_path(FIXTURES / "h200-contended")
    causes = {f.cause: f for f in report.findings}
    assert causes["gpu_underperforming"].gpus == ["vm:gpu0"]
    assert causes["gpu_underperforming"].rule == "CHK012"
    assert report.verdict["state"] == "slow"
    by = {c["id"]: c for c in report.facts["check"]["checks"]}
    assert by["gpu.matmul.bf16"]["value"]["gpus"]["vm:gpu0"]["share_of_spec"] < 0.6


def test_merged_nodes_name_the_outlier_node(tmp_path: Path) -> None:
    """Several nodes' check results (what the srun one-liner in docs/slurm.md gathers) read as
    one folder: the node whose GPU lags the others across nodes is named, the others are not."""
    doc = json.loads((FIXTURES / "h200-quick" / "check.json").read_text())
    for name, bf16 in (("node1", None), ("node2", 0.55), ("node3", None)):
        text = json.dumps(doc).replace('"vm:gpu0"', f'"{name}:gpu0"')
        node = json.loads(text)
        node["host"] = name
        for c in node["checks"]:
            c["host"] = name
            if bf16 and c["id"] == "gpu.matmul.bf16":  # passed its own spec test, far below its peers
                c["value"]["gpus"][f"{name}:gpu0"]["value"] *= bf16
        (tmp_path / name).mkdir()
        (tmp_path / name / "check.json").write_text(json.dumps(node))
    report = diagnose_path(tmp_path)
    assert sorted(report.facts["check"]["hosts"]) == ["node1", "node2", "node3"]
    slow = next(f for f in report.findings if f.cause == "gpu_underperforming")
    assert slow.hosts == ["node2"] and slow.gpus == ["node2:gpu0"]


@pytest.mark.slurm
@pytest.mark.live
def test_check_slurm_job_names_the_outlier_node(slurm_cluster, tmp_path: Path) -> None:  # noqa: ANN001, F811
    """`mldoctor check --slurm-job` on the two-node localhost cluster: one srun step runs the
    checks on node1 and node2, the fragments merge into one report, and the node whose folder
    has no room (node2's `--path` is on procfs: 0 bytes free) is the one the finding names."""
    from tests.conftest import mldoctor

    paths = tmp_path / "paths"
    (paths / "node1").mkdir(parents=True)
    (paths / "node2").symlink_to("/proc/sys")
    job = slurm_cluster.sbatch("#!/bin/sh\nsleep 600\n", "--nodes=2", "--ntasks-per-node=1")
    slurm_cluster.wait_state(job, "RUNNING", 60)
    try:
        res = mldoctor("check", "--slurm-job", job, "--json", "--no-gpu", "--no-comm", "--path",
                       str(paths / "{node}"), env=slurm_cluster.env, timeout=180)
    finally:
        slurm_cluster.run("scancel", job, check=False)
    assert res.returncode == 1, res.stderr
    doc = json.loads(res.stdout)
    jsonschema.Draft202012Validator(_schema()).validate(doc)
    storage = next(f for f in doc["findings"] if f["cause"] == "slow_storage")
    # node2 is named for having no room; node1 (a real folder on this machine's disk) may be named
    # too when the disk writes below 200 MB/s at that moment, a real reading, not the fault here.
    assert "node2" in storage["hosts"]
    no_room = [e for e in storage["evidence"] if "free in" in e]
    assert no_room and all(e.startswith("node2:") for e in no_room), storage["evidence"]
    assert doc["source"]["type"] == "check" and doc["source"]["slurm_job"] == job
