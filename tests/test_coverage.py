"""The harvested message templates (probes/logs/templates/*.yaml) and ``mldoctor rules coverage``.

Coverage is only worth quoting when the harvest is well-formed (every template names its upstream
source and carries a concrete example) and the numbers the command prints add up, so both are
checked here against the real files and the real command.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from doctor.probes.logs import coverage as C
from typer.testing import CliRunner

from doctor.cli import app
from doctor.evidence.errors import UserError

FAMILIES = C.families()


def test_template_files_exist_and_are_well_formed() -> None:
    assert FAMILIES, "no templates/*.yaml harvested"
    names = [f.name for f in FAMILIES]
    assert len(names) == len(set(names))
    for fam in FAMILIES:
        assert fam.harvested_from.strip(), fam.file
        for t in fam.templates:
            assert t.source.strip() and t.example.strip() and t.template.strip(), (fam.name, t.template)
            assert isinstance(t.fault, bool)


@pytest.mark.parametrize("text,why", [
    ("[1]", "a mapping"),
    ("family: x\nharvested_from: y\ntemplates: []\n", "non-empty list"),
    ("family: other\nharvested_from: y\ntemplates: [{template: a, source: s, fault: true, example: e}]\n", "stem"),
    ("family: x\nharvested_from: y\ntemplates: [{template: a, source: '', fault: true, example: e}]\n", "source"),
    ("family: x\nharvested_from: y\ntemplates: [{template: a, source: s, fault: maybe, example: e}]\n", "fault"),
    ("family: x\nharvested_from: y\ntemplates: [{template: a, source: s, fault: true, example: e, kinds: k}]\n",
     "unknown field"),
])
def test_bad_template_files_are_one_line_errors(text: str, why: str) -> None:
    with pytest.raises(UserError) as err:
        C.parse_family("x.yaml", text)
    assert why in str(err.value) and "\n" not in str(err.value)


def test_catch_all_signatures_do_not_count(tmp_path: Path) -> None:
    """A line only a catch-all recognizes is not covered; a specific signature's line is."""
    generic = C.Template("t", "x", "s", True, "host:1:2 [0] NCCL WARN something nobody wrote down")
    specific = C.Template("t", "y", "s", True, "RuntimeError: CUDA error: an illegal memory access was encountered")
    assert not C.check(generic, tmp_path)["covered"]
    assert C.check(specific, tmp_path)["covered"]
    assert not C.check(C.Template("t", "y", "s", True, specific.example, kind="gpu_oom"), tmp_path)["covered"]


def test_rules_coverage_command_numbers_add_up() -> None:
    res = CliRunner().invoke(app, ["rules", "coverage", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert {r["family"] for r in rows} == {f.name for f in FAMILIES}
    for r in rows:
        fam = next(f for f in FAMILIES if f.name == r["family"])
        assert r["templates"] == len(fam.templates) == r["fault_templates"] + r["informational"]
        assert r["fault_templates"] == sum(t.fault for t in fam.templates)
        assert r["covered"] + len(r["uncovered"]) == r["fault_templates"]
        assert 0.0 <= r["coverage"] <= 1.0
    table = CliRunner().invoke(app, ["rules", "coverage"])
    assert table.exit_code == 0 and "| **all** |" in table.output
    total_f = sum(r["fault_templates"] for r in rows)
    total_c = sum(r["covered"] for r in rows)
    assert f"| {sum(r['templates'] for r in rows)} | {total_f} | {total_c} |" in table.output
