"""The one report model every output is rendered from (terminal, Markdown, HTML, JSON)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from doctor import __version__
from doctor.engine.findings import ACTIONABLE, Finding

SCHEMA = "mldoctor.report/1"


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
    #: Probes that fired rules ask for (the agent's next round); not part of the JSON.
    follow_ups: list[dict[str, Any]] = field(default_factory=list)
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    @property
    def exit_code(self) -> int:
        if any(f.severity in ACTIONABLE for f in self.findings):
            return 1
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
            "verdict": {"state": self.verdict["state"], "summary": self.verdict["summary"]},
            "findings": [
                {
                    "cause": f.cause, "title": f.title, "category": f.category, "severity": f.severity,
                    "confidence": f.confidence, "score": f.score, "rule": f.rule,
                    "ranks": f.ranks, "hosts": f.hosts, "gpus": f.gpus, "summary": f.summary,
                    "evidence": f.evidence, "fix": f.fix, "also_fired": f.also_fired,
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
            "not_evaluable": self.not_evaluable,
            "rule_errors": self.rule_errors,
            "trace": self.trace,
            "timing_s": {k: round(v, 4) for k, v in self.timing.items()},
        }
        if include_facts:
            out["facts"] = self.facts
        return out
