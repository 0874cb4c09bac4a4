"""torch's distributed debug server (``torch.distributed.debug.start_debug_server``, torch 2.13+).

The server runs inside the job: a worker HTTP server in every rank and a frontend on rank 0 that
fans requests out to them and, given ``dump_dir``, writes periodic dumps (``stacks_<date>_<time>
.txt`` and friends). Its evidence is of two sorts, read by two kinds:

- what each rank said: faulthandler stacks (``/stacks``), py-spy stacks (``/pyspy_dump``),
  flight-recorder entries (``/fr_trace_json``). The stacks kind reads the stack dumps and pages
  itself (its ``also_sniff``; the ``=== Rank N: url ===`` headers name the ranks), so every stack
  rule applies unchanged; live, each rank's flight-recorder answer is stored as that rank's dump
  for the flight-recorder kind.
- who answered: this kind. A rank whose worker server refuses the connection has exited (the
  server lives in the rank's process); one that times out is alive but not answering. Either is
  a rank no stack of the job can show, and the first is a dead rank (rule DBG001).

Live, ``collect`` asks the frontend for the worker urls and then each worker directly with a
short timeout (:mod:`.live`); nothing is ptraced or signalled: the job answers for itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from doctor.evidence.contract import (
    CollectContext,
    Hints,
    Parsed,
    Probe,
    Sample,
    read_whole,
    set_world_size,
)
from doctor.evidence.errors import EvidenceError
from doctor.evidence.sections import Cell, Row, Section, SectionContext, Table

from . import live
from .read import ServerDump, host_of, parse_dump, sniff_text

__all__ = ["PROBE", "DebugServerProbe", "ServerDump", "parse_dump"]

_MAX_FAILURES = 64


class DebugServerProbe(Probe):
    name: ClassVar[str] = "debug_server"
    title: ClassVar[str] = "torch distributed debug server"
    collects: ClassVar[str] = (
        "What torch's distributed debug server (torch.distributed.debug, torch 2.13+) answers: "
        "per rank its stacks and flight-recorder entries, and which ranks did not answer. Read "
        "from its periodic dumps (dump_dir), saved route pages, or live over HTTP (no ptrace)."
    )
    # ahead of the stacks kind (60), whose sniff would otherwise take a stacks dump as one process
    priority: ClassVar[int] = 75
    build_order: ClassVar[int] = 45  # before stacks (50): the world size its sections show
    max_bytes: ClassVar[int] = 64 * 1024 * 1024
    live_first_round: ClassVar[bool] = True
    follow_ups: ClassVar[dict[str, dict[str, Any]]] = {"debug_server": {}}
    shows_state: ClassVar[bool] = True
    rank_state_order: ClassVar[int] = 40
    fixtures: ClassVar[tuple[str, ...]] = (
        "tests/fixtures/debug_server/*/dumps/*.txt",
        "tests/fixtures/debug_server/*/routes/*.html",
    )
    facts_schema: ClassVar[dict[str, str]] = {
        "debug_server.files": "int: dump files and route pages read",
        "debug_server.routes": "list<string>: what they hold: stacks, pyspy_dump, fr_trace_json, wait_counters, tcpstore, ...",
        "debug_server.world_size": "int: ranks the frontend asked (its rank sections, or the worker urls in the store)",
        "debug_server.newest": "string: time of the newest periodic dump, 'YYYY-MM-DD HH:MM:SS' ('' when none is named so)",
        "debug_server.answered": "list<int>: ranks that answered in the newest file that asked them",
        "debug_server.not_answering": "list<int>: ranks that did not answer in the newest file that asked them",
        "debug_server.refused": "list<int>: of them, ranks whose worker server refused the connection (the rank's process is gone)",
        "debug_server.timed_out": "list<int>: of them, ranks that did not answer in time (alive, but not answering)",
        "debug_server.failures": "list<map>: each failed answer (at most 64, newest first)",
        "debug_server.failures[].rank": "int: the rank",
        "debug_server.failures[].route": "string: what was asked (stacks, fr_trace_json, ...)",
        "debug_server.failures[].status": "int: HTTP status the frontend gave (408 timeout, 503 connection error, 502 other; 0 unknown)",
        "debug_server.failures[].kind": "string: refused | timeout | error",
        "debug_server.failures[].reason": "string: the frontend's error text, shortened",
        "debug_server.failures[].when": "string: the dump's time, '' for a page",
        "debug_server.hosts": "list<string>: hosts of the worker urls",
        "debug_server.by_rank": "map<string,map>: per rank: url, host, answer (answered | refused | timeout | error)",
        "debug_server.by_rank[].url": "string: the rank's worker server url",
        "debug_server.by_rank[].host": "string: its host",
        "debug_server.by_rank[].answer": "string: answered | refused | timeout | error (newest file that asked it)",
        "debug_server.notes": "list<string>: reading remarks",
    }

    def sniff(self, sample: Sample) -> bool:
        return not sample.is_binary and sniff_text(sample.text)

    def parse(self, path: Path, rel: str, hints: Hints) -> list[Parsed]:
        raw = read_whole(path)
        if b"\x00" in raw[:4096]:
            raise EvidenceError(rel, "binary data, not a debug-server dump")
        dump = parse_dump(raw.decode("utf-8", errors="replace"), rel.rsplit("/", 1)[-1])
        out = [Parsed(self.name, rel, dump, None, hints.host, list(dump.notes))]
        # the ranks that answered were seen (their host too); the others are missing evidence
        out += [Parsed(self.name, rel, None, r, host_of(dump.urls.get(r, "")) or hints.host) for r in dump.answered]
        return out

    def build(self, parsed: list[Parsed], facts: dict[str, Any]) -> None:
        dumps = [(p.path, p.data) for p in parsed if isinstance(p.data, ServerDump)]
        # unnamed pages (no time) count as older than any stamped dump; ties by file name
        dumps.sort(key=lambda d: (d[1].stamp, d[0]))
        answer: dict[int, str] = {}
        urls: dict[int, str] = {}
        failures: list[dict[str, Any]] = []
        notes: list[str] = []
        ws = 0
        for rel, d in dumps:
            ws = max(ws, d.world_size)
            urls.update(d.urls)
            notes += [f"{rel}: {n}" for n in d.notes][: max(0, 20 - len(notes))]
            if d.route == "tcpstore":
                continue  # the store lists workers; it says nothing of who answers
            for r in d.answered:
                answer[r] = "answered"
            for f in d.failures:
                answer[f.rank] = f.kind
                failures.append({"rank": f.rank, "route": d.route, "status": f.status, "kind": f.kind,
                                 "reason": f.reason, "when": d.stamp})
        failures.reverse()
        set_world_size(facts, ws)
        by_rank = {str(r): {"url": urls.get(r, ""), "host": host_of(urls.get(r, "")), "answer": answer.get(r, "")}
                   for r in sorted(set(urls) | set(answer))}
        facts[self.name] = {
            "files": len(dumps),
            "routes": sorted({d.route for _, d in dumps}),
            "world_size": ws,
            "newest": max((d.stamp for _, d in dumps), default=""),
            "answered": sorted(r for r, a in answer.items() if a == "answered"),
            "not_answering": sorted(r for r, a in answer.items() if a != "answered"),
            "refused": sorted(r for r, a in answer.items() if a == "refused"),
            "timed_out": sorted(r for r, a in answer.items() if a == "timeout"),
            "failures": failures[:_MAX_FAILURES],
            "hosts": sorted({h for h in (host_of(u) for u in urls.values()) if h}),
            "by_rank": by_rank,
            "notes": notes,
        }

    def collect(self, ctx: CollectContext) -> dict[str, Any]:
        return live.collect(ctx)

    def rank_states(self, facts: dict[str, Any]) -> dict[int, str]:
        """Only the ranks that did not answer: where the others are, their stacks say."""
        ns = facts.get(self.name) or {}
        out: dict[int, str] = {}
        for r, info in (ns.get("by_rank") or {}).items():
            if isinstance(info, dict) and info.get("answer") not in ("", "answered") and str(r).isdigit():
                out[int(r)] = f"no answer: {info['answer']}"
        return out

    def report_sections(self, facts: dict[str, Any], context: SectionContext) -> list[Section]:
        """Which rank answered the debug server, with the error of each that did not; a rank
        that did not answer is the row to look at, whatever the verdict."""
        ns = facts.get(self.name) or {}
        by_rank = ns.get("by_rank") or {}
        if not by_rank:
            return []
        reasons = {}
        for f in ns.get("failures") or []:
            reasons.setdefault(int(f["rank"]), f"{f['route']}: {f['reason']}")
        rows = []
        for r, info in sorted(by_rank.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else -1):
            answer = str(info.get("answer") or "")
            bad = answer not in ("", "answered")
            marks = ["MISSING"] if bad else (["NAMED"] if r.isdigit() and int(r) in context.culprit_ranks else [])
            rows.append(Row([Cell(r), Cell(answer or "not asked"), Cell(str(info.get("url") or ""), code=True),
                             Cell(reasons.get(int(r), "") if r.isdigit() else "")], marks=marks))
        missing = ns.get("not_answering") or []
        summary = (f"{len(missing)} of {ns.get('world_size') or len(by_rank)} ranks did not answer: {missing}"
                   if missing else f"all {len(by_rank)} ranks answered")
        return [Section("debug-server", "torch debug server", Table(["rank", "answer", "worker url", "error"], rows,
                                                                  noun="rank"),
                        order=25, nav="Debug server", summary=summary,
                        note="Each rank's worker server, as the frontend (or mldoctor live) reached it.")]

    def host_names(self, facts: dict[str, Any]) -> list[str]:
        return list((facts.get(self.name) or {}).get("hosts") or [])


PROBE = DebugServerProbe()
