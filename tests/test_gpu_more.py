"""GPU hardware, placement and survived-OOM readers of the GPU/CUDA area (gpu_more.yaml,
recovered.yaml, probes/gpu derive and crowded GPUs): end to end through the real readers, so a
signature or a derived fact that stops reaching its rule fails here."""

from __future__ import annotations

from pathlib import Path

from doctor.probes.logs import scan as S
from doctor.probes.logs.facts import build_facts

from doctor.engine.diagnose import diagnose_path

FIX = Path(__file__).parent / "fixtures"


def _top(path: Path) -> list[tuple[str, str, str]]:
    doc = diagnose_path(path).to_json()
    return [(f["cause"], f["severity"], f["rule"]) for f in doc["findings"]]


def test_oom_skipped_then_training_goes_on_is_survived() -> None:
    """A caught OOM followed by a 'skipping batch' message and steps raises no medium+ finding."""
    log = FIX / "survived" / "oom_skip_batch" / "train.log"
    facts = build_facts([S.scan_file(log, log.name, year=2026).to_json()])
    assert "gpu_oom" in facts["survived_kinds"]
    top = _top(FIX / "survived" / "oom_skip_batch")
    assert not [t for t in top if t[1] in ("critical", "high", "medium")]


def test_nvidia_smi_cannot_open_gpu_is_a_hardware_lead() -> None:
    top = _top(FIX / "logs" / "gpu_more" / "device_handle.log")
    assert top and top[0][:2] == ("gpu_hardware_fault", "high")


def test_unknown_error_before_and_after_training() -> None:
    assert _top(FIX / "logs" / "gpu_more" / "unknown_midrun.log")[0][0] == "gpu_hardware_fault"
    assert _top(FIX / "logs" / "gpu_more" / "unknown_start.log")[0][0] == "cuda_setup_mismatch"


def test_kernel_error_on_a_gpu_that_fell_away_is_hardware() -> None:
    top = _top(FIX / "logs" / "gpu_more" / "launch_failure_gpu_gone.log")
    assert top[0][0] == "gpu_hardware_fault"
    assert "cuda_kernel_fault" not in [t[0] for t in top]


def test_all_processes_on_gpu0_in_a_pasted_table() -> None:
    top = _top(FIX / "logs" / "gpu_more" / "nvidia_smi_all_on_gpu0.txt")
    assert top[0][:2] == ("duplicate_gpu", "medium")


def test_err_row_in_the_smi_table_is_a_severe_fault() -> None:
    """A GPU whose name, sensors and ECC cell nvidia-smi prints as ERR! is one the driver lost."""
    top = _top(FIX / "logs" / "gpu_more" / "nvidia_smi_err_row.txt")
    assert top[0][:2] == ("gpu_hardware_fault", "critical")
