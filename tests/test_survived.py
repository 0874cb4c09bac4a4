"""Errors the job went on after (probes/logs/survival.py): flagged as survived, never as the
first failure, and the crash rules stand back; errors at the end of a log stay fatal.

The fixtures under tests/fixtures/survived/ are real CPU runs (capture.py), except the two
``*_template`` folders, which hold fairseq's own GPU OOM lines (cited in their README)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from doctor.probes.logs import scan as S
from doctor.probes.logs.facts import build_facts

from doctor.engine.diagnose import diagnose_path

FIX = Path(__file__).parent / "fixtures" / "survived"


def _facts(*paths: Path) -> dict:
    return build_facts([S.scan_file(p, p.name, year=2026).to_json() for p in paths])


def _state(folder: Path) -> tuple[str, list[tuple[str, str]]]:
    doc = diagnose_path(folder).to_json()
    return doc["verdict"]["state"], [(f["rule"], f["severity"]) for f in doc["findings"]]


def test_caught_allocation_failure_is_survived_and_no_first_failure() -> None:
    facts = _facts(FIX / "caught_alloc" / "train.log")
    assert facts["survived_kinds"] == ["host_alloc_failed"]
    assert all(e.get("survived") for e in facts["events"] if e["kind"] == "host_alloc_failed")
    assert "first_failure" not in facts and "first_error" not in facts
    assert facts["progress_lines"] >= 15


def test_uncaught_allocation_failure_stays_fatal() -> None:
    facts = _facts(FIX / "alloc_fatal" / "train.log")
    assert facts["survived_kinds"] == []
    assert facts["first_failure"]["kind"] in ("host_alloc_failed", "python_exception")


def test_elastic_restart_that_succeeds_leaves_no_dead_rank() -> None:
    facts = _facts(FIX / "elastic_restart" / "torchrun.log")
    assert facts["dead_ranks"] == [] and "first_failure" not in facts
    assert facts["exited_ranks"] and all(x.get("survived") and x["cascade"] for x in facts["exited_ranks"])
    assert "rank_exit" in facts["survived_kinds"]


def test_elastic_restart_that_fails_again_stays_fatal() -> None:
    """Real: the restarted group's gloo connect timed out, so nothing trained after the restart."""
    facts = _facts(FIX / "elastic_restart_refailed" / "torchrun.log")
    assert "rank_exit" not in facts["survived_kinds"]
    assert facts["dead_ranks"] and "first_failure" in facts


def test_oom_at_the_end_of_a_log_is_not_survived() -> None:
    facts = _facts(Path(__file__).parent / "fixtures" / "logs" / "gpu_oom" / "torchrun.log")
    assert "gpu_oom" in facts["counts"] and "gpu_oom" not in facts["survived_kinds"]


def test_a_peer_s_progress_does_not_save_a_rank(tmp_path: Path) -> None:
    """Rank 1's OOM is followed only by rank 0's steps: rank 1 did not go on."""
    lines = ["[rank0] step 1 | loss 1.0", "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."]
    lines += [f"[rank0] step {i} | loss 1.0" for i in range(2, 9)]
    log = tmp_path / "mixed.log"
    log.write_text("\n".join(lines) + "\n")
    facts = _facts(log)
    assert "gpu_oom" not in facts["survived_kinds"] and facts["first_failure"]["kind"] == "gpu_oom"
    # the same stream going on does save it
    log.write_text("\n".join(lines + [f"[rank1] step {i} | loss 1.0" for i in range(2, 6)]) + "\n")
    assert "gpu_oom" in _facts(log)["survived_kinds"]


def test_counter_must_move_without_a_recovery_message(tmp_path: Path) -> None:
    log = tmp_path / "stuck.log"
    log.write_text("RuntimeError: CUDA error: out of memory\n" + "epoch 3 | eval done\n" * 5)
    assert "gpu_oom" not in _facts(log)["survived_kinds"]


def test_one_oom_survived_and_a_later_one_fatal_is_not_survived() -> None:
    facts = _facts(FIX / "gpu_oom_then_fatal_template" / "train.log")
    assert "gpu_oom" not in facts["survived_kinds"]
    assert facts["first_failure"]["kind"] in ("gpu_oom", "python_exception")


def test_warning_traceback_is_context(tmp_path: Path) -> None:
    """A real run: a UserWarning raised as an error (-W error), caught and printed with its
    stack, and the loop goes on."""
    script = tmp_path / "warn.py"
    script.write_text(
        "import traceback, warnings\n"
        "for step in range(6):\n"
        "    if step == 2:\n"
        "        try:\n"
        "            warnings.warn('this API is deprecated', UserWarning)\n"
        "        except UserWarning:\n"
        "            traceback.print_exc()\n"
        "    print(f'step {step} | loss 0.5', flush=True)\n")
    out = subprocess.run([sys.executable, "-W", "error", str(script)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, check=True).stdout
    log = tmp_path / "warn.log"
    log.write_text(out)
    facts = _facts(log)
    assert [t["role"] for t in facts["tracebacks"]] == ["context"]
    assert "first_failure" not in facts


def test_verdicts() -> None:
    state, findings = _state(FIX / "caught_alloc")
    assert state != "crashed" and all(sev in ("low", "info") for _, sev in findings)
    assert ("CRASH012", "low") in findings
    state, findings = _state(FIX / "elastic_restart")
    assert state != "crashed" and not [f for f in findings if f[1] in ("critical", "high", "medium")]
    state, findings = _state(FIX / "alloc_fatal")
    assert state == "crashed" and ("CRASH004", "critical") in findings


def test_fast_and_reference_scans_agree_on_survival() -> None:
    for p in sorted(FIX.glob("*/*.log")):
        fast = S.scan_file(p, "x.log", year=2026).to_json()
        ref = S.scan_file(p, "x.log", year=2026, reference=True).to_json()
        assert fast == ref, p
