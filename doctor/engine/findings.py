"""From fired rules to ranked findings and a verdict.

Ranking: score = severity weight x confidence x coverage, where coverage discounts a verdict
about culprit ranks when the evidence speaks for only part of the job (0.5 + 0.5 x seen/world).
Suppression: a rule naming a root cause hides the symptom causes it lists in ``suppresses`` (when
two fired rules list each other's cause, the higher score hides the lower);
the hidden findings stay in the trace so the reasoning is visible.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from doctor.engine import playbook as playbooks
from doctor.engine import taxonomy
from doctor.engine.rule import RuleResult
from doctor.engine.verdict import ACTIONABLE, set_aside  # noqa: F401 (ACTIONABLE re-exported)

SEVERITY_WEIGHT = {"critical": 1.0, "high": 0.8, "medium": 0.6, "low": 0.4, "info": 0.1}


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
    #: What evidence the rule lacked and what would settle it ('' when the rule needs nothing more).
    missing: str = ""
    #: A prior from the reporter's words alone (a rule tagged ``differential``): the most common
    #: cause of what they describe, not evidence of it; it always ranks after every other finding.
    differential: bool = False

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
    # First set aside what the observation contradicts: a set-aside rule must not hide others.
    fired, trace = set_aside([r for r in results if r.status == "fired"], facts)
    scores = {id(r): SEVERITY_WEIGHT[r.rule.severity] * r.rule.confidence * _coverage(r, facts) for r in fired}
    suppressors: dict[str, list[RuleResult]] = {}
    for r in fired:
        for cause in r.rule.suppresses:
            if cause != r.rule.cause:
                suppressors.setdefault(cause, []).append(r)
    by_cause: dict[str, Finding] = {}
    for r in fired:
        # Two rules that each name the other's cause as a consequence of their own disagree on
        # which is the root (a rank's OOM and the hang it left behind): the higher score stays
        # and hides the other, instead of both hiding each other.
        hiders = [s for s in suppressors.get(r.rule.cause, [])
                  if not (s.rule.cause in r.rule.suppresses and scores[id(r)] > scores[id(s)])]
        if hiders:
            trace.append(f"{r.rule.id} ({r.rule.cause}) suppressed by {hiders[0].rule.id}")
            continue
        score = scores[id(r)]
        pb = playbooks.get(r.rule.cause) or {}
        f = Finding(
            cause=r.rule.cause, rule=r.rule.id, rule_name=r.rule.name,
            title=str(pb.get("title") or r.rule.cause.replace("_", " ")),
            category=taxonomy.causes().get(r.rule.cause, ""), severity=r.rule.severity,
            confidence=round(r.rule.confidence, 3), score=round(score, 4), state=r.rule.state,
            ranks=r.ranks, hosts=r.hosts or _hosts_of(r.ranks, facts), gpus=r.gpus, summary=r.summary,
            evidence=r.evidence,
            fix=playbooks.fix_steps(r.rule.cause), missing=r.missing,
            differential="differential" in r.rule.tags,
        )
        prev = by_cause.get(f.cause)
        if prev is None or f.score > prev.score:
            if prev is not None:
                f.also_fired = prev.also_fired + [prev.rule]
            by_cause[f.cause] = f
        else:
            prev.also_fired.append(f.rule)
    # A differential prior never outranks a finding read from evidence (or a cause the reporter
    # names), whatever its confidence: the order is guaranteed here, not only by the scale.
    ordered = sorted(by_cause.values(), key=lambda f: (f.differential, -f.score, f.rule))
    return ordered, trace
