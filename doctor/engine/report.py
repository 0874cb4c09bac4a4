"""The one report model every output is rendered from (terminal, Markdown, HTML, JSON)."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

from doctor import __version__
from doctor.engine.findings import ACTIONABLE, Finding

SCHEMA = "mldoctor.report/1"
#: What ``rule_results[].status`` may say. "passed" (evaluated, did not fire) and "not_evaluable"
#: (the facts it needs are missing) are kept apart: a rule that could not look is not a clean bill.
RULE_STATUSES = ("fired", "passed", "not_evaluable", "error")


@dataclass
class Report:
    verdict: dict[str, str]
    findings: list[Finding]
    facts: dict[str, Any]
    source: dict[str, Any]
    not_evaluable: list[dict[str, str]] = field(default_factory=list)
    rule_errors: list[dict[str, str]] = field(default_factory=list)
    probes: list[dict[str, Any]] = field(default_factory=list)
    trace: list[dict[str, Any]] = field(default_factory=list)
    timing: dict[str, float] = field(default_factory=dict)
    #: Every rule's outcome ({rule, cause, status, reason}), status one of RULE_STATUSES.
    rule_results: list[dict[str, str]] = field(default_factory=list)
    #: The key a written report.json carried (kept when it is rendered again, even without the
    #: facts the key was computed from); empty: computed by ``incident_key``.
    key: str = ""
    #: Probes that fired rules ask for (the agent's next round); not part of the JSON.
    follow_ups: list[dict[str, Any]] = field(default_factory=list)
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    @property
    def exit_code(self) -> int:
        actionable = [f for f in self.findings if f.severity in ACTIONABLE]
        if actionable and not all(getattr(f, "differential", False) for f in actionable):
            return 1
        if actionable:
            return 3  # only differential priors: a guess from the reporter's words is inconclusive
        # No finding: 0 only when the job looks healthy; any other state is inconclusive.
        return 0 if self.verdict.get("state") == "healthy" else 3

    def ranks(self) -> dict[str, dict[str, Any]]:
        """Per-rank view merged from every namespace's ``by_rank`` map."""
        out: dict[str, dict[str, Any]] = {}
        for ns, value in self.facts.items():
            if isinstance(value, dict) and isinstance(value.get("by_rank"), dict):
                for rank, info in value["by_rank"].items():
                    out.setdefault(str(rank), {})[ns] = info
        return dict(sorted(out.items(), key=lambda kv: (len(kv[0]), kv[0])))

    def to_json(self, include_facts: bool = False) -> dict[str, Any]:
        ev = self.facts.get("evidence", {})
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "tool": {"name": "mldoctor", "version": __version__},
            "created": self.created,
            "source": self.source,
            "verdict": {"state": self.verdict["state"], "summary": self.verdict["summary"],
                        **({"missing": self.verdict["missing"]} if self.verdict.get("missing") else {})},
            "findings": [
                {
                    "cause": f.cause, "title": f.title, "category": f.category, "severity": f.severity,
                    "confidence": f.confidence, "score": f.score, "rule": f.rule,
                    "ranks": f.ranks, "hosts": f.hosts, "gpus": f.gpus, "summary": f.summary,
                    "evidence": f.evidence, "fix": f.fix, "also_fired": f.also_fired,
                    **({"missing": f.missing} if f.missing else {}),
                    **({"differential": True} if getattr(f, "differential", False) else {}),
                }
                for f in self.findings
            ],
            "ranks": self.ranks(),
            "job": self.facts.get("job", {}),
            "probes": self.probes,
            "evidence": {
                "kinds": ev.get("kinds", []), "files": ev.get("files", 0),
                "ignored": ev.get("ignored", []), "errors": ev.get("errors", []),
            },
            "incident_key": self.key or incident_key(self),
            "not_evaluable": self.not_evaluable,
            "rule_errors": self.rule_errors,
            "rule_results": self.rule_results,
            "trace": self.trace,
            "timing_s": {k: round(v, 4) for k, v in self.timing.items()},
        }
        if include_facts:
            out["facts"] = self.facts
        return out


def job_identity(report: Report) -> str:
    """Who the job is, for ``incident_key``: the scheduler's or launcher's job id the evidence
    names (SLURM_JOB_ID, TORCHELASTIC_RUN_ID through the probes' ``job_label``), else the SLURM
    job or launcher the live target named, plus the world size. Never a path or a time: the same
    evidence moved to another folder, or diagnosed again tomorrow, is the same job."""
    from doctor.evidence import plugins  # the registry only when a key is asked for

    label = ""
    for probe in plugins.probes():
        try:
            label = probe.job_label(report.facts) or ""
        except Exception:  # one probe's answer must never cost the report
            label = ""
        if label:
            break
    target = (report.source or {}).get("target") or {}
    if not label and isinstance(target, dict):
        for key in ("slurm_job", "job"):
            if target.get(key):
                label = f"{key}={target[key]}@{target.get('host', '')}" if key == "job" else str(target[key])
                break
    world = (report.facts.get("job") or {}).get("world_size") or 0
    return f"{label}|world={world}"


