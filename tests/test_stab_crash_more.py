"""Short pasted series and crash lines read into stability and crash findings (round 3).

Why: tickets paste a handful of loss/grad-norm lines or one launcher line; the whole-series
detectors need two windows, and a SIGKILL or SIGSEGV seen outside torchrun's failure summary was
read by nothing. These tests pin the partial readers (``metrics.partial.rise`` and
``grad_growth``), the crash_more signatures and the rules that rank them (STAB011-STAB013,
CRASH030, CRASH031, CRASH033, CRASH034), including which cause comes first when several fire.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from doctor.engine.diagnose import diagnose_path

FIX = Path(__file__).parent / "fixtures"


def _diagnose(tmp_path: Path, name: str, text: str):
    d = tmp_path / "case"
    d.mkdir()
    (d / name).write_text(text, encoding="utf-8")
    return diagnose_path(d)


def _first(r) -> tuple[str, str]:
    return (r.findings[0].cause, r.findings[0].rule) if r.findings else ("", "")


def test_short_rise_without_nan_is_a_divergence_lead() -> None:
    r = diagnose_path(FIX / "stab_more" / "rise")
    rise = r.facts["metrics"]["partial"]["rise"]
    assert rise["low_value"] == pytest.approx(2.6) and rise["last_value"] == pytest.approx(6.8)
    assert _first(r) == ("loss_divergence", "STAB011")


def test_noisy_short_series_is_not_a_rise() -> None:
    r = diagnose_path(FIX / "stab_more" / "rise_noisy")
    assert "rise" not in (r.facts["metrics"].get("partial") or {})


def test_grad_norm_growing_into_nan_keeps_loss_nan_first_and_names_the_growth() -> None:
    r = diagnose_path(FIX / "stab_more" / "grad_growth_nan")
    g = r.facts["metrics"]["partial"]["grad_growth"]
    assert g["then_nonfinite"] and g["nonfinite_step"] == 150 and g["from_step"] == 110
    causes = [f.cause for f in r.findings]
    assert causes[0] == "loss_nan" and "grad_explosion" in causes


def test_warmup_grad_growth_is_ordinary() -> None:
    r = diagnose_path(FIX / "stab_more" / "grad_warmup")
    assert "grad_growth" not in (r.facts["metrics"].get("partial") or {})
    assert "grad_explosion" not in [f.cause for f in r.findings if f.severity != "low"]


def test_huge_growing_grad_norm_without_nan_is_an_explosion() -> None:
    r = diagnose_path(FIX / "stab_more" / "grad_growth_huge")
    assert _first(r) == ("grad_explosion", "STAB012")


@pytest.mark.parametrize("line", [
    "Detected NaN in the loss at step 1200, skipping batch",
    "WARNING: NaN or Inf found in gradients, skipping step",
    "The grad norm is nan, skipping this update",
])
def test_a_training_loops_own_nan_guard_is_a_nan_loss(tmp_path: Path, line: str) -> None:
    assert _first(_diagnose(tmp_path, "train.log", line + "\n"))[0] == "loss_nan"


def test_worker_killed_under_memory_pressure_is_host_oom() -> None:
    r = diagnose_path(FIX / "crash_more" / "worker_killed_free")
    assert _first(r) == ("host_oom", "CRASH031")
    assert "dataloader_worker_deadlock" not in [f.cause for f in r.findings]


def test_worker_killed_with_memory_to_spare_is_not_called_pressure() -> None:
    r = diagnose_path(FIX / "crash_more" / "worker_killed_free_ok")
    assert "CRASH031" not in [f.rule for f in r.findings]


@pytest.mark.parametrize("fixture,rule", [
    ("ide_sigsegv", "CRASH030"),
    ("launch_sigsegv", "CRASH030"),
    ("spawn_sigsegv", "CRASH033"),
    ("ds_minus11", "CRASH033"),
])
def test_a_fatal_signal_of_its_own_is_a_dead_rank_not_an_oom(fixture: str, rule: str) -> None:
    r = diagnose_path(FIX / "crash_more" / fixture)
    assert _first(r) == ("rank_process_dead", rule)
    assert "host_oom" not in [f.cause for f in r.findings]


def test_a_cgroup_oom_kill_counter_is_an_oom_kill() -> None:
    r = diagnose_path(FIX / "crash_more" / "cgroup_oom_kill")
    assert _first(r)[0] == "host_oom"


def test_an_error_before_the_sigkill_is_not_read_as_an_oom() -> None:
    r = diagnose_path(FIX / "crash_more" / "error_then_sigkill")
    assert "CRASH009" not in [f.rule for f in r.findings]
    assert _first(r)[0] != "host_oom"
