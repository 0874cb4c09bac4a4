"""Differential priors re-fitted from counted public threads (round 5; docs/differential-base-rates.md).

When a ticket gives only a state (hangs, crashes, slow, diverges) and a little context, the
differential rules propose the causes that counted issue threads of that situation were most often
resolved as. The claims tested here:

- each re-fitted situation proposes its three causes in the counted order, strictly below any
  evidence or topic lead, at low severity and a confidence inside the prior band (0.10-0.15);
- the three rules of one situation never name the same cause twice (three distinct guesses);
- a plain hang now leads with a DataLoader worker deadlock, a plain crash with an installation
  mismatch, and "works on one node, hangs on two" with the network priors;
- a job said to run fine, or a state only asked about, gets no differential finding at all.

The tickets are written in our own words for this test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from doctor.engine.diagnose import diagnose_path
from doctor.engine.ruleset import load_ruleset

#: situation -> its rules, in the order their causes should come (most likely first)
SITUATIONS = {
    "plain hang": ["SYM069", "SYM067", "SYM068"],
    "hang, several GPUs of one node": ["SYM093", "SYM092", "SYM094"],
    "plain crash": ["SYM117", "SYM115", "SYM116"],
    "plain slow": ["SYM083", "SYM126", "SYM084"],
    "gets slower as it runs": ["SYM080", "SYM079", "SYM078"],
    "hang, several nodes": ["SYM055", "SYM056", "SYM095"],
    "plain divergence": ["SYM089", "SYM090", "SYM130"],
}

#: (ticket, the differential causes expected at the head, in order)
TICKETS = [
    ("## Stuck\n\nThe training run hangs. No message at all.\n",
     ["dataloader_worker_deadlock", "collective_mismatch", "gpu_hardware_fault"]),
    ("## Dies\n\nOur training crashes at some point. Nothing useful is printed.\n",
     ["cuda_setup_mismatch", "host_oom", "gpu_oom"]),
    ("## DDP\n\nTraining with DDP on 4 GPUs of one server hangs, nothing is printed.\n",
     ["collective_mismatch", "nccl_p2p_broken", "dataloader_worker_deadlock"]),
    ("## Slow\n\nTraining is slow. We do not know why.\n",
     ["dataloader_starvation", "slow_storage", "cpu_oversubscription"]),
    ("## Slower\n\nThe run gets slower and slower as training goes on.\n",
     ["gpu_throttling", "dataloader_starvation", "gc_pauses"]),
]


def _rules() -> dict:
    return {r.id: r for r in load_ruleset().rules}


def _diag(tmp_path: Path, text: str) -> list:
    doc = tmp_path / "issue.md"
    doc.write_text(text, encoding="utf-8")
    return diagnose_path(doc).findings


@pytest.mark.parametrize("situation", sorted(SITUATIONS))
def test_situation_order_and_band(situation: str) -> None:
    rules = _rules()
    chain = [rules[i] for i in SITUATIONS[situation]]
    assert all("differential" in r.tags and r.severity == "low" for r in chain)
    assert all(0.10 <= r.confidence <= 0.15 for r in chain)
    confs = [r.confidence for r in chain]
    assert confs == sorted(confs, reverse=True) and len(set(confs)) == 3, (situation, confs)
    assert len({r.cause for r in chain}) == 3, situation


@pytest.mark.parametrize(("text", "causes"), TICKETS)
def test_ticket_gets_counted_order(tmp_path: Path, text: str, causes: list[str]) -> None:
    findings = _diag(tmp_path, text)
    got = [f.cause for f in findings if f.differential]
    assert got[: len(causes)] == causes, got
    assert all(f.severity == "low" for f in findings if f.differential)


def test_works_on_one_node_hangs_on_two(tmp_path: Path) -> None:
    findings = _diag(tmp_path, "## Two nodes\n\nTraining works on one node but hangs when we use two nodes.\n")
    causes = [f.cause for f in findings]
    assert "nccl_ib_fault" in causes or "nccl_network_misconfig" in causes
    assert "init_hang" in causes
    assert "dataloader_worker_deadlock" not in causes


@pytest.mark.parametrize("text", [
    "## Question\n\nCould training hang if I use 8 workers? It runs fine so far.\n",
    "## Healthy\n\nTraining runs fine on 8 GPUs; this is only a question about the docs.\n",
])
def test_no_prior_without_a_firm_state(tmp_path: Path, text: str) -> None:
    findings = _diag(tmp_path, text)
    assert not [f for f in findings if f.differential]
    assert all(f.severity in ("low", "info") for f in findings)
