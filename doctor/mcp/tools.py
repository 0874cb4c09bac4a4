"""What each MCP tool does, without the MCP SDK: plain functions from arguments to a JSON-shaped
result plus a short text summary, and the tool table (names, descriptions, input and output
schemas) the server announces.

Kept apart from the SDK glue (``server.py``) so the behaviour agents rely on can be read and
tested without a protocol in the way, and so the engine, renderers and probes are imported only
when a tool is called (the server must start in well under a second: clients start it on demand).

Every result leaves through ``finish``: the report scrubber (``doctor.evidence.redact.scrub``)
runs over every string, keys included, exactly as it does for report.md/html/json.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from doctor.evidence.errors import UserError

SYMPTOMS = ["hang", "slow", "crash", "diverge"]
#: A pasted ticket or log above this is refused: a log archive belongs in a file given by path.
MAX_TEXT = 8 * 2**20
#: ``read_evidence`` returns at most this many characters by default, and never more than
#: ``MAX_READ``: an agent's context is small, and the report already holds what the rules saw.
DEFAULT_READ = 64 * 1024
MAX_READ = 1024 * 1024
#: Live diagnosis budget bounds (seconds): a tool call must end while the agent still waits.
LIVE_BUDGET = (5.0, 300.0)


@dataclass(frozen=True)
class ToolResult:
    structured: dict[str, Any]
    summary: str


@dataclass(frozen=True)
class ToolSpec:
    name: str
    title: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    run: Callable[[dict[str, Any]], ToolResult]
    live: bool = False


# -- redaction ------------------------------------------------------------------------------------
def finish(result: ToolResult, hide: dict[str, str] | None = None) -> ToolResult:
    """Scrub every string of a result (and replace private temporary paths by a label)."""
    from doctor.evidence.redact import scrub
    from doctor.render.output import clean_value

    def fn(text: str) -> str:
        for secret_path, label in (hide or {}).items():
            text = text.replace(secret_path, label)
        return scrub(text)

    return ToolResult(clean_value(result.structured, fn), fn(result.summary))


# -- diagnose -------------------------------------------------------------------------------------
def report_schema() -> dict[str, Any]:
    """The published JSON Schema of ``mldoctor.report/1``: the output schema of the diagnose tools."""
    text = resources.files("doctor.engine").joinpath("schemas/report.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


def _symptom(args: dict[str, Any]) -> str | None:
    symptom = args.get("symptom")
    if symptom in (None, ""):
        return None
    if symptom not in SYMPTOMS:
        raise UserError(f"symptom must be one of {', '.join(SYMPTOMS)}, not {symptom!r}")
    return str(symptom)


def _summary(doc: dict[str, Any]) -> str:
    """A few lines an agent (or a person reading its transcript) can act on without the JSON."""
    v = doc["verdict"]
    lines = [f"verdict: {v['state']} - {v['summary']}", f"incident_key: {doc.get('incident_key', '')}"]
    for f in doc["findings"][:3]:
        who = f"ranks {','.join(map(str, f['ranks']))}" if f["ranks"] else ", ".join(f["hosts"] or f["gpus"])
        lines.append(f"- {f['cause']} ({f['severity']}, confidence {f['confidence']:.2f}, rule {f['rule']})"
                     + (f" culprits: {who}" if who else ""))
    if len(doc["findings"]) > 3:
        lines.append(f"... and {len(doc['findings']) - 3} more finding(s) in the structured result")
    ne = sum(1 for r in doc.get("rule_results", []) if r.get("status") == "not_evaluable")
    lines.append(f"evidence: {doc['evidence']['files']} file(s) as {', '.join(doc['evidence']['kinds']) or 'nothing'};"
                 f" {ne} rule(s) not evaluable for lack of evidence")
    return "\n".join(lines)


def _report_result(report: Any) -> ToolResult:
    from doctor.render.output import sanitize_report

    doc = sanitize_report(report).to_json()
    return ToolResult(doc, _summary(doc))


def diagnose(args: dict[str, Any]) -> ToolResult:
    """Saved evidence (a bundle, a folder of loose files, one file) or a pasted text."""
    path, text = args.get("path"), args.get("text")
    if bool(path) == bool(text):
        raise UserError("give exactly one of path (a bundle, folder or file) and text (a pasted ticket or log)")
    symptom = _symptom(args)
    from doctor.engine.diagnose import diagnose_path

    if path:
        target = Path(str(path)).expanduser()
        if not target.exists():
            raise UserError(f"{path}: no such file or folder")
        return finish(_report_result(diagnose_path(target, symptom)))
    if not isinstance(text, str) or not text.strip():
        raise UserError("text is empty")
    if len(text.encode("utf-8", errors="replace")) > MAX_TEXT:
        raise UserError(f"text is larger than {MAX_TEXT >> 20} MiB; save it to a file and pass its path")
    folder = Path(tempfile.mkdtemp(prefix="mldoctor-mcp-"))
    try:
        pasted = folder / "paste"  # no suffix: read as a paste, as `--from -` reads stdin
        pasted.write_text(text, encoding="utf-8", errors="replace")
        report = diagnose_path(pasted, symptom)
        report.source = {"type": "loose", "path": "(pasted text)"}
        # The private folder is a temporary path: it must show in no output (nor in the key).
        return finish(_report_result(report), {str(pasted): "(pasted text)", str(folder): "(pasted text)"})
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def diagnose_live(args: dict[str, Any]) -> ToolResult:
    """The job on this host (or the given process), collected live: only with --allow-live."""
    pid = args.get("pid")
    if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0):
        raise UserError(f"pid must be a positive integer, not {pid!r}")
    budget = args.get("budget_s", 30.0)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise UserError(f"budget_s must be a number of seconds, not {budget!r}")
    budget = min(max(float(budget), LIVE_BUDGET[0]), LIVE_BUDGET[1])
    from doctor.live.agent import diagnose_live as live

    report = live(pids=[pid] if pid else None, symptom=_symptom(args), budget=budget)
    return finish(_report_result(report))


# -- the catalogue: causes, playbooks, rules ------------------------------------------------------
def explain(args: dict[str, Any]) -> ToolResult:
    from doctor.engine import playbook as playbooks
    from doctor.engine import taxonomy

    cause = str(args.get("cause") or "")
    pb = playbooks.get(cause)
    if pb is None:
        close = [c for c in taxonomy.causes() if cause and cause.lower() in c]
        raise UserError(f"unknown cause {cause!r}" + (f"; did you mean {', '.join(close[:5])}?" if close
                                                       else "; list_causes names them"))
    doc = {k: v for k, v in pb.items() if not k.startswith("_")}
    doc.setdefault("means", taxonomy.means(cause))
    lines = [f"{doc.get('title', cause)} ({cause}, {doc.get('category', '')})", str(doc.get("means", "")).strip()]
    lines += [f"fix: {step}" for step in doc.get("fix", [])[:5]]
    return finish(ToolResult(doc, "\n".join(lines)))


def list_causes(args: dict[str, Any]) -> ToolResult:
    from doctor.engine import playbook as playbooks
    from doctor.engine import taxonomy

    rows = []
    for cause, category in taxonomy.causes().items():
        pb = playbooks.get(cause) or {}
        rows.append({"cause": cause, "category": category, "title": str(pb.get("title", "")),
                     "means": " ".join(str(taxonomy.means(cause)).split())})
    return finish(ToolResult({"causes": rows}, f"{len(rows)} cause ids: " + ", ".join(r["cause"] for r in rows)))


def list_rules(args: dict[str, Any]) -> ToolResult:
    from doctor.engine.ruleset import load_ruleset

    rows = [{"id": r.id, "name": r.name, "cause": r.cause, "severity": r.severity,
             "confidence": r.confidence, "requires": list(r.requires)} for r in load_ruleset(None).rules]
    return finish(ToolResult({"rules": rows}, f"{len(rows)} rules; each names the cause id it points at"))


# -- read_evidence --------------------------------------------------------------------------------
def read_evidence(args: dict[str, Any]) -> ToolResult:
    """List the evidence items of a bundle or folder, or return one item, scrubbed and capped."""
    from doctor.mcp import evidence

    path = args.get("path")
    if not path:
        raise UserError("path is required (the bundle, folder or file the evidence is in)")
    limit = args.get("max_bytes", DEFAULT_READ)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
        raise UserError(f"max_bytes must be a positive integer, not {limit!r}")
    item = args.get("item")
    doc = evidence.read(Path(str(path)).expanduser(), str(item) if item else None, min(limit, MAX_READ))
    if "items" in doc:
        summary = f"{len(doc['items'])} evidence item(s); pass one as item to read it"
    elif doc.get("text") is None:
        summary = f"{doc['item']}: {doc['note']}"
    else:
        summary = f"{doc['item']} ({doc['kind'] or 'unclaimed'}, {doc['size']} bytes"
        summary += ", cut to max_bytes)" if doc["truncated"] else ")"
    return finish(ToolResult(doc, summary))


# -- the tool table -------------------------------------------------------------------------------
def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        out["required"] = required
    return out


_SYMPTOM = {"type": "string", "enum": SYMPTOMS, "description": "optional hint; default: find out"}

_PLAYBOOK_OUT = {
    "type": "object", "required": ["cause", "title", "category", "means", "fix"],
    "properties": {
        "cause": {"type": "string"}, "title": {"type": "string"}, "category": {"type": "string"},
        "means": {"type": "string", "description": "what the cause is"},
        "confirm": {"type": "object", "description": "probes mldoctor can run, and commands for a person"},
        "fix": {"type": "array", "items": {"type": "string"}},
        "references": {"type": "array", "items": {"type": "object"}},
    },
}

_EVIDENCE_OUT = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "the bundle, folder or file that was named"},
        "items": {"type": "array", "description": "without item: what can be read",
                  "items": {"type": "object", "required": ["item", "size"],
                            "properties": {"item": {"type": "string"}, "kind": {"type": "string"},
                                           "size": {"type": "integer"}, "rank": {"type": ["integer", "null"]},
                                           "host": {"type": "string"}}}},
        "item": {"type": "string"}, "kind": {"type": "string"}, "size": {"type": "integer"},
        "truncated": {"type": "boolean"},
        "text": {"type": ["string", "null"], "description": "the item, scrubbed; null for binary items"},
        "note": {"type": "string"},
    },
}


def tool_table(allow_live: bool) -> list[ToolSpec]:
    """The tools the server offers; ``diagnose_live`` only when the user opted in."""
    report = report_schema()
    tools = [
        ToolSpec(
            "diagnose", "Diagnose saved evidence",
            "Diagnose a PyTorch job from saved evidence: `path` names a bundle (folder or .tar.gz), a folder "
            "of loose files (py-spy dumps, NCCL/torch logs, flight-recorder dumps, nvidia-smi output, metrics), "
            "one file, or a ticket text file; or `text` carries a pasted ticket or log. Returns the "
            "mldoctor.report/1 document (verdict, findings ranked most likely first with culprit ranks/hosts/GPUs, "
            "evidence and fix steps, incident_key) and a short summary. Call this first.",
            _obj({"path": {"type": "string", "description": "bundle, folder, file or ticket to read"},
                  "text": {"type": "string", "description": "a pasted ticket or log (instead of path)"},
                  "symptom": _SYMPTOM}),
            report, diagnose),
        ToolSpec(
            "explain", "Playbook of a cause",
            "The playbook of a cause id (a finding's `cause`): what it means, how to confirm it (probes and "
            "commands), how to fix it, references.",
            _obj({"cause": {"type": "string", "description": "a cause id, e.g. collective_mismatch"}}, ["cause"]),
            _PLAYBOOK_OUT, explain),
        ToolSpec(
            "list_causes", "Cause ids",
            "Every cause id mldoctor can name (a stable public contract), with its category and meaning.",
            _obj({}),
            _obj({"causes": {"type": "array", "items": {"type": "object", "required": ["cause", "category"],
                                                          "properties": {"cause": {"type": "string"},
                                                                         "category": {"type": "string"},
                                                                         "title": {"type": "string"},
                                                                         "means": {"type": "string"}}}}},
                 ["causes"]),
            list_causes),
        ToolSpec(
            "list_rules", "Diagnosis rules",
            "Every rule: id (a finding's `rule`), name, the cause it points at, severity, confidence and the facts "
            "it requires (a rule whose facts are missing is not_evaluable, never passed).",
            _obj({}),
            _obj({"rules": {"type": "array", "items": {"type": "object",
                                                        "required": ["id", "cause", "severity"],
                                                        "properties": {"id": {"type": "string"},
                                                                       "name": {"type": "string"},
                                                                       "cause": {"type": "string"},
                                                                       "severity": {"type": "string"},
                                                                       "confidence": {"type": "number"},
                                                                       "requires": {"type": "array",
                                                                                    "items": {"type": "string"}}}}}},
                 ["rules"]),
            list_rules),
        ToolSpec(
            "read_evidence", "Read one evidence item",
            "Without `item`: list the evidence items of a bundle or folder (path relative to it, kind, size). "
            "With `item`: that one item's text, secrets scrubbed, cut to max_bytes. Items are confined to the "
            "named path: absolute paths, '..' and symlinks are refused.",
            _obj({"path": {"type": "string", "description": "the bundle, folder or file the evidence is in"},
                  "item": {"type": "string", "description": "an item's path relative to `path`, as listed"},
                  "max_bytes": {"type": "integer", "minimum": 1, "maximum": MAX_READ,
                                "description": f"cap on the text returned (default {DEFAULT_READ})"}},
                 ["path"]),
            _EVIDENCE_OUT, read_evidence),
    ]
    if allow_live:
        tools.insert(1, ToolSpec(
            "diagnose_live", "Diagnose the running job on this host",
            "Collect evidence live from the PyTorch job running on this host (auto-discovered, or the "
            "process `pid`) - py-spy stacks, environment, GPU readings, logs - and diagnose it. A probe never "
            "changes the job beyond a short pause. Returns the same report document as diagnose.",
            _obj({"pid": {"type": "integer", "minimum": 1, "description": "a process of the job (default: discover)"},
                  "symptom": _SYMPTOM,
                  "budget_s": {"type": "number", "minimum": LIVE_BUDGET[0], "maximum": LIVE_BUDGET[1],
                               "description": "seconds the collection may take (default 30)"}}),
            report, diagnose_live, live=True))
    return tools
