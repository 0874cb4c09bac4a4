"""``mldoctor mcp`` through the MCP SDK's real stdio client: one server process answers every
call of the module (the calls are made once, in the ``session`` fixture; the tests read the
answers), so the whole module costs one server start plus the diagnoses themselves.

What is checked: the tool list (read-only annotations, schemas), ``diagnose`` on the NVRx
flight-recorder cases (schema-valid report naming the culprit ranks) and on a pasted ticket,
that secrets planted in the evidence appear in no tool output, and that ``read_evidence`` keeps
to the named folder (``../``, absolute paths and symlinks refused).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURES, ROOT

mcp = pytest.importorskip("mcp")
jsonschema = pytest.importorskip("jsonschema")

NVRX = FIXTURES / "fr" / "nvrx"
#: The ranks NVIDIA's fault injection hit in each case (the same ground truth test_flight_recorder uses).
NVRX_CULPRITS = {"gpu_error_1st": [12, 14], "gpu_error_2nd": [9, 14], "lock_gil_1st": [9, 14],
                 "lock_gil_2nd": [10, 15]}
SECRETS = {
    "hf": "hf_FAKEplantedTOKENabcdefghijklmnop1234",
    "aws_id": "AKIAFAKEPLANTED12345",
    "aws_secret": "FAKEplanted/secretKEYvalue0123456789abcdEF",
}
PLANTED_LOG = (
    "[rank0]: starting training\n"
    f"HF_TOKEN={SECRETS['hf']}\n"
    f"key id {SECRETS['aws_id']} in use\n"
    f"aws_secret_access_key = {SECRETS['aws_secret']}\n"
    "[rank0]: step 10 loss 2.31\n"
)
SCHEMA = json.loads((ROOT / "doctor/engine/schemas/report.schema.json").read_text())


def _dump(result: Any) -> dict[str, Any]:
    """A CallToolResult as plain data: every text the agent would see."""
    return {"is_error": bool(result.is_error), "structured": result.structured_content,
            "text": "\n".join(getattr(c, "text", "") for c in result.content)}


async def _session_calls(work: Path) -> dict[str, Any]:
    from mcp import ClientSession, StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "doctor.cli", "mcp"], cwd=str(ROOT))
    out: dict[str, Any] = {}
    with open(work / "server.stderr", "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            out["tools"] = (await session.list_tools()).tools

            async def call(key: str, name: str, **args: Any) -> None:
                out[key] = _dump(await session.call_tool(name, args))

            for case in NVRX_CULPRITS:
                await call(f"fr:{case}", "diagnose", path=str(NVRX / case))
            await call("fr:planted", "diagnose", path=str(work / "case"))
            ticket = (FIXTURES / "tickets" / "shm_docker.md").read_text()
            await call("ticket", "diagnose", text=ticket + "\nMy launcher prints:\n```\n" + PLANTED_LOG + "```\n")
            await call("both", "diagnose", path=str(work / "case"), text="x")
            await call("missing", "diagnose", path=str(work / "nope"))
            await call("explain", "explain", cause="rank_stuck_in_cuda")
            await call("explain_bad", "explain", cause="no_such_cause")
            await call("causes", "list_causes")
            await call("rules", "list_rules")
            await call("live_off", "diagnose_live")
            await call("ls", "read_evidence", path=str(work / "case"))
            await call("log", "read_evidence", path=str(work / "case"), item="rank0.log")
            await call("log_capped", "read_evidence", path=str(work / "case"), item="rank0.log", max_bytes=20)
            await call("dump", "read_evidence", path=str(work / "case"), item="_dump_0")
            await call("dotdot", "read_evidence", path=str(work / "case"), item="../outside.txt")
            await call("absolute", "read_evidence", path=str(work / "case"), item=str(work / "outside.txt"))
            await call("link", "read_evidence", path=str(work / "case"), item="link.txt")
            await call("etc", "read_evidence", path=str(work / "case"), item="/etc/passwd")
    out["stderr"] = (work / "server.stderr").read_text()
    return out


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import anyio

    work = tmp_path_factory.mktemp("mcp")
    case = work / "case"
    shutil.copytree(NVRX / "gpu_error_1st", case)
    (case / "rank0.log").write_text(PLANTED_LOG)
    (work / "outside.txt").write_text(f"outside secret {SECRETS['hf']}\n")
    (case / "link.txt").symlink_to(work / "outside.txt")
    return anyio.run(_session_calls, work)


def test_tools_are_listed_read_only_with_schemas(session: dict[str, Any]) -> None:
    tools = {t.name: t for t in session["tools"]}
    assert set(tools) == {"diagnose", "explain", "list_causes", "list_rules", "read_evidence"}
    for tool in tools.values():
        assert tool.annotations is not None and tool.annotations.read_only_hint is True
        assert tool.annotations.destructive_hint is False
        assert tool.input_schema["type"] == "object" and tool.output_schema is not None
        jsonschema.Draft202012Validator.check_schema(tool.output_schema)
    assert tools["diagnose"].output_schema["title"].startswith("mldoctor report")


@pytest.mark.parametrize("case", sorted(NVRX_CULPRITS))
def test_diagnose_flight_recorder_case_is_schema_valid_and_names_culprits(session: dict[str, Any], case: str) -> None:
    res = session[f"fr:{case}"]
    assert not res["is_error"], res["text"]
    doc = res["structured"]
    jsonschema.validate(doc, SCHEMA)
    assert doc["verdict"]["state"] == "hung"
    assert doc["findings"][0]["ranks"] == NVRX_CULPRITS[case]
    assert doc["incident_key"].startswith("mldi-")
    assert ",".join(map(str, NVRX_CULPRITS[case])) in res["text"] and doc["incident_key"] in res["text"]
    statuses = {r["status"] for r in doc["rule_results"]}
    assert {"fired", "passed", "not_evaluable"} <= statuses


def test_incident_key_is_stable_and_tells_incidents_apart(session: dict[str, Any]) -> None:
    keys = {case: session[f"fr:{case}"]["structured"]["incident_key"] for case in NVRX_CULPRITS}
    # the copy with a log added is the same incident as the original folder (same cause, culprits, job)
    assert session["fr:planted"]["structured"]["incident_key"] == keys["gpu_error_1st"]
    assert len(set(keys.values())) == len(keys)


def test_diagnose_pasted_ticket(session: dict[str, Any]) -> None:
    res = session["ticket"]
    assert not res["is_error"], res["text"]
    doc = res["structured"]
    jsonschema.validate(doc, SCHEMA)
    assert "shm_too_small" in [f["cause"] for f in doc["findings"]]
    assert doc["source"]["path"] == "(pasted text)"
    assert "mldoctor-mcp-" not in json.dumps(doc)  # the private temporary folder shows nowhere


def test_planted_secrets_never_leave_the_server(session: dict[str, Any]) -> None:
    blob = json.dumps({k: v for k, v in session.items() if k not in ("tools", "stderr")}, default=str)
    for secret in SECRETS.values():
        assert secret not in blob
    assert "[REDACTED]" in session["log"]["structured"]["text"] or "*" in session["log"]["structured"]["text"]


def test_read_evidence_lists_and_reads_inside_the_named_folder(session: dict[str, Any]) -> None:
    items = {row["item"]: row for row in session["ls"]["structured"]["items"]}
    assert "rank0.log" in items and "_dump_0" in items and "link.txt" not in items
    assert items["_dump_0"]["kind"] == "flight_recorder"
    log = session["log"]["structured"]
    assert "step 10 loss" in log["text"] and log["truncated"] is False
    capped = session["log_capped"]["structured"]
    assert capped["truncated"] is True and len(capped["text"]) == 20
    assert session["dump"]["structured"]["text"] is None  # a pickle is never shown raw


@pytest.mark.parametrize("key", ["dotdot", "absolute", "link", "etc"])
def test_read_evidence_refuses_paths_outside_the_named_one(session: dict[str, Any], key: str) -> None:
    res = session[key]
    assert res["is_error"] and "refused" in res["text"]
    assert "outside secret" not in res["text"] and "root:" not in res["text"]


def test_errors_are_one_line_tool_errors(session: dict[str, Any]) -> None:
    for key in ("both", "missing", "explain_bad", "live_off", "dotdot"):
        res = session[key]
        assert res["is_error"] and res["structured"] is None
        assert "\n" not in res["text"] and "Traceback" not in res["text"]
    assert "--allow-live" in session["live_off"]["text"]
    assert "Traceback" not in session["stderr"]


def test_catalogue_tools(session: dict[str, Any]) -> None:
    pb = session["explain"]["structured"]
    assert pb["cause"] == "rank_stuck_in_cuda" and pb["fix"]
    causes = {c["cause"] for c in session["causes"]["structured"]["causes"]}
    rules = session["rules"]["structured"]["rules"]
    assert "rank_stuck_in_cuda" in causes and {r["cause"] for r in rules} <= causes


def test_server_start_stays_light() -> None:
    """Building the server (what `mldoctor mcp` does before the first call) loads no heavy module."""
    code = ("import sys\nfrom doctor.mcp.server import build_server\nbuild_server(allow_live=True)\n"
            "print('HEAVY', [m for m in ('torch', 'pandas', 'textual') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "HEAVY []" in out.stdout, out.stderr
