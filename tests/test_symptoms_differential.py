"""The differential layer (rules SYM054+, tag ``differential``): a ranked guess from the reporter's state.

When a ticket says clearly how the job failed (hangs at the end of an epoch, slow only on two
nodes, slower and slower) but no log, dump or named cause came with it, mldoctor used to say only
"no rule names a cause". These rules give the one to three causes that combination most often has,
as low findings with what would settle each. The claims tested here:

- each combination in plain prose gives its causes, most likely first;
- a state that is negated, asked, only supposed ("it might hang") or a job said to run fine gives
  no differential finding;
- a cause the reporter names in the same area (a topic lead) makes the differential stand back;
- every differential finding ranks strictly below every other actionable rule (machine evidence
  and topic leads alike), in the rule data and in a real diagnosis;
- the walkthrough's answers (no phrases, no topics) reach the same rules without errors;
- every firm state with no covered context still gets its base-rate causes (the fallbacks: a plain
  hang, crash, slow job or divergence), and the crash kind the reporter names (segfault, NCCL or
  CUDA error) picks that kind's causes even when no log was read;
- when evidence findings exist, the differential still adds the next alternatives, after them.

The tickets are written in our own words for this test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from doctor.probes.symptoms import read

from doctor.engine import celexpr, playbook
from doctor.engine import facts as facts_mod
from doctor.engine.diagnose import diagnose_path
from doctor.engine.findings import SEVERITY_WEIGHT
from doctor.engine.rule import evaluate
from doctor.engine.ruleset import load_ruleset
from doctor.engine.verdict import ACTIONABLE

FIX = Path(__file__).parent / "fixtures"


def _differential() -> list:
    return [r for r in load_ruleset().rules if "differential" in r.tags]


def _findings(tmp_path: Path, text: str) -> list:
    doc = tmp_path / "issue.md"
    doc.write_text(text, encoding="utf-8")
    return diagnose_path(doc).findings


def _diff_causes(findings: list) -> list[str]:
    ids = {r.id for r in _differential()}
    return [f.cause for f in findings if f.rule in ids or any(a in ids for a in f.also_fired)]


#: (ticket, the causes the differential must give, in this order, at the head of its findings)
COMBINATIONS = [
    ("## DDP stuck\n\nOn 8 GPUs the run freezes at the end of the first epoch, no error message.\n",
     ["collective_mismatch", "dataloader_worker_deadlock"]),
    ("Our job on three machines makes no progress at all, while the same code on a single node trains.\n",
     ["nccl_network_misconfig", "nccl_ib_fault"]),
    ("On our 4-GPU workstation training stalls at the first iteration. It trains fine on one GPU.\n",
     ["nccl_p2p_broken"]),
    ("The job is stuck in the validation loop every time, for all ranks.\n",
     ["rank_outside_collective", "collective_mismatch", "dataloader_worker_deadlock"]),
    ("Our trainer stalls when it saves the model, on every rank.\n", ["checkpoint_stall", "rank_stuck_in_io"]),
    ("Training freezes after about 9 hours, with no message at all.\n",
     ["rank_process_dead", "gpu_hardware_fault"]),
    ("It is stuck at step 4200.\n", ["dataloader_worker_deadlock", "collective_mismatch", "gpu_hardware_fault"]),
    ("Since the update of the NVIDIA driver the multi-GPU run hangs.\n", ["nccl_version_issue"]),
    ("Throughput on two nodes is far lower than on one node; training is slow.\n",
     ["nccl_slow_transport", "nccl_network_misconfig"]),
    ("Training is slow and GPU utilization stays around 25%.\n", ["dataloader_starvation", "host_sync_in_loop"]),
    ("The run starts at 5 it/s but gets slower and slower as training goes on.\n",
     ["gpu_throttling", "dataloader_starvation", "gc_pauses"]),
    ("Our ViT is slow when we wrap it with torch.compile.\n", ["torch_compile_recompiles"]),
    ("Training is slow on our cluster.\n", ["dataloader_starvation", "slow_storage", "cpu_oversubscription"]),
    ("Training crashes when we use two nodes; it works on a single node.\n", ["nccl_network_misconfig"]),
    ("After we upgraded torch, training crashes right away.\n", ["cuda_setup_mismatch"]),
    # the words raise the loss_nan / loss_divergence topic lead first; the differential adds the mechanism below it
    ("The loss becomes inf when trained with fp16.\n", ["loss_nan", "fp16_overflow"]),
    ("The loss becomes nan after 2000 steps. We use AMP with fp16.\n", ["loss_nan", "fp16_overflow"]),
    ("The loss goes up after we increased the learning rate.\n", ["loss_divergence", "grad_explosion"]),
    # base-rate fallbacks: the state alone, no context a rule of its own covers
    ("## Stuck\n\nOur training hangs. Nothing else is printed.\n",
     ["dataloader_worker_deadlock", "collective_mismatch", "gpu_hardware_fault"]),
    ("## Training dies\n\nOur training crashes at step 500 every time. There is no useful message.\n",
     ["cuda_setup_mismatch", "host_oom", "gpu_oom"]),
    ("## Slow\n\nTraining is slow. We do not know where the time goes.\n",
     ["dataloader_starvation", "slow_storage", "cpu_oversubscription"]),
    # the state's own topic lead first (loss_nan), then the rest of the base rate
    ("## NaN loss\n\nThe loss becomes NaN after a while. We have no idea why.\n", ["loss_nan", "grad_explosion", "fp16_overflow"]),
    ("## Diverges\n\nThe loss diverges after a while; we train in bf16.\n", ["loss_divergence", "loss_nan", "grad_explosion"]),
    # context refines the base rate
    ("## DDP hang\n\nTraining with DDP on 8 GPUs just hangs, nothing is printed.\n",
     ["collective_mismatch", "nccl_p2p_broken", "dataloader_worker_deadlock"]),
    ("## DDP hang at launch\n\nOur DDP run on 4 GPUs freezes right at the start.\n",
     ["init_hang", "nccl_p2p_broken", "nccl_network_misconfig"]),
    ("## Two nodes\n\nTraining hangs on two nodes.\n", ["nccl_network_misconfig", "nccl_ib_fault", "init_hang"]),
    ("## Epochs\n\nThe job hangs after 3 epochs.\n", ["collective_mismatch", "dataloader_worker_deadlock", "rank_outside_collective"]),
    ("## Workers\n\nWith num_workers=8 the job hangs after a while.\n", ["dataloader_worker_deadlock"]),
    ("## Segfault\n\nThe job crashes with a segmentation fault.\n",
     ["cuda_setup_mismatch", "dataloader_worker_deadlock", "shm_too_small"]),
    ("## NCCL\n\nTraining fails with an NCCL error (unhandled system error) on our 8-GPU server.\n",
     ["shm_too_small", "duplicate_gpu", "nccl_network_misconfig"]),
    ("## CUDA\n\nTraining fails with a CUDA error. We did not keep the log.\n", ["cuda_kernel_fault", "cuda_setup_mismatch"]),
    ("## Crash at launch\n\nWhen I start the script it crashes immediately.\n", ["cuda_setup_mismatch"]),
    ("## Late crash\n\nTraining crashes after 10 hours.\n", ["host_oom"]),
    ("## Scaling\n\nDDP on 4 GPUs is slower than on a single GPU.\n",
     ["nccl_slow_transport", "cpu_oversubscription", "dataloader_starvation"]),
    ("## Upgrade\n\nTraining got 40% slower after upgrading torch.\n", ["nccl_version_issue", "cpu_oversubscription"]),
    ("## Saving\n\nTraining is slow while it saves checkpoints.\n", ["checkpoint_stall", "slow_storage"]),
]


@pytest.mark.parametrize("text,causes", COMBINATIONS, ids=[c[0] + f"-{i}" for i, (_, c) in enumerate(COMBINATIONS)])
def test_each_combination_gives_its_likely_causes_in_order(tmp_path: Path, text: str, causes: list[str]) -> None:
    findings = _findings(tmp_path, text)
    got = [f.cause for f in findings]
    assert got[:len(causes)] == causes, [(f.cause, f.rule, f.confidence) for f in findings]
    for f in findings:
        assert f.severity in ("low", "medium"), (f.cause, f.rule, f.severity)
        if f.rule in {r.id for r in _differential()}:
            assert f.severity == "low" and f.confidence < 0.2 and f.missing.startswith("To settle it"), f


@pytest.mark.parametrize("text", [
    "Training does not hang at the end of the epoch.",
    "Does training hang at the end of the epoch?",
    "Training might hang at the end of the epoch, we are not sure yet.",
    "Maybe it is slow on two nodes, I could not measure it.",
    "Training runs fine on 2 nodes and it is not slow. Just a question about NCCL_SOCKET_IFNAME.",
    "Everything works as expected; GPU utilization is around 30% and that is fine for us.",
    "Our job hangs at step 3000. It is not an OOM and there are no Xid errors in dmesg.",
    "The run hangs at the end of the epoch because rank 1 is stuck in the dataloader.",
    "Training hangs on two nodes: NCCL picks the docker0 interface.",
    "The loss becomes nan with fp16 and the loss scale keeps shrinking.",
    "## Crash?\n\nTraining does not crash with a segmentation fault, it just prints warnings.\n",
    "## Question\n\nExample of this error: see the attached log. We would like to understand it.\n",
    "## Works\n\nTraining runs fine with DDP on 8 GPUs. Just a question about NCCL_P2P_LEVEL.\n",
    "## Hang?\n\nIt might hang with DDP on 8 GPUs, we have not tried yet.\n",
    "## NCCL\n\nTraining crashes with an NCCL error and NCCL picks the docker0 interface.\n",
])
def test_no_differential_when_the_state_is_not_asserted_or_a_cause_is_named(tmp_path: Path, text: str) -> None:
    ids = {r.id for r in _differential()}
    findings = _findings(tmp_path, text)
    assert not [f for f in findings if f.rule in ids], [(f.cause, f.rule) for f in findings]
    assert not [f for f in findings if f.severity in ("critical", "high")], findings


def test_every_differential_rule_is_a_low_prior_with_a_source_and_a_settling_probe() -> None:
    rules = _differential()
    assert len(rules) >= 20
    for r in rules:
        assert r.id.startswith("SYM") and 54 <= int(r.id[3:]) <= 130, r.id
        assert r.severity == "low" and 0.10 <= r.confidence < 0.2, (r.id, r.confidence)
        assert r.missing and "Source:" in r.doc, r.id
        assert playbook.get(r.cause) is not None, r.cause
        # it reads the firm state and steps back for a job said to run fine
        assert "firm_states" in r.when and "symptoms.healthy" in r.when, r.id


def test_differential_ranks_strictly_below_every_other_actionable_rule() -> None:
    """score = severity weight x confidence x coverage (doctor/engine/findings.py). Coverage is 1
    for a rule that names no ranks (every differential rule) and above 0.5 for one that names ranks
    of a partly seen job (0.5 + 0.5 x seen/world, seen >= 1): the best differential score must not
    exceed half of the weakest ranked rule's score, nor reach the weakest unranked one's."""
    diff = {r.id for r in _differential()}
    others = [r for r in load_ruleset().rules if r.id not in diff and r.severity in ACTIONABLE]
    assert all(r.ranks is None for r in _differential())
    best = max(SEVERITY_WEIGHT[r.severity] * r.confidence for r in _differential())
    unranked = min(SEVERITY_WEIGHT[r.severity] * r.confidence for r in others if not r.ranks)
    ranked = min(SEVERITY_WEIGHT[r.severity] * r.confidence * 0.5 for r in others if r.ranks)
    assert best < unranked and best <= ranked, (best, unranked, ranked)


def test_rank_findings_puts_a_partial_evidence_lead_above_the_differential() -> None:
    """The ordering in code: one rank of a 1024-rank job seen (coverage just above 0.5), a low
    rule naming that rank at the weakest ranked confidence, and the strongest differential rule."""
    from doctor.engine.findings import rank_findings
    from doctor.engine.rule import RuleResult

    rules = load_ruleset().rules
    diff = {r.id for r in _differential()}
    weakest = min((r for r in rules if r.id not in diff and r.ranks and r.severity in ACTIONABLE),
                  key=lambda r: SEVERITY_WEIGHT[r.severity] * r.confidence)
    strongest = max(_differential(), key=lambda r: r.confidence)
    facts = {"job": {"world_size": 1024, "n_ranks_seen": 1}}
    fired = [RuleResult(strongest, "fired", summary="prior"), RuleResult(weakest, "fired", ranks=[7], summary="lead")]
    ordered, _ = rank_findings(fired, facts)
    assert [f.rule for f in ordered] == [weakest.id, strongest.id], [(f.rule, f.score) for f in ordered]


def test_machine_evidence_and_topic_leads_stay_first_in_a_real_diagnosis(tmp_path: Path) -> None:
    """py-spy dumps of a real collective mismatch, and the prose's hang at the end of an epoch:
    the stacks' finding stays first and every differential finding comes after every other one."""
    src = FIX / "evidence" / "extra_collective"
    plain = diagnose_path(src).findings
    body = "".join(f"rank {i}:\n\n```\n{(src / f'pyspy-rank{i}.txt').read_text()}```\n\n" for i in range(4))
    findings = _findings(tmp_path, "Training hangs at the end of the epoch, after about 6 hours.\n\n" + body)
    assert (findings[0].cause, findings[0].ranks) == (plain[0].cause, plain[0].ranks)
    ids = {r.id for r in _differential()}
    kinds = ["diff" if f.rule in ids else "other" for f in findings if f.severity in ACTIONABLE]
    assert "diff" in kinds and kinds == sorted(kinds, key=lambda k: k == "diff"), kinds


