"""Every registered probe keeps the contract (issue #16), checked on captured evidence only.

Three promises a probe makes that nothing else checks end to end:

1. its ``facts_schema`` documents its namespace: every entry parses as ``<type>: <meaning>``;
2. what ``build`` writes matches that declaration: facts built from every fixture folder and
   every benchmark case validate with no undeclared path and no wrong type (the rule linter and
   ``docs/facts.md`` read the same declarations, so an undeclared path is invisible to both);
3. its ``fixtures`` (glob patterns of captured files of its kind) reach it through the real
   dispatcher, and no probe ahead of it in dispatch order claims them: a loosened ``sniff`` in
   one kind cannot quietly take another kind's evidence.

The probes come from the registry, never from a list here, so a new kind is covered as soon as
it is registered. Only facts are built (no rules): the whole module runs in seconds.
"""

from __future__ import annotations

from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from doctor.engine import facts as facts_mod
from doctor.engine.diagnose import gather_items
from doctor.evidence import plugins
from doctor.evidence.contract import Probe, Sample
from doctor.evidence.factschema import declared_types, validate_namespace

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
PROBES = plugins.probes()
IDS = [p.name for p in PROBES]


def _builtin(probe: Probe) -> bool:
    """Shipped with mldoctor (a third-party probe may come without captures of its own)."""
    return type(probe).__module__.startswith("doctor.probes.")


def _fixture_files(probe: Probe) -> list[Path]:
    """The regular files a probe's ``fixtures`` patterns name, sorted, without duplicates."""
    out: set[Path] = set()
    for pattern in probe.fixtures:
        out.update(f for f in ROOT.glob(pattern) if f.is_file())
    return sorted(out)


@lru_cache(maxsize=1)
def _units() -> tuple[Path, ...]:
    """Every piece of evidence a user could hand over: each entry of each fixture folder (a
    capture folder, a bundle, a single file), each benchmark case's evidence, and each file a
    probe names as its own fixture (so a kind whose captures live elsewhere is covered too)."""
    units: set[Path] = set()
    for kind in sorted(FIXTURES.iterdir()):
        if kind.is_dir() and not kind.name.startswith("."):
            units.update(c for c in kind.iterdir() if not c.name.startswith("."))
    for truth_file in (ROOT / "bench" / "cases").glob("*/truth.yaml"):
        truth = yaml.safe_load(truth_file.read_text()) or {}
        units.add(ROOT / truth["evidence"] if truth.get("evidence") else truth_file.parent)
    for probe in PROBES:
        units.update(_fixture_files(probe))
    return tuple(sorted(u for u in units if u.exists()))


@cache
def _facts(path: Path) -> dict[str, Any]:
    """Facts as ``mldoctor diagnose --from PATH`` builds them (bundle or loose), rules left out."""
    items, source, probe_runs, _bundle = gather_items(path)
    facts, _timing = facts_mod.build(items, source.get("type", "loose"), None, probe_runs)
    return facts


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


# -- 1. the schema is documented -------------------------------------------------------------------

@pytest.mark.parametrize("probe", PROBES, ids=IDS)
def test_schema_is_documented(probe: Probe) -> None:
    assert probe.name, f"{type(probe).__name__} has no name"
    assert probe.facts_schema, f"{probe.name}: empty facts_schema"
    types = declared_types(probe.facts_schema)  # raises on a bad type or a missing meaning
    outside = [path for path in types if path.split(".", 1)[0] != probe.name]
    assert not outside, f"{probe.name} declares paths outside its namespace: {outside}"


# -- 2. what it writes is what it declares ---------------------------------------------------------