def incident_key(report: Report) -> str:
    """A stable id for de-duplicating incidents: ``mldi-`` + 16 hex digits of a hash of the top
    cause (or the verdict state when nothing fired), its culprit set and the job's identity.
    Re-running on the same evidence gives the same key; another cause, other culprits or another
    job give another. Culprit hosts count only when the finding names no ranks, so a bundle
    re-read with host names aliased (--redact-hosts) still maps to the same incident."""
    top = report.findings[0] if report.findings else None
    basis = {
        "cause": top.cause if top else f"state:{report.verdict.get('state', 'unknown')}",
        "ranks": sorted(top.ranks) if top else [],
        "hosts": sorted(top.hosts) if top and not top.ranks else [],
        "gpus": sorted(top.gpus) if top and not top.ranks and not top.hosts else [],
        "job": job_identity(report),
    }
    digest = hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()
    return f"mldi-{digest[:16]}"


# -- loading a written report.json ----------------------------------------------------------------
#: report.json is mldoctor's own output: the facts it writes are capped far below this depth
#: (``output.clean_value``), so a deeper document was not written by it, and walking one would
#: hit Python's recursion limit somewhere in a renderer (an internal error instead of exit 2).
MAX_DOC_DEPTH = 200

_STR_FIELDS = ("cause", "rule", "rule_name", "title", "category", "severity", "state", "summary", "missing")
_NUM_FIELDS = ("confidence", "score")
_LIST_FIELDS = ("ranks", "hosts", "gpus", "evidence", "fix", "also_fired")
_MAPS = ("verdict", "facts", "source", "job", "evidence", "ranks", "timing_s", "bundle", "tool")
_LISTS_OF_MAPS = ("not_evaluable", "rule_errors", "rule_results", "probes", "trace")


def _depth_over(doc: Any, limit: int) -> bool:
    """Whether ``doc`` nests deeper than ``limit`` (iterative: the check itself must not recurse)."""
    stack = [(doc, 1)]
    while stack:
        obj, d = stack.pop()
        if d > limit:
            return True
        if isinstance(obj, dict):
            stack.extend((v, d + 1) for v in obj.values())
        elif isinstance(obj, list):
            stack.extend((v, d + 1) for v in obj)
    return False


def _kind(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(v), "a number")


def doc_problem(doc: Any) -> str | None:
    """The first way ``doc`` differs from the shape mldoctor writes report.json in, as a short
    phrase naming the field (``findings[0].confidence is a string, not a number``); None when
    it can be rendered. Why check up front: every renderer reads these fields with their
    written types, so a hand-edited or hostile report.json must be refused in one line (exit 2),
    not crash a renderer half-way (exit 4, which says "a bug in mldoctor")."""
    if not isinstance(doc, dict):
        return f"the document is {_kind(doc)}, not an object"
    if _depth_over(doc, MAX_DOC_DEPTH):
        return f"nested deeper than {MAX_DOC_DEPTH} levels"
    for key in _MAPS:
        if doc.get(key) is not None and not isinstance(doc[key], dict):
            return f"{key} is {_kind(doc[key])}, not an object"
    for key in _LISTS_OF_MAPS:
        val = doc.get(key)
        if val is None:
            continue
        if not isinstance(val, list):
            return f"{key} is {_kind(val)}, not a list"
        for i, item in enumerate(val):
            if not isinstance(item, dict):
                return f"{key}[{i}] is {_kind(item)}, not an object"
    for key in ("state", "summary", "missing"):
        v = (doc.get("verdict") or {}).get(key)
        if v is not None and not isinstance(v, str):
            return f"verdict.{key} is {_kind(v)}, not a string"
    if doc.get("created") is not None and not isinstance(doc["created"], str):
        return f"created is {_kind(doc['created'])}, not a string"
    for k, v in (doc.get("ranks") or {}).items():
        if v is not None and not isinstance(v, dict):
            return f"ranks.{k} is {_kind(v)}, not an object"
    facts = doc.get("facts") or {}
    for key in ("job", "evidence", "meta"):
        if facts.get(key) is not None and not isinstance(facts[key], dict):
            return f"facts.{key} is {_kind(facts[key])}, not an object"
    findings = doc.get("findings")
    if findings is None:
        return None
    if not isinstance(findings, list):
        return f"findings is {_kind(findings)}, not a list"
    for i, f in enumerate(findings):
        problem = _finding_problem(f)
        if problem:
            return f"findings[{i}]{problem}"
    return None


def _finding_problem(f: Any) -> str | None:
    if not isinstance(f, dict):
        return f" is {_kind(f)}, not an object"
    for key in _STR_FIELDS:
        if f.get(key) is not None and not isinstance(f[key], str):
            return f".{key} is {_kind(f[key])}, not a string"
    for key in _NUM_FIELDS:
        v = f.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            return f".{key} is {_kind(v)}, not a number"
    for key in _LIST_FIELDS:
        v = f.get(key)
        if v is None:
            continue
        if not isinstance(v, list):
            return f".{key} is {_kind(v)}, not a list"
        for x in v:
            if key == "ranks" and (isinstance(x, bool) or not isinstance(x, int)):
                return f".ranks holds {_kind(x)}, not a rank number"
            if isinstance(x, (dict, list)) or x is None:
                return f".{key} holds {_kind(x)}, not a plain value"
    return None
