"""Reasoning with partial evidence (issue #17, item 4).

Each input below is a real captured file (tests/fixtures) with most of its job's evidence left
out, the way it reaches a ticket: one rank's stack, one native stack in a CUDA wait, flight-
recorder dumps renamed to a job's own prefix, only the waiting rank's log lines, a single NCCL
WARN line, an env dump. The claim under test: mldoctor names the most likely cause at a
confidence that admits the gap, and says what is missing and how to collect it (the finding's
``missing``, and the verdict's), instead of "nothing found" or a confident verdict.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from doctor.probes.flight_recorder.read import rank_from_dump_name

from doctor.engine.diagnose import diagnose_path
from doctor.engine.report import Report
from doctor.render.markdown import render_markdown
from doctor.render.output import report_from_json

FIX = Path(__file__).parent / "fixtures"
LOCK_SELF = FIX / "evidence" / "lock_self"
STUCK = FIX / "gpu" / "h200" / "stuck"


def _case(tmp_path: Path, files: dict[str, Path | str]) -> Path:
    """A folder holding the given fixture files (or text) under the given names."""
    d = tmp_path / "case"
    d.mkdir()
    for name, src in files.items():
        if isinstance(src, Path):
            shutil.copy(src, d / name)
        else:
            (d / name).write_text(src, encoding="utf-8")
    return d


def _top(report: Report) -> tuple[str, str, float]:
    f = report.findings[0]
    return f.cause, f.severity, f.confidence


def _json_round_trip(report: Report) -> dict:
    doc = json.loads(json.dumps(report.to_json()))
    report_from_json(doc)  # what mldoctor writes it can read back
    return doc


# -- one rank's stack --------------------------------------------------------------------------

def test_one_waiting_rank_stack_is_a_lead_not_a_verdict(tmp_path: Path) -> None:
    """Rank 0 of the lock_self hang, alone: in all_reduce. Most likely a peer is elsewhere, but
    one snapshot cannot say the job is stuck: low confidence, state unknown, and the missing
    line asks for the other ranks' stacks and a second dump."""
    report = diagnose_path(_case(tmp_path, {"pyspy-rank0.txt": LOCK_SELF / "pyspy-rank0.txt"}))
    assert _top(report) == ("rank_outside_collective", "low", 0.3)
    assert report.verdict["state"] == "unknown"
    assert report.verdict["summary"].startswith("Possible cause, not confirmed")
    assert "py-spy dump" in report.verdict["missing"] and "other ranks" in report.verdict["missing"]
    doc = _json_round_trip(report)
    assert doc["findings"][0]["missing"] == report.verdict["missing"] == doc["verdict"]["missing"]


def test_one_stack_of_a_reported_hang_is_medium(tmp_path: Path) -> None:
    """The same dump pasted in a ticket that says the job hangs: the reporter's word settles
    stuck-or-not, so the same cause at medium confidence, still asking for the other ranks."""
    stack = (LOCK_SELF / "pyspy-rank0.txt").read_text(encoding="utf-8")
    issue = ("Our 4-GPU training hangs at step 3 and never recovers. Here is the py-spy dump of "
             "rank 0 taken while it was stuck:\n\n```\n" + stack + "```\n")
    report = diagnose_path(_case(tmp_path, {"issue.md": issue}))
    cause, severity, conf = _top(report)
    assert (cause, severity) == ("rank_outside_collective", "medium") and conf < 0.5
    assert report.findings[0].rule == "PART002"
    assert report.verdict["state"] == "hung" and "other ranks' stacks" in report.verdict["missing"]


def test_culprit_stack_alone_names_what_would_decide(tmp_path: Path) -> None:
    """The lock_self culprit's own stack (user code, no collective): nothing fires, and the
    verdict says which evidence would decide instead of only "no problem found"."""
    report = diagnose_path(_case(tmp_path, {"pyspy-rank1.txt": LOCK_SELF / "pyspy-rank1.txt"}))
    assert not [f for f in report.findings if f.severity in ("critical", "high", "medium")]
    missing = report.verdict["missing"]
    assert "Only rank 1 was seen" in missing and "flight-recorder" in missing
    assert "Missing evidence:" in render_markdown(report)


def test_every_rank_stack_gets_no_partial_rule(tmp_path: Path) -> None:
    """The whole capture: the full-evidence rule names rank 1, and no lone-stack rule fires."""
    report = diagnose_path(LOCK_SELF)
    assert not any(f.rule.startswith("PART") for f in report.findings)
    assert report.findings[0].ranks == [1]


# -- one native stack in a CUDA wait -----------------------------------------------------------

def test_native_cuda_wait_with_busy_gpu(tmp_path: Path) -> None:
    """The H200 capture's native dump (cuStreamSynchronize under .item()) and its nvidia-smi
    table at 100 %, no rank-to-GPU mapping: rank_stuck_in_cuda at medium confidence, asking for
    a second dump and the GPU's processes."""
    d = _case(tmp_path, {"pyspy-native-rank0.txt": STUCK / "pyspy-native-rank0-snap1.txt",
                         "nvidia-smi.txt": STUCK / "nvidia-smi.txt"})
    report = diagnose_path(d)
    assert _top(report) == ("rank_stuck_in_cuda", "medium", 0.45)
    assert report.findings[0].ranks == [0]
    assert "second dump" in report.verdict["missing"]


def test_native_cuda_wait_alone(tmp_path: Path) -> None:
    """Without the GPU's side: the same cause as a low-confidence lead, asking for nvidia-smi."""
    report = diagnose_path(_case(tmp_path, {"pyspy-native-rank0.txt": STUCK / "pyspy-native-rank0-snap1.txt"}))
    assert _top(report) == ("rank_stuck_in_cuda", "low", 0.3)
    assert report.verdict["state"] == "unknown" and "nvidia-smi" in report.verdict["missing"]


