"""Round 5 hang work: a dead rank leads a hang report, the process group of a watchdog line read
from the line after it, a torch >= 2.3 store-socket timeout, and the prose phrasings added in
probes/symptoms/patterns/hang_r5.yaml.

Why these tests: each guards a distinction the hang causes are confused on (a rank's OOM vs the
hang it leaves, one group's different sequence numbers vs a rank elsewhere, a preprocessing
timeout vs an init hang), end to end through the real readers and rules.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from doctor.engine.findings import rank_findings
from doctor.engine.rule import Rule, RuleResult
from doctor.evidence.patterns import parse_library
from probes.logs.partial import partial_facts

from .conftest import FIXTURES, diagnose_json

HERE = FIXTURES / "hang_r5"
LIB = Path(__file__).resolve().parents[1] / "probes" / "symptoms" / "patterns" / "hang_r5.yaml"


def _causes(path: Path) -> list[str]:
    return [f["cause"] for f in diagnose_json(path)["findings"]]


def test_dead_rank_leads_a_hang_report_and_the_oom_leads_a_crash_report() -> None:
    assert _causes(HERE / "tickets" / "oom_then_hang.md")[0] == "rank_process_dead"
    assert _causes(HERE / "tickets" / "oom_crash_report.md")[0] == "gpu_oom"


def test_prose_dead_rank_in_a_hang_leads_asserted_or_supposed() -> None:
    assert _causes(HERE / "tickets" / "killed_others_wait.md")[0] == "rank_process_dead"
    assert _causes(HERE / "tickets" / "exit_first_supposed.md")[0] == "rank_process_dead"


def test_group_named_on_the_next_line_makes_sequence_numbers_comparable() -> None:
    waits = [{"rank": 0, "host": "", "backend": "nccl", "seq": 122, "op": "_REDUCE_SCATTER_BASE",
              "numel_in": 10, "timeout_ms": 600000, "ran_ms": 600080, "pg": ""},
             {"rank": 1, "host": "", "backend": "nccl", "seq": 126, "op": "_ALLGATHER_BASE",
              "numel_in": 20, "timeout_ms": 600000, "ran_ms": 600079, "pg": ""}]
    progress = [{"rank": r, "host": "", "pg": "0(default_pg)", "seq": s, "last_enqueued": s + 2,
                 "last_completed": s - 1, "own": True} for r, s in ((0, 122), (1, 126))]
    without = partial_facts([{"ranks": [0, 1]}], waits, 2, set(), set())["wait_groups"][0]
    assert not without["seq_differs"]
    groups = partial_facts([{"ranks": [0, 1], "progress": progress}], waits, 2, set(), set())["wait_groups"]
    assert groups[0]["pg"] == "0(default_pg)" and groups[0]["seq_differs"] and groups[0]["behind_ranks"] == [0]
    assert _causes(HERE / "seq_differs_pg_on_next_line.log")[0] == "collective_mismatch"


def test_store_socket_timeout_during_tokenization_is_a_short_timeout() -> None:
    assert _causes(HERE / "tokenize_store_timeout.log")[0] == "timeout_too_short"


def _rule(rid: str, cause: str, conf: float, suppresses: list[str]) -> RuleResult:
    rule = Rule(id=rid, name=rid, cause=cause, severity="high", confidence=conf, state="crashed",
                requires=[], when="true", explain="", path=Path("x"), line=1, suppresses=suppresses)
    return RuleResult(rule, "fired")


def test_mutual_suppression_keeps_the_higher_score() -> None:
    a = _rule("A1", "gpu_oom", 0.9, ["rank_process_dead"])
    b = _rule("B1", "rank_process_dead", 0.92, ["gpu_oom"])
    c = _rule("C1", "timeout_too_short", 0.5, [])
    found, trace = rank_findings([a, b, c], {})
    assert [f.cause for f in found] == ["rank_process_dead", "timeout_too_short"]
    assert any("A1" in t and "B1" in t for t in trace)
    # one-way suppression is unchanged: the suppressed cause stays hidden whatever its score
    d = _rule("D1", "rank_process_dead", 0.99, [])
    found, _ = rank_findings([a, d], {})
    assert [f.cause for f in found] == ["gpu_oom"]


@pytest.mark.parametrize("text,cause", [
    ("it gets stuck at torch.distributed.init_process_group()", "init_hang"),
    ("one rank calls allreduce one more time than the others", "collective_mismatch"),
    ("the collective times out during model saving with FSDP", "timeout_too_short"),
    ("the worker processes are blocked on a futex", "dataloader_worker_deadlock"),
    ("one of the 4 ranks crashed and the rest of the ranks are stuck in all_reduce", "rank_process_dead"),
])
def test_prose_library_names_the_cause(text: str, cause: str) -> None:
    lib = parse_library(LIB.name, LIB.read_text())
    hits = [p for p in lib if p.fields.get("cause") == cause and p.regex.search(text)]
    assert hits, text