def test_walkthrough_answers_reach_the_differential() -> None:
    """The TUI fills states/when/where but no phrases, topics or firm_states: the rules must evaluate
    (no error) and a hang at the end of an epoch still gets its first cause."""
    rs = load_ruleset()
    facts = facts_mod.empty_facts("loose", None)
    facts["symptoms"] = {"sources": ["walkthrough answers"], "states": ["hang"], "when": ["epoch_end"], "where": [],
                         "changed": [], "fixes": [], "tried": [], "state": "hang", "after_steps": None,
                         "phrases": []}
    ctx = celexpr.context(facts, rs.namespaces, rs.used)
    results = {r.id: evaluate(r, ctx, facts) for r in _differential()}
    assert not [k for k, v in results.items() if v.status == "error"], results
    fired = {next(r for r in _differential() if r.id == k).cause for k, v in results.items() if v.status == "fired"}
    assert fired == {"collective_mismatch", "dataloader_worker_deadlock", "rank_outside_collective"}, fired


@pytest.mark.parametrize("sentence,guessed", [
    ("It might hang at the end of the epoch.", True),
    ("Maybe it is just slow on the second node.", True),
    ("I am not sure whether it hangs or crashes.", True),
    ("If we use two nodes it hangs.", False),
    ("The job hangs at the end of the epoch.", False),
])
def test_a_state_only_supposed_is_marked_and_not_firm(sentence: str, guessed: bool) -> None:
    states = [p for p in read.phrases(sentence) if p.fact == "states"]
    assert states and all(p.asserted for p in states)
    assert states[0].guessed is guessed, states


