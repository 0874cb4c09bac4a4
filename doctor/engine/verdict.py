"""Engine policy: how observations and findings become the job's state. All of it is here.

Rules name causes; this module decides what the job *is* when rules and live observation meet:

1. **Set aside** (before suppression, so a set-aside rule hides nothing): a fired rule whose
   state contradicts what live snapshots saw is kept out of the findings, with a trace line:
   a "hung" rule when the stacks moved between snapshots, a "slow" rule when most ranks stayed
   frozen.
2. **Verdict**: with an actionable finding, its state (an observed hang or crash wins over the
   rule's state) and its summary. Without one:
   - no rule could be evaluated: "unknown";
   - only kinds that cannot show a state (settings such as env or system, a ticket's prose):
     "unknown", never healthy, unless one of them reports a state (the reporter says it crashes);
   - a kind whose evidence still shows trouble (``Probe.unexplained_state``: e.g. log errors no
     rule names): that state, with "no rule names its cause";
   - part of the evidence left unread (past the loose-file cap): "unknown", never healthy;
   - otherwise healthy (or the observed state, named without a cause).
3. **Missing evidence**: the verdict carries ``missing``, one sentence on what would settle it.
   With a finding it is the top finding's own (its rule's ``missing``). Without one, when the
   evidence is partial (one rank of a larger or unknown job, ranks with no evidence, or kinds that
   cannot show a state), it names the absent kinds through their ``Probe.settles`` sentence, so a
   partial input gets "this is what would decide" instead of a bare "nothing found".

Why in Python and not in YAML rules: these are not causes (no taxonomy id, no playbook); they
decide how findings combine. Each branch is covered by tests in tests/test_engine.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from doctor.engine.rule import format_ranks
from doctor.evidence import plugins

if TYPE_CHECKING:
    from doctor.engine.rule import RuleResult

ACTIONABLE = ("critical", "high", "medium", "low")


def set_aside(fired: list[RuleResult], facts: dict[str, Any]) -> tuple[list[RuleResult], list[str]]:
    """Fired rules the live observation does not contradict, and trace lines for the others."""
    observed = (facts.get("job") or {}).get("observed_state") or ""
    kept, trace = [], []
    for r in fired:
        if observed == "progressing" and r.rule.state == "hung":
            trace.append(f"{r.rule.id} ({r.rule.cause}) set aside: it means a hang, but the stacks moved between snapshots")
        elif observed == "hung" and r.rule.state == "slow":
            trace.append(f"{r.rule.id} ({r.rule.cause}) set aside: it means slow progress, but most ranks' stacks "
                         "stayed frozen between snapshots")
        else:
            kept.append(r)
    return kept, trace


def state_kinds() -> set[str]:
    """Evidence kinds that can show what state a job is in (``Probe.shows_state``)."""
    return {p.name for p in plugins.probes() if p.shows_state}


def _trouble_verdict(trouble: dict[str, str]) -> dict[str, str]:
    what = trouble.get("what") or "errors"
    what = what if len(what) <= 160 else what[:159].rstrip() + "…"
    return {"state": trouble.get("state") or "unknown", "cause": "",
            "summary": trouble.get("summary")  # a kind may word it itself (the check kind: all skipped)
            or f"The logs show a failure ({what}) but no rule names its cause; see the evidence below."}


def _unexplained(facts: dict[str, Any]) -> dict[str, str] | None:
    kinds = set((facts.get("evidence") or {}).get("kinds") or [])
    for probe in plugins.probes():
        if probe.name not in kinds:
            continue
        try:
            found = probe.unexplained_state(facts)
        except Exception:  # a probe's opinion must never break the verdict
            continue
        if found:
            return found
    return None


def _partial_ranks(facts: dict[str, Any]) -> str:
    """How the evidence falls short of the whole job, as a phrase ('' when it does not)."""
    job = facts.get("job") or {}
    missing = [r for r in job.get("missing_ranks") or [] if isinstance(r, int)]
    if missing:
        return f"no evidence from rank{'s' if len(missing) > 1 else ''} {format_ranks(missing)}"
    seen = [r for r in job.get("ranks_seen") or [] if isinstance(r, int)]
    if len(seen) == 1 and (job.get("world_size") or 0) != 1:
        return f"only rank {seen[0]} was seen, not its peers"
    return ""


def missing_evidence(facts: dict[str, Any]) -> str:
    """With no finding: what evidence would decide, or '' when the evidence looks complete
    enough (every rank seen and at least two kinds that show a state). Why: a partial input
    (one stack, an env dump) that yields "no problem found" reads as a clean bill; naming the
    absent kinds and how to collect them tells the user the diagnosis is open, and how to close it."""
    kinds = set((facts.get("evidence") or {}).get("kinds") or [])
    if not kinds:
        return ""
    partial = _partial_ranks(facts)
    present = kinds & state_kinds()
    if not partial and len(present) >= 2:
        return ""
    absent = [p for p in plugins.probes() if p.shows_state and p.settles and p.name not in kinds]
    parts = []
    if partial:
        parts.append(f"{partial[0].upper()}{partial[1:]}: their evidence of the same kind would decide.")
    if absent and (partial or len(present) < 2):
        parts.append("Not read: " + "; ".join(p.settles for p in absent[:3]) + ".")
    return " ".join(parts)[:900]


def verdict(findings: list[Any], facts: dict[str, Any], evaluable: int) -> dict[str, str]:
    """The job's state, a one-line summary and, where the evidence is partial, what is missing."""
    out = _verdict(findings, facts, evaluable)
    actionable = [f for f in findings if f.severity in ACTIONABLE]
    missing = (getattr(actionable[0], "missing", "") if actionable else "") or (
        "" if actionable else missing_evidence(facts))
    if missing:
        out["missing"] = missing
    return out


