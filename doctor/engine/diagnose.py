"""The offline half of the flow: evidence -> facts -> rules -> findings -> report.

Live diagnosis (``doctor.live.agent``) collects a bundle first and then calls :func:`analyze`, so a
verdict on the cluster and a verdict from the saved bundle come from the same code.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from doctor.engine import facts as facts_mod
from doctor.engine import ruleset as engine
from doctor.engine.findings import rank_findings
from doctor.engine.report import Report
from doctor.engine.trace import Trace
from doctor.engine.verdict import verdict
from doctor.evidence.bundle import Bundle
from doctor.evidence.errors import UserError


def gather_items(path: Path, logs: list[Path] | None = None) -> tuple[list[facts_mod.Item], dict[str, Any], list[dict[str, Any]], Bundle | None]:
    """Items from a bundle (dir or archive) or a loose folder/file, plus extra log paths."""
    if not path.exists():
        raise UserError(f"{path}: no such file or folder")
    bundle = None
    if Bundle.is_bundle(path):
        bundle = Bundle.load(path)  # checks the manifest: paths inside, regular files only
        try:
            items = facts_mod.items_from_bundle(bundle)
        except BaseException:  # the unpacked archive must not outlive an error
            if bundle.unpacked is not None:
                shutil.rmtree(bundle.unpacked, ignore_errors=True)
            raise
        source = {"type": "bundle", "path": str(path), "target": bundle.manifest.get("target", {}),
                  "created": bundle.manifest.get("created")}
        probe_runs = list(bundle.manifest.get("probes", []))
    else:
        items = facts_mod.items_from_folder(path)
        source = {"type": "loose", "path": str(path)}
        probe_runs = []
    for extra in logs or []:
        if not extra.exists():
            raise UserError(f"{extra}: no such file or folder (given with --logs)")
        items.extend(facts_mod.items_from_folder(extra))
    return items, source, probe_runs, bundle


def analyze(items: list[facts_mod.Item], source: dict[str, Any], symptom: str | None = None,
            probe_runs: list[dict[str, Any]] | None = None, rules_dirs: list[Path] | None = None,
            trace: Trace | None = None, extra_facts: dict[str, Any] | None = None) -> Report:
    trace = trace or Trace()
    ruleset = engine.load_ruleset(rules_dirs)
    t0 = time.perf_counter()
    facts, timing = facts_mod.build(items, source.get("type", "loose"), symptom, probe_runs)
    for key, value in (extra_facts or {}).items():
        if isinstance(value, dict) and isinstance(facts.get(key), dict):
            for k, v in value.items():  # lists add up (a ticket's symptoms and the TUI's answers)
                have = facts[key].get(k)
                if isinstance(have, list) and isinstance(v, list):
                    facts[key][k] = have + [x for x in v if x not in have]
                elif v or not have:  # an empty answer never hides what the evidence said
                    facts[key][k] = v
        else:
            facts[key] = value
    t_facts = time.perf_counter() - t0
    ev = facts["evidence"]
    trace.add("parse", f"{ev['files']} file(s) used as {', '.join(ev['kinds']) or 'nothing'}; "
                       f"{len(ev['ignored'])} ignored, {len(ev['errors'])} unusable")
    for line in (ev.get("documents") or [])[:50]:  # a ticket's pieces: where each finding's evidence was
        trace.add("ticket", f"read {line}")
    results, t_rules = engine.evaluate_all(ruleset, facts)
    fired = [r for r in results if r.status == "fired"]
    not_eval = [r for r in results if r.status == "not_evaluable"]
    errors = [r for r in results if r.status == "error"]
    trace.add("rules", f"{len(results)} rules: {len(fired)} fired, {len(not_eval)} not evaluable, "
                       f"{len(errors)} failed", fired=[r.rule.id for r in fired])
    findings, suppressed = rank_findings(results, facts)
    for line in suppressed:
        trace.add("suppress", line)
    evaluable = len(results) - len(not_eval)
    v = verdict(findings, facts, evaluable if fired or facts["evidence"]["kinds"] else 0)
    return Report(
        verdict=v, findings=findings, facts=facts, source=source,
        not_evaluable=[{"rule": r.rule.id, "cause": r.rule.cause, "reason": r.reason} for r in not_eval],
        rule_errors=[{"rule": r.rule.id, "cause": r.rule.cause, "error": r.reason} for r in errors],
        probes=list(probe_runs or []), trace=trace.steps,
        timing={"facts": t_facts, "rules": t_rules, **{f"parse.{k}": v for k, v in timing.items()}},
        follow_ups=[{**fu, "rule": r.rule.id} for r in fired for fu in r.follow_ups],
        rule_results=[{"rule": r.rule.id, "cause": r.rule.cause,
                       "status": "passed" if r.status == "not_fired" else r.status, "reason": r.reason}
                      for r in results],
    )


def diagnose_path(path: Path, symptom: str | None = None, logs: list[Path] | None = None,
                  rules_dirs: list[Path] | None = None) -> Report:
    trace = Trace()
    items, source, probe_runs, bundle = gather_items(path, logs)
    if bundle is not None:
        for problem in bundle.verify():
            trace.add("verify", problem)
    trace.add("gather", f"{len(items)} file(s) from {source['type']} {path}")
    try:
        return analyze(items, source, symptom, probe_runs, rules_dirs, trace)
    finally:  # an unpacked archive is not needed once the facts are built
        if bundle is not None and getattr(bundle, "unpacked", None) is not None:
            shutil.rmtree(bundle.unpacked, ignore_errors=True)