@pytest.mark.parametrize("sentence,fact,value,found", [
    ("Training gets slower and slower.", "when", "gradual", True),
    ("The throughput keeps dropping.", "when", "gradual", True),
    ("The loss gradually decreases.", "when", "gradual", False),
    ("We train with fp16 and a GradScaler.", "context", "fp16", True),
    ("We train in bf16.", "context", "fp16", False),
    ("GPU utilization is around 30%.", "context", "low_gpu_util", True),
    ("GPU utilization is 98%.", "context", "low_gpu_util", False),
    ("CPU usage is 30%.", "context", "low_gpu_util", False),
    ("The learning rate is too high.", "context", "high_lr", True),
    ("The learning rate is 1e-4.", "context", "high_lr", False),
    ("We do not use torch.compile.", "context", "compile", None),
])
def test_context_vocabulary(sentence: str, fact: str, value: str, found: bool | None) -> None:
    """found None: the phrase is read but not asserted (negated)."""
    hits = [p for p in read.phrases(sentence) if p.fact == fact and p.value == value]
    if found is None:
        assert hits and not hits[0].asserted
    else:
        assert bool(hits and hits[0].asserted) is found, hits


def test_only_differential_findings_make_an_inconclusive_report_that_says_so(tmp_path: Path) -> None:
    """A guess from the reporter's words is not a finding: the headline says "not confirmed", the
    report exits 3 (inconclusive), and each finding carries ``differential: true`` in the JSON.
    With machine evidence beside it (a real watchdog line), the evidence finding comes first and
    the report exits 1."""
    (tmp_path / "issue.md").write_text("# Training hangs\n\nOur DDP training on 8 GPUs hangs at step 1200. "
                                       "There is no error message, it just stops printing.\n")
    rep = diagnose_path(tmp_path / "issue.md")
    assert rep.findings and all(f.differential for f in rep.findings)
    assert rep.verdict["summary"].startswith("Possible cause, not confirmed: ")
    assert rep.exit_code == 3
    assert all(f["differential"] is True for f in rep.to_json()["findings"])
    (tmp_path / "train.log").write_text(
        "[rank1]:[E ProcessGroupNCCL.cpp:1414] [PG 0 Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=3110, OpType=ALLREDUCE, NumelIn=4194304, NumelOut=4194304, Timeout(ms)=600000) ran for "
        "600016 milliseconds before timing out.\n")
    rep = diagnose_path(tmp_path)
    assert not rep.findings[0].differential and rep.exit_code == 1
    flags = [f.differential for f in rep.findings]
    assert flags == sorted(flags)  # every differential after every finding read from evidence