def _verdict(findings: list[Any], facts: dict[str, Any], evaluable: int) -> dict[str, str]:
    actionable = [f for f in findings if f.severity in ACTIONABLE]
    observed = (facts.get("job") or {}).get("observed_state") or ""
    if actionable:
        top = actionable[0]
        state = observed if observed in ("hung", "crashed") else top.state
        culprits = ""
        if top.ranks:
            culprits = f" on rank{'s' if len(top.ranks) > 1 else ''} {format_ranks(top.ranks)}"
        if top.hosts:
            culprits += f" ({', '.join(top.hosts[:4])}{'...' if len(top.hosts) > 4 else ''})"
        # A low-severity finding that cannot tell the job's state (partial evidence) is a lead,
        # and the headline says so rather than stating the cause as fact.
        # So is a differential prior (the usual cause of what the reporter describes).
        lead = "Possible cause, not confirmed: " if (top.severity == "low" and top.state == "unknown") or getattr(
            top, "differential", False) else ""
        return {"state": state, "summary": f"{lead}{top.title}{culprits}: {top.summary}", "cause": top.cause}
    if evaluable == 0 or not facts.get("evidence", {}).get("kinds"):
        return {"state": observed if observed in ("hung", "crashed") else "unknown",
                "summary": "Not enough evidence to judge: no rule could be evaluated on what was found.",
                "cause": ""}
    kinds = set(facts.get("evidence", {}).get("kinds") or [])
    trouble = _unexplained(facts) if observed in ("", "progressing") else None
    if observed in ("", "progressing") and not (observed == "progressing" or kinds & state_kinds()):
        if trouble:  # a kind that cannot show a state on its own may still report one (a ticket's words)
            return _trouble_verdict(trouble)
        return {"state": "unknown", "cause": "",
                "summary": f"No rule fired, but the evidence ({', '.join(sorted(kinds))}) cannot show whether "
                           "the job is hung, slow or healthy; add stacks, logs, metrics or flight-recorder dumps."}
    if trouble:
        return _trouble_verdict(trouble)
    if (facts.get("evidence") or {}).get("incomplete") and observed in ("", "progressing"):
        return {"state": "unknown", "cause": "",
                "summary": "No rule fired on what was read, but part of the evidence was left unread "
                           "(see the evidence errors); diagnose a smaller folder or the files that matter."}
    state = "healthy" if observed in ("", "progressing") else observed
    msg = ("No problem found in the evidence." if state == "healthy"
           else f"The job looks {state}, but no rule names a cause; see the evidence below.")
    return {"state": state, "summary": msg, "cause": ""}
