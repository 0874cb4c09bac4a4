"""From fired rules to ranked findings and a verdict.

Ranking: score = severity weight x confidence x coverage, where coverage discounts a verdict
about culprit ranks when the evidence speaks for only part of the job (0.5 + 0.5 x seen/world).
Suppression: a rule naming a root cause hides the symptom causes it lists in ``suppresses``;
the hidden findings stay in the trace so the reasoning is visible.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from doctor import playbook as playbooks
from doctor import taxonomy
from doctor.rule import RuleResult

SEVERITY_WEIGHT = {"critical": 1.0, "high": 0.8, "medium": 0.6, "low": 0.4, "info": 0.1}
ACTIONABLE = ("critical", "high", "medium", "low")
#: Evidence kinds that can show what state a job is in; others (env, system) only show settings.
STATE_EVIDENCE = {"stacks", "flight_recorder", "logs", "metrics", "samples"}


@dataclass
class Finding:
    cause: str
    rule: str
    rule_name: str
    title: str
    category: str
    severity: str
    confidence: float
    score: float
    state: str
    ranks: list[int]
    hosts: list[str]
    gpus: list[str]
    summary: str
    evidence: list[str]
    fix: list[str]
    also_fired: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _coverage(res: RuleResult, facts: dict[str, Any]) -> float:
    job = facts.get("job", {})
    ws, seen = job.get("world_size") or 0, job.get("n_ranks_seen") or 0
    if not res.ranks or not ws or not seen:
        return 1.0
    return 0.5 + 0.5 * min(1.0, seen / ws)


def _hosts_of(ranks: list[int], facts: dict[str, Any]) -> list[str]:
    """The culprit ranks' hosts, when the rule names ranks but no hosts (multi-node evidence)."""
    where = (facts.get("job") or {}).get("rank_hosts") or {}
    return sorted({where[str(r)] for r in ranks if str(r) in where}) if len(set(where.values())) > 1 else []


def rank_findings(results: list[RuleResult], facts: dict[str, Any]) -> tuple[list[Finding], list[str]]:
    """Findings most likely first, one per cause, and trace lines for what was suppressed."""
    trace: list[str] = []
    observed = (facts.get("job") or {}).get("observed_state") or ""
    fired = []
    # First set aside what the observation contradicts: a set-aside rule must not hide others.
    for r in (r for r in results if r.status == "fired"):
        if observed == "progressing" and r.rule.state == "hung":
            trace.append(f"{r.rule.id} ({r.rule.cause}) set aside: it means a hang, but the stacks moved between snapshots")
        elif observed == "hung" and r.rule.state == "slow":
            trace.append(f"{r.rule.id} ({r.rule.cause}) set aside: it means slow progress, but most ranks' stacks "
                         "stayed frozen between snapshots")
        else:
            fired.append(r)
    suppressed_by: dict[str, str] = {}
    for r in fired:
        for cause in r.rule.suppresses:
            if cause != r.rule.cause:
                suppressed_by.setdefault(cause, r.rule.id)
    by_cause: dict[str, Finding] = {}
    for r in fired:
        if r.rule.cause in suppressed_by:
            trace.append(f"{r.rule.id} ({r.rule.cause}) suppressed by {suppressed_by[r.rule.cause]}")
            continue
        score = SEVERITY_WEIGHT[r.rule.severity] * r.rule.confidence * _coverage(r, facts)
        pb = playbooks.get(r.rule.cause) or {}
        f = Finding(
            cause=r.rule.cause, rule=r.rule.id, rule_name=r.rule.name,
            title=str(pb.get("title") or r.rule.cause.replace("_", " ")),
            category=taxonomy.causes().get(r.rule.cause, ""), severity=r.rule.severity,
            confidence=round(r.rule.confidence, 3), score=round(score, 4), state=r.rule.state,
            ranks=r.ranks, hosts=r.hosts or _hosts_of(r.ranks, facts), gpus=r.gpus, summary=r.summary,
            evidence=r.evidence,
            fix=playbooks.fix_steps(r.rule.cause),
        )
        prev = by_cause.get(f.cause)
        if prev is None or f.score > prev.score:
            if prev is not None:
                f.also_fired = prev.also_fired + [prev.rule]
            by_cause[f.cause] = f
        else:
            prev.also_fired.append(f.rule)
    ordered = sorted(by_cause.values(), key=lambda f: (-f.score, f.rule))
    return ordered, trace


def verdict(findings: list[Finding], facts: dict[str, Any], evaluable: int) -> dict[str, str]:
    """The job's state and a one-line summary; an observed state from live probes wins."""
    actionable = [f for f in findings if f.severity in ACTIONABLE]
    observed = (facts.get("job") or {}).get("observed_state") or ""
    if actionable:
        top = actionable[0]
        state = observed if observed in ("hung", "crashed") else top.state
        culprits = ""
        if top.ranks:
            from doctor.rule import format_ranks

            culprits = f" on rank{'s' if len(top.ranks) > 1 else ''} {format_ranks(top.ranks)}"
        if top.hosts:
            culprits += f" ({', '.join(top.hosts[:4])}{'...' if len(top.hosts) > 4 else ''})"
        return {"state": state, "summary": f"{top.title}{culprits}: {top.summary}", "cause": top.cause}
    if evaluable == 0 or not facts.get("evidence", {}).get("kinds"):
        return {"state": observed if observed in ("hung", "crashed") else "unknown",
                "summary": "Not enough evidence to judge: no rule could be evaluated on what was found.",
                "cause": ""}
    kinds = set(facts.get("evidence", {}).get("kinds") or [])
    if observed in ("", "progressing") and not (observed == "progressing" or kinds & STATE_EVIDENCE):
        return {"state": "unknown", "cause": "",
                "summary": f"No rule fired, but the evidence ({', '.join(sorted(kinds))}) cannot show whether "
                           "the job is hung, slow or healthy; add stacks, logs, metrics or flight-recorder dumps."}
    logs = facts.get("logs") or {}
    cascade = next((e for e in logs.get("events") or [] if e.get("role") == "cascade"), None)
    if observed in ("", "progressing") and (logs.get("waits") or logs.get("first_failure") or logs.get("first_error")
                                            or cascade):
        # Errors in the logs are not a healthy job, even when no rule can name their cause; nor
        # are errors that only follow someone else's failure (a peer lost, a remote error).
        first = logs.get("first_failure") or logs.get("first_error") or cascade or {}
        state = "hung" if logs.get("waits") and not logs.get("exited_ranks") else "crashed"
        what = str(first.get("text") or first.get("kind") or "errors")
        what = what if len(what) <= 160 else what[:159].rstrip() + "…"
        return {"state": state, "cause": "",
                "summary": f"The logs show a failure ({what}) but no rule names its cause; see the evidence below."}
    state = "healthy" if observed in ("", "progressing") else observed
    msg = ("No problem found in the evidence." if state == "healthy"
           else f"The job looks {state}, but no rule names a cause; see the evidence below.")
    return {"state": state, "summary": msg, "cause": ""}
