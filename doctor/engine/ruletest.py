"""``mldoctor rules test`` and ``rules lint``: each rule carries its own cases beside it.

A case is evidence (a folder or file captured from a real run, relative to the test file) or a
facts fragment, and what the rule must do with it: fire (optionally with these culprits), not
fire, or be not_evaluable.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from doctor.engine import celexpr
from doctor.engine import facts as facts_mod
from doctor.engine import playbook as playbooks
from doctor.engine.rule import Rule, evaluate
from doctor.engine.ruleset import RuleSet
from doctor.evidence import plugins
from doctor.evidence.errors import RuleError
from doctor.evidence.yamlsrc import load

_PER_RANK_LOOP = re.compile(r"by_rank\s*\.\s*(?:filter|map)\s*\(")
EXPECT = {"fire": "fired", "no_fire": "not_fired", "not_evaluable": "not_evaluable"}


@dataclass
class CaseResult:
    rule: str
    name: str
    ok: bool
    detail: str
    where: str


def test_path(rule: Rule) -> Path:
    return rule.path.with_name(f"{rule.id}.test.yaml")


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = v
    return base


_facts_cache: dict[Path, dict[str, Any]] = {}


def facts_for_evidence(path: Path) -> dict[str, Any]:
    """Facts of a captured evidence folder (cached: several rules share one capture)."""
    key = path.resolve()
    if key not in _facts_cache:
        _facts_cache[key], _ = facts_mod.build(facts_mod.items_from_folder(path), "loose")
    return copy.deepcopy(_facts_cache[key])


def load_cases(rule: Rule) -> list[dict[str, Any]]:
    path = test_path(rule)
    if not path.is_file():
        return []
    data = load(path)
    if not isinstance(data, dict) or not isinstance(data.get("cases"), list):
        raise RuleError(f"{path}:1: a test file needs a 'cases' list")
    if data.get("rule") not in (None, rule.id):
        raise RuleError(f"{path}:{data.line_of('rule')}: names rule {data.get('rule')!r}, expected {rule.id}")
    return data["cases"]


def run_rule_tests(ruleset: RuleSet, only: str | None = None) -> list[CaseResult]:
    results: list[CaseResult] = []
    for rule in ruleset.rules:
        if only and only not in (rule.id, rule.name, rule.cause):
            continue
        tpath = test_path(rule)
        for i, case in enumerate(load_cases(rule)):
            where = f"{tpath}:{getattr(case, 'line', 0)}"
            name = str(case.get("name", f"case {i + 1}"))
            expect = case.get("expect")
            if expect not in EXPECT:
                results.append(CaseResult(rule.id, name, False, f"expect must be one of {', '.join(EXPECT)}", where))
                continue
            facts = facts_mod.empty_facts("loose", case.get("symptom"))
            if "evidence" in case:
                ev = (tpath.parent / str(case["evidence"])).resolve()
                if not ev.exists():
                    results.append(CaseResult(rule.id, name, False, f"evidence {case['evidence']} does not exist", where))
                    continue
                facts = facts_for_evidence(ev)
            if isinstance(case.get("facts"), dict):
                _merge(facts, copy.deepcopy(dict(case["facts"])))
            ctx = celexpr.context(facts, ruleset.namespaces, ruleset.used)
            res = evaluate(rule, ctx, facts)
            ok = res.status == EXPECT[expect]
            detail = f"{res.status}" + (f" ({res.reason})" if res.reason else "")
            if ok and expect == "fire":
                for key in ("ranks", "hosts", "gpus"):
                    if key in case and sorted(case[key]) != sorted(getattr(res, key)):
                        ok = False
                        detail = f"fired with {key} {getattr(res, key)}, expected {sorted(case[key])}"
            results.append(CaseResult(rule.id, name, ok, detail, where))
    return results


def _follow_up_names() -> set[str]:
    return set(plugins.follow_ups())


def lint(ruleset: RuleSet) -> list[str]:
    """Problems that do not stop loading but make a rule untrustworthy."""
    problems = []
    for rule in ruleset.rules:
        try:
            cases = load_cases(rule)
        except RuleError as exc:
            problems.append(str(exc))
            continue
        kinds = {c.get("expect") for c in cases if isinstance(c, dict)}
        if "fire" not in kinds:
            problems.append(f"{test_path(rule)}: {rule.id} has no case that must fire")
        if "no_fire" not in kinds:
            problems.append(f"{test_path(rule)}: {rule.id} has no case that must not fire")
        if playbooks.get(rule.cause) is None:
            problems.append(f"{rule.path}:{rule.line}: no playbook for cause {rule.cause}")
        for key, src in rule.expressions().items():
            if _PER_RANK_LOOP.search(src):
                problems.append(f"{rule.path}:{rule.line}: {key} loops over a per-rank map with filter/map "
                                "(quadratic in the CEL library at 1k+ ranks); use a pre-grouped fact")
        for fu in rule.follow_up:
            if fu.probe not in _follow_up_names():
                problems.append(f"{rule.path}:{rule.line}: follow_up probe {fu.probe!r} is unknown to the agent "
                                f"(known: {', '.join(sorted(_follow_up_names()))})")
        if not rule.doc.strip():
            problems.append(f"{rule.path}:{rule.line}: {rule.id} has no doc (what it detects, why, fix)")
    problems.extend(playbooks.problems())
    return problems
