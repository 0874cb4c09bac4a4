"""Round 6 hang work: tickets that only say where or when a hang happens (no error line).

Why these tests: a placed hang must feed the causes that place implies (a save called on the main
process only, a load that stalls, a validation loader in a single process) at low confidence, and
a setup sentence or a healthy report must not become a hang finding. End to end through the real
prose reader (probes/symptoms/patterns/hang_r6.yaml) and the SYM220-SYM225 rules.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from doctor.probes.symptoms.read import phrases

from .conftest import diagnose_json


def _ticket(tmp_path: Path, text: str) -> list[dict]:
    f = tmp_path / "issue.md"
    f.write_text(text)
    return diagnose_json(f)["findings"]


@pytest.mark.parametrize(("sentence", "fact", "value"), [
    ("It always blocked when validate in each epoch.", "when", "evaluation"),
    ("It always blocked when validate in each epoch.", "states", "hang"),
    ("Training is ok but gets stuck in accelerator.save_state(path).", "when", "checkpoint"),
    ("The script is stuck at Loading checkpoint shards.", "when", "model_load"),
    ("We train with DeepSpeed ZeRO-3 on 8 GPUs.", "context", "sharded_engine"),
])
def test_placement_phrases_are_read(sentence: str, fact: str, value: str) -> None:
    got = {(p.fact, p.value) for p in phrases(sentence) if p.asserted}
    assert (fact, value) in got


@pytest.mark.parametrize("sentence", [
    "The port is blocked by the firewall.",
    "I load the model with from_pretrained.",
    "We validate every epoch.",
])
def test_setup_sentences_place_no_hang(sentence: str) -> None:
    got = {(p.fact, p.value) for p in phrases(sentence) if p.asserted}
    assert ("states", "hang") not in got
    assert ("when", "model_load") not in got


def test_save_on_main_only_leads_the_collective_reading(tmp_path: Path) -> None:
    found = _ticket(tmp_path, "# Save hangs\n\nWith DeepSpeed the run trains, but save_checkpoint hangs "
                              "forever when it is called only on the main process.\n")
    assert found[0]["cause"] == "rank_outside_collective"
    assert found[0]["severity"] in ("low", "medium")


def test_stall_at_model_load_proposes_host_memory_at_low_severity(tmp_path: Path) -> None:
    found = _ticket(tmp_path, "# Stuck\n\nThe script is stuck at Loading checkpoint shards.\n")
    assert found[0]["cause"] == "host_oom"
    assert all(f["severity"] == "low" for f in found)


def test_single_process_validation_hang_points_at_loader_workers(tmp_path: Path) -> None:
    found = _ticket(tmp_path, "# Blocked\n\nIt always blocked when validate in each epoch.\n")
    assert found[0]["cause"] == "dataloader_worker_deadlock"
    assert all(f["severity"] == "low" for f in found)


def test_healthy_report_with_placement_words_gives_no_alarm(tmp_path: Path) -> None:
    found = _ticket(tmp_path, "# Question\n\nLoading checkpoint shards takes a minute and then training "
                              "runs fine. We call save_state on every rank with DeepSpeed.\n")
    assert not [f for f in found if f["severity"] in ("medium", "high", "critical")]