def test_native_cuda_wait_with_mapped_gpu_keeps_high_confidence() -> None:
    """The whole stuck capture (gpu.json maps the PID to rank 0): GPU009 decides, not PART003."""
    report = diagnose_path(STUCK)
    assert report.findings[0].cause == "rank_stuck_in_cuda" and report.findings[0].rule != "PART003"
    assert report.findings[0].confidence >= 0.8


def test_plain_stack_on_a_busy_gpu(tmp_path: Path) -> None:
    """The same process's plain py-spy dump (Python frames only: `stuck (capture_jobs.py:68)`)
    with gpu.json: the CUDA wait is a low-confidence lead, and the missing line asks for the
    native frames that would show it."""
    plain = FIX / "gpu" / "h200" / "stuck-plain"
    report = diagnose_path(_case(tmp_path, {"pyspy-rank0.txt": plain / "pyspy-rank0.txt",
                                            "gpu.json": plain / "gpu.json"}))
    assert _top(report) == ("rank_stuck_in_cuda", "low", 0.3) and report.findings[0].ranks == [0]
    assert "--native" in report.verdict["missing"]


# -- flight-recorder dumps named by the job's own prefix ---------------------------------------

@pytest.mark.parametrize(("name", "rank"), [
    ("whatever_prefix3", 3), ("/tmp/nccl_trace_rank_12", 12), ("job7_fr_0.pkl", 0),
    ("dumps/trace5.json", 5), ("dump.pkl", None), ("issue.md block 3, lines 12-40", None),
])
def test_rank_from_dump_name(name: str, rank: int | None) -> None:
    assert rank_from_dump_name(name) == rank


def test_fr_dumps_with_any_prefix(tmp_path: Path) -> None:
    """The gloo subgroup_cascade dumps (no rank key inside, as torch writes them) renamed to
    ``<prefix><rank>``: read, and FR001 names rank 3 as with the original names."""
    src = FIX / "fr" / "gloo" / "subgroup_cascade"
    d = _case(tmp_path, {f"whatever_prefix{r}": src / f"_dump_{r}" for r in range(4)})
    report = diagnose_path(d)
    assert not report.facts["evidence"]["errors"]
    assert report.findings[0].cause == "rank_outside_collective" and report.findings[0].ranks == [3]


# -- only the waiting ranks' logs ---------------------------------------------------------------

def test_only_the_waiting_ranks_log(tmp_path: Path) -> None:
    """timeout_silent keeps only rank 1's lines (the rank that timed out waiting): the cause is
    named at medium confidence with no culprit, and the missing line asks for the other ranks."""
    lines = (FIX / "logs" / "timeout_silent" / "torchrun.log").read_text(encoding="utf-8").splitlines()
    waiting = "\n".join(ln for ln in lines if ln.startswith("[default1]")) + "\n"
    report = diagnose_path(_case(tmp_path, {"torchrun.log": waiting}))
    assert _top(report)[:2] == ("rank_outside_collective", "medium")
    assert report.findings[0].ranks == []
    assert "other ranks' logs" in report.verdict["missing"]


# -- a single NCCL WARN line -------------------------------------------------------------------

def test_single_nccl_warn_line(tmp_path: Path) -> None:
    """One real WARN line ("no socket interface found"): the network cause, and the missing line
    says one line cannot name the interface and what would."""
    line = next(ln for ln in (FIX / "logs" / "nccl_bad_ifname" / "torchrun.log").read_text(
        encoding="utf-8").splitlines() if "NCCL WARN" in ln)
    report = diagnose_path(_case(tmp_path, {"nccl.log": line + "\n"}))
    assert report.findings[0].cause == "nccl_network_misconfig"
    assert "NCCL_DEBUG=INFO" in report.verdict["missing"]


def test_whole_nccl_log_has_no_missing_line() -> None:
    """With the whole log the same rule needs nothing more: no missing line."""
    report = diagnose_path(FIX / "logs" / "nccl_bad_ifname")
    top = report.findings[0]
    assert top.cause == "nccl_network_misconfig" and not top.missing
    assert "missing" not in report.to_json()["findings"][0]


# -- an env dump alone -------------------------------------------------------------------------

def test_env_dump_alone_names_what_would_decide(tmp_path: Path) -> None:
    report = diagnose_path(_case(tmp_path, {"env-rank0.txt": LOCK_SELF / "env-rank0.txt"}))
    assert report.verdict["state"] == "unknown" and not report.findings
    missing = report.verdict["missing"]
    assert "py-spy dump" in missing and "flight-recorder" in missing and "log" in missing
    assert _json_round_trip(report)["verdict"]["missing"] == missing


# -- complete evidence stays quiet -------------------------------------------------------------

def test_healthy_complete_evidence_has_no_missing_line() -> None:
    """Every rank's stacks and the launcher's log of a healthy job: healthy, nothing missing."""
    report = diagnose_path(FIX / "evidence" / "healthy")
    assert report.verdict["state"] == "healthy" and not report.findings
    assert "missing" not in report.verdict and "missing" not in report.to_json()["verdict"]


def test_healthy_stacks_only_stay_healthy_and_name_other_kinds() -> None:
    """Every rank's stacks of a healthy job, nothing else: still healthy (no finding), and the
    verdict names the kinds not read, without claiming ranks are missing."""
    report = diagnose_path(FIX / "stacks" / "subprocesses_healthy")
    assert report.verdict["state"] == "healthy"
    assert not [f for f in report.findings if f.severity in ("critical", "high", "medium")]
    assert report.verdict["missing"].startswith("Not read:")
