"""The report's fields for incident systems: ``incident_key`` (stable across re-runs and moves,
different across incidents) and ``rule_results`` (not evaluable is never counted as passed)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema

from doctor.engine.diagnose import diagnose_path
from doctor.render.output import report_from_json
from tests.conftest import FIXTURES, ROOT

NVRX = FIXTURES / "fr" / "nvrx"
SCHEMA = json.loads((ROOT / "doctor/engine/schemas/report.schema.json").read_text())


def test_incident_key_survives_reruns_moves_and_report_json(tmp_path: Path) -> None:
    first = diagnose_path(NVRX / "lock_gil_1st").to_json()
    moved = tmp_path / "elsewhere" / "copy"
    shutil.copytree(NVRX / "lock_gil_1st", moved)
    again = diagnose_path(moved).to_json()
    assert first["incident_key"] == again["incident_key"]
    reread = report_from_json(json.loads(json.dumps(first))).to_json()
    assert reread["incident_key"] == first["incident_key"]
    other = diagnose_path(NVRX / "lock_gil_2nd").to_json()  # same fault, other culprits: another incident
    assert other["incident_key"] != first["incident_key"]
    jsonschema.validate(first, SCHEMA)


def test_rule_results_keep_not_evaluable_apart_from_passed() -> None:
    doc = diagnose_path(NVRX / "gpu_error_1st").to_json()
    by_status: dict[str, set[str]] = {}
    for r in doc["rule_results"]:
        by_status.setdefault(r["status"], set()).add(r["rule"])
    assert set(by_status) <= {"fired", "passed", "not_evaluable", "error"}
    assert by_status["not_evaluable"] == {n["rule"] for n in doc["not_evaluable"]}
    assert not by_status["not_evaluable"] & by_status["passed"]
    assert {f["rule"] for f in doc["findings"]} <= by_status["fired"]
    assert all(r["reason"] for r in doc["rule_results"] if r["status"] == "not_evaluable")

def test_human_reports_carry_the_same_incident_key() -> None:
    """A ticket carries report.md or report.html, not report.json: the key must be findable there
    too, and must be the JSON's, also for a report re-read from its JSON."""
    from doctor.render.html import render_html
    from doctor.render.markdown import render_markdown

    report = diagnose_path(NVRX / "lock_gil_1st")
    key = report.to_json()["incident_key"]
    assert key.startswith("mldi-")
    assert f"`{key}`" in render_markdown(report)
    assert f'<code class="incident-key">{key}</code>' in render_html(report)
    reread = report_from_json(report.to_json())
    assert f"`{key}`" in render_markdown(reread)
