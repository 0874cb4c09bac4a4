"""Evaluate the rule set over a facts document."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from doctor import celexpr, plugins
from doctor import facts as facts_mod
from doctor.rule import Rule, RuleResult, evaluate, load_rules


@dataclass
class RuleSet:
    rules: list[Rule]
    schema: dict[str, str]
    namespaces: set[str]
    dirs: list[Path]


def namespaces_of(schema: dict[str, str]) -> set[str]:
    return {p.split(".", 1)[0] for p in schema}


@lru_cache(maxsize=8)
def _cached(extra: tuple[Path, ...]) -> RuleSet:
    schema = facts_mod.schema()
    ns = namespaces_of(schema)
    dirs = plugins.rule_dirs(list(extra))
    return RuleSet(load_rules(dirs, schema, ns), schema, ns, dirs)


def load_ruleset(extra_dirs: list[Path] | None = None) -> RuleSet:
    """All rules (built-in pack, MLDOCTOR_RULES_PATH, extra dirs), compiled and checked."""
    return _cached(tuple(extra_dirs or ()))


def evaluate_all(ruleset: RuleSet, facts: dict[str, Any]) -> tuple[list[RuleResult], float]:
    """Evaluate every rule; returns the results and the seconds it took."""
    t0 = time.perf_counter()
    ctx = celexpr.context(facts, ruleset.namespaces)
    results = [evaluate(rule, ctx, facts) for rule in ruleset.rules]
    return results, time.perf_counter() - t0
