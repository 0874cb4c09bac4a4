"""The typed facts grammar: declarations parse, and written facts are checked against them."""

from __future__ import annotations

import pytest

from doctor.evidence import plugins
from doctor.evidence.factschema import SchemaError, declared_types, parse_type, validate_namespace

SCHEMA = {
    "x.n": "int: a count",
    "x.share": "float: a share",
    "x.names": "list<string>: names",
    "x.groups": "list<map>: groups",
    "x.groups[].ranks": "list<int>: ranks of a group",
    "x.by_rank": "map<string,map>: per rank",
    "x.by_rank[].state": "string: its state",
    "x.maybe": "int|null: may be missing",
}


def test_every_registered_probe_declares_parseable_types() -> None:
    for probe in plugins.probes():
        types = declared_types(probe.facts_schema)
        assert types and all(path.split(".", 1)[0] == probe.name for path in types), probe.name


@pytest.mark.parametrize("bad", ["lsit<int>", "map<float,int>", "list<int", "strnig"])
def test_bad_types_are_refused(bad: str) -> None:
    with pytest.raises(SchemaError):
        parse_type(bad)


def test_written_facts_match_their_declaration() -> None:
    good = {"x": {"n": 3, "share": 1, "names": ["a"], "groups": [{"ranks": [0, 1]}],
                  "by_rank": {"0": {"state": "collective"}}, "maybe": None}}
    assert validate_namespace(good, "x", SCHEMA) == []


def test_undeclared_paths_and_wrong_types_are_named() -> None:
    bad = {"x": {"n": "3", "names": [1], "groups": [{"rankz": []}], "by_rank": {"7": {"state": 1}},
                 "extra": True}}
    problems = validate_namespace(bad, "x", SCHEMA)
    assert "x.n: str is not int" in problems
    assert "x.names[]: int is not string" in problems
    assert "x.groups[].rankz: written but not declared" in problems
    assert "x.by_rank[].state: int is not string" in problems
    assert "x.extra: written but not declared" in problems