@pytest.mark.parametrize("probe", PROBES, ids=IDS)
def test_written_facts_match_the_declaration(probe: Probe) -> None:
    """One line per distinct problem, naming the first evidence that shows it."""
    problems: dict[str, str] = {}
    written = 0
    for unit in _units():
        facts = _facts(unit)
        written += probe.name in facts
        for line in validate_namespace(facts, probe.name, probe.facts_schema):
            problems.setdefault(line, _rel(unit))
    if _builtin(probe):
        assert written, f"{probe.name}: no fixture evidence makes it write facts (add a capture)"
    assert not problems, f"{probe.name}: {len(problems)} problem(s):\n" + "\n".join(
        f"  {line}   <- {where}" for line, where in sorted(problems.items()))


def test_engine_namespaces_match_the_declaration() -> None:
    """``meta``, ``job`` and ``evidence`` are the engine's own; they keep the same promise."""
    problems: dict[str, str] = {}
    for unit in _units():
        facts = _facts(unit)
        for ns in ("meta", "job", "evidence"):
            for line in validate_namespace(facts, ns, facts_mod.BASE_SCHEMA):
                problems.setdefault(line, _rel(unit))
    assert not problems, "\n".join(f"{line}   <- {where}" for line, where in sorted(problems.items()))


# -- 3. its own fixtures are claimed by it, others' not --------------------------------------------

@pytest.mark.parametrize("probe", PROBES, ids=IDS)
def test_fixtures_are_named(probe: Probe) -> None:
    assert isinstance(probe.fixtures, tuple) and all(isinstance(p, str) for p in probe.fixtures), probe.name
    if _builtin(probe):
        assert probe.fixtures, f"{probe.name}: name captured files of this kind in `fixtures`"
    empty = [p for p in probe.fixtures if not any(f.is_file() for f in ROOT.glob(p))]
    assert not empty, f"{probe.name}: patterns that match no file: {empty}"


def _also_readers(sample: Sample, owner: Probe) -> set[str]:
    """Kinds that read a file besides its owner (``also_sniff``: a trainer log carries loss too)."""
    out = set()
    for p in PROBES:
        also = getattr(p, "also_sniff", None)
        if p is not owner and also is not None and also(sample):
            out.add(p.name)
    return out


@pytest.mark.parametrize("probe", PROBES, ids=IDS)
def test_own_fixtures_are_claimed_by_it_and_by_no_one_ahead(probe: Probe) -> None:
    """Through the real dispatcher, each fixture file alone becomes evidence of this kind, read
    by no other kind except declared extra readers; and no probe ahead of or level with it in
    dispatch order (priority) would claim it, so the outcome never rests on a tie's order.

    A probe that reads the prose of tickets (``reads_prose``) gets documents through the ticket
    splitter, whose pieces go to other kinds: for it only the first promise is checked."""
    files = _fixture_files(probe)
    problems = []
    for f in files:
        facts = _facts(f)
        ev = facts["evidence"]
        kinds = set(ev["kinds"])
        if probe.name not in kinds:
            problems.append(f"{_rel(f)}: dispatched to {sorted(kinds) or 'no kind'}"
                            f"{' (ignored)' if ev['ignored'] else ''}{'; ' + ev['errors'][0] if ev['errors'] else ''}")
            continue
        if getattr(probe, "reads_prose", False):
            continue
        sample = Sample.read(f)
        others = kinds - {probe.name} - _also_readers(sample, probe)
        if others:
            problems.append(f"{_rel(f)}: also claimed by {sorted(others)}")
        rivals = [p.name for p in PROBES if p is not probe and p.priority >= probe.priority and p.sniff(sample)]
        if rivals:
            problems.append(f"{_rel(f)}: sniffed too by {rivals}, at priority >= {probe.priority}")
    assert not problems, f"{probe.name}: {len(problems)} of {len(files)} fixture file(s):\n" + "\n".join(
        f"  {line}" for line in problems)


def test_no_file_is_two_kinds_fixture() -> None:
    owners: dict[Path, list[str]] = {}
    for probe in PROBES:
        for f in _fixture_files(probe):
            owners.setdefault(f, []).append(probe.name)
    shared = {_rel(f): names for f, names in owners.items() if len(names) > 1}
    assert not shared, shared
