"""Evaluate the rule set over a facts document."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from doctor.engine import celexpr, celpaths
from doctor.engine import facts as facts_mod
from doctor.engine.rule import Rule, RuleResult, evaluate, load_rules
from doctor.evidence import plugins


@dataclass
class RuleSet:
    rules: list[Rule]
    schema: dict[str, str]
    namespaces: set[str]
    dirs: list[Path]
    #: namespace -> the second-level keys some rule reads (None: the whole namespace). Only these
    #: are converted into the CEL context: at 1k+ ranks, per-rank maps no rule reads dominate it.
    used: dict[str, set[str] | None] | None = None


def used_keys(rules: list[Rule], namespaces: set[str]) -> dict[str, set[str] | None]:
    """Which facts the rules can reach, from their expressions' static paths."""
    used: dict[str, set[str] | None] = {}
    for rule in rules:
        sources = list(rule.expressions().values())
        paths: set[str] = set(rule.requires)
        for src in sources:
            try:
                raw = celpaths.fact_paths(src, namespaces)
            except celpaths.CelSyntaxError:  # the compiler rejects it at load; nothing to convert
                raw = set()
            paths |= raw
            # A bare namespace name (``has(gpu)``, ``size(env)``) needs all of it.
            for word in set(celexpr.identifiers(src)) & namespaces:
                if not any(p.split(".", 1)[0] == word for p in raw):
                    used[word] = None
        for path in paths:
            ns, _, rest = path.partition(".")
            if ns not in namespaces:
                continue
            key = rest.split(".", 1)[0].removesuffix("[]")
            if not key:
                used[ns] = None
            elif used.get(ns, set()) is not None:
                used.setdefault(ns, set()).add(key)
    return used


def namespaces_of(schema: dict[str, str]) -> set[str]:
    return {p.split(".", 1)[0] for p in schema}


@lru_cache(maxsize=8)
def _cached(extra: tuple[Path, ...]) -> RuleSet:
    schema = facts_mod.schema()
    ns = namespaces_of(schema)
    dirs = plugins.rule_dirs(list(extra))
    rules = load_rules(dirs, schema, ns)
    return RuleSet(rules, schema, ns, dirs, used_keys(rules, ns))


def load_ruleset(extra_dirs: list[Path] | None = None) -> RuleSet:
    """All rules (built-in pack, MLDOCTOR_RULES_PATH, extra dirs), compiled and checked."""
    return _cached(tuple(extra_dirs or ()))


def evaluate_all(ruleset: RuleSet, facts: dict[str, Any]) -> tuple[list[RuleResult], float]:
    """Evaluate every rule; returns the results and the seconds it took."""
    t0 = time.perf_counter()
    ctx = celexpr.context(facts, ruleset.namespaces, ruleset.used)
    results = [evaluate(rule, ctx, facts) for rule in ruleset.rules]
    return results, time.perf_counter() - t0
