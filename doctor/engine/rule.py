"""YAML rules with CEL conditions: loading, checking and evaluating them.

A rule is data: a condition over the facts, the cause it names, how to find the culprits and
how to explain itself. Every rule is compiled and its fact paths checked at load time, so a typo
fails ``mldoctor rules lint`` instead of silently never firing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from doctor.engine import celexpr, taxonomy
from doctor.evidence.errors import RuleError
from doctor.evidence.yamlsrc import Located, load

SEVERITIES = ("critical", "high", "medium", "low", "info")
STATES = ("hung", "slow", "crashed", "diverging", "healthy", "unknown")
_ID = re.compile(r"^[A-Z]{2,6}\d{3}$")
_NAME = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_TEMPLATE = re.compile(r"\{\{\s*([A-Za-z_]\w*)\s*\}\}")
FIELDS = {
    "id", "name", "cause", "severity", "confidence", "state", "requires", "when", "ranks", "hosts",
    "gpus", "evidence", "vars", "explain", "suppresses", "doc", "follow_up", "tags", "missing",
}
BUILTIN_VARS = {"n_culprits", "world_size", "ranks", "hosts", "gpus"}


@dataclass
class FollowUp:
    """A probe the agent should run when this rule is in play, and on which ranks."""

    probe: str
    ranks: str | None = None
    when: str | None = None
    why: str = ""


@dataclass
class Rule:
    id: str
    name: str
    cause: str
    severity: str
    confidence: float
    state: str
    requires: list[str]
    when: str
    explain: str
    path: Path
    line: int
    ranks: str | None = None
    hosts: str | None = None
    gpus: str | None = None
    evidence: str | None = None
    vars: dict[str, str] = field(default_factory=dict)
    suppresses: list[str] = field(default_factory=list)
    doc: str = ""
    follow_up: list[FollowUp] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    #: A template like ``explain``: what evidence this rule lacked to be sure, and the probe or
    #: command that would settle it. Rules that reason from partial evidence (one rank's stack,
    #: one log line) carry it so the report says how to firm up a low-confidence finding.
    missing: str = ""

    def expressions(self) -> dict[str, str]:
        out = {"when": self.when}
        for key in ("ranks", "hosts", "gpus", "evidence"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        out.update({f"vars.{k}": v for k, v in self.vars.items()})
        for i, fu in enumerate(self.follow_up):
            if fu.ranks:
                out[f"follow_up[{i}].ranks"] = fu.ranks
            if fu.when:
                out[f"follow_up[{i}].when"] = fu.when
        return out


@dataclass
class RuleResult:
    """What evaluating one rule gave: fired, not_fired, not_evaluable or error."""

    rule: Rule
    status: str
    reason: str = ""
    ranks: list[int] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    gpus: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    summary: str = ""
    follow_ups: list[dict[str, Any]] = field(default_factory=list)
    missing: str = ""


def _err(path: Path, line: int, what: str) -> RuleError:
    return RuleError(f"{path}:{line}: {what}")


def parse_rule(data: Any, path: Path, schema: dict[str, str], namespaces: set[str]) -> Rule:
    """Validate one rule mapping and compile its expressions; raise ``RuleError`` on the first problem."""
    if not isinstance(data, Located):
        raise _err(path, 1, "a rule file must hold one mapping")
    line = data.line_of
    unknown = set(data) - FIELDS
    if unknown:
        k = sorted(unknown)[0]
        raise _err(path, line(k), f"unknown field {k!r} (known: {', '.join(sorted(FIELDS))})")
    for key in ("id", "name", "cause", "severity", "confidence", "state", "when", "explain"):
        if key not in data:
            raise _err(path, data.line, f"missing required field {key!r}")
    rid = str(data["id"])
    if not _ID.match(rid):
        raise _err(path, line("id"), f"id {rid!r} must look like HANG003 (letters then three digits)")
    if path.stem.split(".")[0] != rid:
        raise _err(path, line("id"), f"id {rid!r} does not match the file name {path.name!r}")
    if not _NAME.match(str(data["name"])):
        raise _err(path, line("name"), "name must be lowercase words joined by '-'")
    if data["cause"] not in taxonomy.causes():
        raise _err(path, line("cause"), f"cause {data['cause']!r} is not in the taxonomy")
    if data["severity"] not in SEVERITIES:
        raise _err(path, line("severity"), f"severity must be one of {', '.join(SEVERITIES)}")
    if data["state"] not in STATES:
        raise _err(path, line("state"), f"state must be one of {', '.join(STATES)}")
    conf = data["confidence"]
    if not isinstance(conf, (int, float)) or isinstance(conf, bool) or not 0 < conf <= 1:
        raise _err(path, line("confidence"), "confidence must be a number in (0, 1]")
    requires = data.get("requires", [])
    if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires):
        raise _err(path, line("requires"), "requires must be a list of fact paths")
    for r in requires:
        if r.split(".", 1)[0] not in namespaces or celexpr.check_paths(r, schema, namespaces):
            raise _err(path, line("requires"), f"requires names unknown fact path {r!r}")
    suppresses = data.get("suppresses", [])
    if not isinstance(suppresses, list) or any(s not in taxonomy.causes() for s in suppresses):
        raise _err(path, line("suppresses"), "suppresses must list taxonomy cause ids")
    vars_ = data.get("vars", {})
    if not isinstance(vars_, dict) or not all(isinstance(v, str) for v in vars_.values()):
        raise _err(path, line("vars"), "vars must map names to CEL expressions")
    follow = []
    for fu in data.get("follow_up", []) or []:
        if not isinstance(fu, dict) or "probe" not in fu:
            raise _err(path, line("follow_up"), "each follow_up needs a 'probe'")
        follow.append(FollowUp(str(fu["probe"]), fu.get("ranks"), fu.get("when"), str(fu.get("why", ""))))
    rule = Rule(
        id=rid, name=str(data["name"]), cause=data["cause"], severity=data["severity"],
        confidence=float(conf), state=data["state"], requires=requires, when=str(data["when"]),
        explain=str(data["explain"]).strip(), path=path, line=data.line,
        ranks=data.get("ranks"), hosts=data.get("hosts"), gpus=data.get("gpus"),
        evidence=data.get("evidence"), vars=dict(vars_), suppresses=list(suppresses),
        doc=str(data.get("doc", "")), follow_up=follow, tags=list(data.get("tags", []) or []),
        missing=" ".join(str(data.get("missing") or "").split()),
    )
    for key, src in rule.expressions().items():
        at = line(key.split(".")[0].split("[")[0])
        if not isinstance(src, str) or not src.strip():
            raise _err(path, at, f"{key} must be a CEL expression string")
        try:
            celexpr.compile_expr(src)
        except (ValueError, RuntimeError) as exc:
            first = str(exc).splitlines()
            msg = next((ln for ln in first if "ERROR" in ln), first[0] if first else "syntax error")
            raise _err(path, at, f"{key}: CEL does not compile: {msg.strip()}") from None
        problems = celexpr.check_paths(src, schema, namespaces)
        if problems:
            raise _err(path, at, f"{key}: {problems[0]}")
    for key, text in (("explain", rule.explain), ("missing", rule.missing)):
        for name in _TEMPLATE.findall(text):
            if name not in rule.vars and name not in BUILTIN_VARS:
                raise _err(path, line(key), f"{key} uses {{{{{name}}}}} which is neither in vars nor built in")
    return rule


def load_file(path: Path, schema: dict[str, str], namespaces: set[str]) -> Rule:
    return parse_rule(load(path), path, schema, namespaces)


def rule_files(dirs: list[Path]) -> list[Path]:
    out = []
    for d in dirs:
        if d.is_file():
            out.append(d)
            continue
        out.extend(p for p in sorted(d.rglob("*.yaml")) if not p.name.endswith(".test.yaml"))
    return out


def load_rules(dirs: list[Path], schema: dict[str, str], namespaces: set[str]) -> list[Rule]:
    """Load every rule; the first bad file raises ``RuleError`` (``file:line: what``)."""
    rules: list[Rule] = []
    seen: dict[str, Path] = {}
    for path in rule_files(dirs):
        rule = load_file(path, schema, namespaces)
        if rule.id in seen:
            raise _err(path, rule.line, f"rule id {rule.id} is already used by {seen[rule.id]}")
        seen[rule.id] = path
        rules.append(rule)
    return rules


# -- evaluation -----------------------------------------------------------------------------

def _present(facts: dict[str, Any], path: str) -> bool:
    cur: Any = facts
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur or cur[part] is None:
            return False
        cur = cur[part]
    return not (isinstance(cur, (list, dict, str)) and len(cur) == 0)


def _flatten(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        out: list[Any] = []
        for v in value:
            out.extend(_flatten(v))
        return out
    return [value]


def format_ranks(ranks: list[int]) -> str:
    """``[0,1,2,5]`` -> ``0-2,5``: short enough for a summary line at 16k ranks."""
    rs = sorted(set(ranks))
    if not rs:
        return "none"
    parts, start, prev = [], rs[0], rs[0]
    for r in rs[1:] + [None]:  # type: ignore[list-item]
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ",".join(parts)


def _fmt(value: Any) -> str:
    if isinstance(value, list) and not value:
        return "(unknown)"  # "rank(s) (unknown) failed" reads better than "rank(s)  failed"
    if isinstance(value, list):
        if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return format_ranks(value)
        return ", ".join(_fmt(v) for v in value)
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def evaluate(rule: Rule, ctx: Any, facts: dict[str, Any]) -> RuleResult:
    missing = [r for r in rule.requires if not _present(facts, r)]
    if missing:
        return RuleResult(rule, "not_evaluable", f"missing {', '.join(missing)}")
    try:
        fired = celexpr.compile_expr(rule.when).execute(ctx)
    except Exception as exc:  # a runtime type error in one rule must not stop the others
        return RuleResult(rule, "error", f"when: {str(exc).splitlines()[0][:200]}")
    if fired is not True:
        return RuleResult(rule, "not_fired")
    res = RuleResult(rule, "fired")
    try:
        res.ranks = sorted({int(r) for r in _flatten(_run(rule.ranks, ctx))})
        res.hosts = sorted({str(h) for h in _flatten(_run(rule.hosts, ctx))})
        res.gpus = [str(g) for g in dict.fromkeys(_flatten(_run(rule.gpus, ctx)))]
        res.evidence = [str(e) for e in _flatten(_run(rule.evidence, ctx))]
        values = {k: _run(v, ctx) for k, v in rule.vars.items()}
        for i, fu in enumerate(rule.follow_up):
            if fu.when is None or _run(fu.when, ctx) is True:
                fr = sorted({int(r) for r in _flatten(_run(fu.ranks, ctx))}) if fu.ranks else res.ranks
                res.follow_ups.append({"probe": fu.probe, "ranks": fr, "why": fu.why, "index": i})
    except Exception as exc:
        return RuleResult(rule, "error", f"fired, but culprits/evidence failed: {str(exc).splitlines()[0][:200]}")
    values.update({
        "n_culprits": len(res.ranks), "world_size": facts.get("job", {}).get("world_size") or "?",
        "ranks": res.ranks, "hosts": res.hosts, "gpus": res.gpus,
    })
    res.summary = _TEMPLATE.sub(lambda m: _fmt(values.get(m.group(1), "?")), rule.explain)
    res.missing = _TEMPLATE.sub(lambda m: _fmt(values.get(m.group(1), "?")), rule.missing)
    return res


def _run(src: str | None, ctx: Any) -> Any:
    if not src:
        return None
    return celexpr.compile_expr(src).execute(ctx)