def test_evidence_findings_come_first_and_the_crash_base_rate_adds_alternatives(tmp_path: Path) -> None:
    """A real device-side assert log pasted under a plain crash report: the log's finding is first,
    and the crash fallback (the state alone) still adds its alternatives, each after it."""
    log = (FIX / "logs" / "cuda_assert" / "torchrun.log").read_text()
    findings = _findings(tmp_path, "## Training dies\n\nOur training crashes at step 500 every time.\n\n"
                                   f"```\n{log}```\n")
    assert findings[0].cause == "cuda_kernel_fault" and not findings[0].differential, findings[0]
    flags = [f.differential for f in findings]
    assert True in flags and flags == sorted(flags), [(f.cause, f.rule) for f in findings]
    assert "host_oom" in [f.cause for f in findings if f.differential]


@pytest.mark.parametrize("sentence,fact,value,found", [
    ("We train with DDP on 4 GPUs.", "context", "multi_gpu", True),
    ("We train on a single GPU.", "context", "multi_gpu", False),
    ("The loader runs with num_workers=8.", "context", "dataloader", True),
    ("The loader runs with num_workers=0.", "context", "dataloader", False),
    ("DDP on 4 GPUs is slower than a single GPU.", "context", "scaling", True),
    ("Training on 8 GPUs is fast.", "context", "scaling", False),
    ("It dies with Segmentation fault (core dumped).", "context", "crash_segfault", True),
    ("torchrun reports exitcode: -9 for rank 2.", "context", "crash_killed", True),
    ("It fails with ncclSystemError: unhandled system error.", "context", "crash_nccl", True),
    ("We use NCCL version 2.18.1.", "context", "crash_nccl", False),
    ("It fails with a CUDA error.", "context", "crash_cuda", True),
    ("It hangs right at the start.", "when", "init", True),
    ("It slows down at the start of each epoch.", "when", "init", False),
    ("It seems to be at the beginning of prepare_data.", "when", "init", False),
    ("The job hangs after 3 epochs.", "when", "epoch_end", True),
    ("We train for 3 epochs.", "when", "epoch_end", False),
])
def test_context_vocabulary_of_the_fallbacks(sentence: str, fact: str, value: str, found: bool) -> None:
    hits = [p for p in read.phrases(sentence) if p.fact == fact and p.value == value and p.asserted]
    assert bool(hits) is found, read.phrases(sentence)


def test_every_state_has_a_base_rate_fallback_of_up_to_three_causes() -> None:
    """Each state's fallback rules (a plain state, nothing covered) exist and name distinct causes."""
    rules = _differential()
    for state, names in {"hung": "differential-plain-hang", "crashed": "differential-plain-crash",
                         "slow": "differential-plain-slow", "diverging": "differential-plain-diverge"}.items():
        causes = [r.cause for r in rules if r.name.startswith(names) and r.state == state]
        assert 2 <= len(causes) <= 3 and len(set(causes)) == len(causes), (state, causes)
