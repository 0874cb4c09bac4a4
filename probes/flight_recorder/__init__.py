"""PyTorch flight-recorder (FR) dumps: which collective each rank last issued and finished.

A dump is one rank's ring buffer of recent collectives and point-to-point ops (process group,
sequence id, op, sizes, dtypes, state, timestamps) plus, per process group, the triple
``last_enqueued / last_started / last_completed`` (``pg_status``). Dumps come as pickles
(``_dump_fr_trace()``, the watchdog's dump-on-timeout files, NVRx's ``_dump_<rank>``) or JSON
(``_dump_fr_trace_json()``); versions 2.x from NCCL and gloo are read. Pickles go through the
restricted unpickler (:mod:`doctor.evidence.unpickle`): a dump is plain data and nothing else is loaded.

Why ``pg_status`` matters more than the entries: it tells a rank that stopped *issuing* work
(its last enqueued sequence id lags the peers': the CPU side is elsewhere) from one that stopped
*completing* it (it issued the collective, the peers finished it, but it never did: the device
side is stuck). Dumps taken with ``onlyActive`` hold no completed entries at all, so a rank that
is outside every collective has an empty entry list and only ``pg_status`` shows where it is.

Reading a dump is :mod:`.read`; the cross-rank work happens in ``build`` (:mod:`.analyze`): per
process group, align the ranks by collective sequence id, then build a wait-for graph (a rank
waiting at seq ``s`` of a group waits for every member that has not issued ``s``). The culprits are its sinks: ranks others
wait for that wait for nobody. Mismatches (op, size, dtype at the same seq of the same group),
cycles (ranks waiting for each other across groups) and timeouts come from the same alignment.
"""

from __future__ import annotations

import os
import pwd
import re
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from doctor.probes.common.debug_pages import is_page, rank_answers

from doctor.evidence.contract import CollectContext, Hints, Parsed, Probe, ProbeSkipped, Sample
from doctor.evidence.errors import EvidenceError
from doctor.evidence.jobpaths import JobFileRefused, process_uid, read_job_file
from doctor.evidence.unpickle import is_pickle

from .analyze import analyze
from .read import MAX_BYTES, Dump, load_dump

__all__ = ["PROBE", "Dump", "FlightRecorderProbe", "analyze", "dump_prefixes", "load_dump"]

_FR_KEYS = (b"entries", b"pg_config", b"pg_status", b"nccl_version", b"comm_lib_version",
            b"collective_seq_id", b"profiling_name")
# Names FR dumps get: NVRx/_dump_<rank>, the default TORCH_FR_DUMP_TEMP_FILE prefix
# (nccl_trace_rank_<rank>), and common hand-picked ones (fr_rank3.pkl). Only used to claim a
# binary file that is not a readable dump, so that it is reported instead of ignored.
#: Worker endpoints of torch's debug server whose answers are flight-recorder dumps.
_SERVER_ENDPOINTS = ("fr_trace_json", "dump_nccl_trace_json")
_NAME_RE = re.compile(r"(?:^|[_-])(?:dump|nccl_trace_rank|fr_trace|fr_rank|fr_dump|fr)_?\d+(?:\.(?:pkl|pickle|bin|json))?$", re.I)


def dump_prefixes(env: dict[str, str], home: str | None) -> list[str]:
    """Where a rank's watchdog writes its dump, as a file-name prefix (the rank is appended).

    The job's own setting wins alone (``TORCH_FR_DUMP_TEMP_FILE``, the older
    ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``). Unset, newer torch writes to
    ``$HOME/.cache/torch/comm_lib_trace_rank_`` (``/tmp/.cache/...`` without HOME) and older
    torch to ``<tmp>/nccl_trace_rank_``; both are tried, newest convention first."""
    own = env.get("TORCH_FR_DUMP_TEMP_FILE") or env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    if own:
        return [own]
    out = [os.path.join(home or "/tmp", ".cache", "torch", "comm_lib_trace_rank_")]
    for tmp in (tempfile.gettempdir(), "/tmp"):
        legacy = os.path.join(tmp, "nccl_trace_rank_")
        if legacy not in out:
            out.append(legacy)
    return out


def _job_home(pid: int | None) -> str | None:
    """The home folder of the job's user (HOME is not in the kept environment; torch uses it)."""
    uid = process_uid(pid) if pid is not None else None
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_dir
    except KeyError:
        return None


class FlightRecorderProbe(Probe):
    name: ClassVar[str] = "flight_recorder"
    rank_state_order: ClassVar[int] = 20  # after stacks: a pending collective, not the Python frame
    title: ClassVar[str] = "PyTorch flight recorder"
    collects: ClassVar[str] = (
        "PyTorch flight-recorder dumps (pickle or JSON, NCCL or gloo, one per rank): per process "
        "group the last issued/started/completed collective and the recent entries (op, sizes, "
        "dtypes, state, call site). Read with a restricted unpickler; nothing else is kept."
    )
    priority: ClassVar[int] = 90
    build_order: ClassVar[int] = 40
    live_first_round: ClassVar[bool] = True
    follow_ups: ClassVar[dict[str, dict[str, Any]]] = {"flight_recorder": {}}
    shows_state: ClassVar[bool] = True
    settles: ClassVar[str] = ("flight-recorder dumps name the collective each rank last issued and who never joined: "
                             "TORCH_FR_BUFFER_SIZE=2000 (older torch: TORCH_NCCL_TRACE_BUFFER_SIZE) plus "
                             "TORCH_NCCL_DUMP_ON_TIMEOUT=1, files at TORCH_FR_DUMP_TEMP_FILE<rank>")
    max_bytes: ClassVar[int] = MAX_BYTES
    fixtures: ClassVar[tuple[str, ...]] = (
        "tests/fixtures/evidence/*/fr/fr_rank*.pkl",
        "tests/fixtures/fr/gloo/*/fr_trace_rank*.json",
        "tests/fixtures/fr/nvrx/*/_dump_*",
        "tests/fixtures/fr/partial/*/_dump_*",
    )
    facts_schema: ClassVar[dict[str, str]] = {
        "flight_recorder.dumps": "int: dumps read (one per rank)",
        "flight_recorder.ranks": "list<int>: ranks that left a dump",
        "flight_recorder.missing_dumps": "list<int>: ranks of the job (world size from the dumps' process groups or the environment) with no dump: a missing dump is itself a clue (crashed, or not collected)",
        "flight_recorder.empty_dumps": "list<int>: ranks whose dump holds no entry and no process-group status (recorder off: TORCH_FR_BUFFER_SIZE unset or 0, or no collective yet)",
        "flight_recorder.versions": "list<string>: dump format versions seen (e.g. 2.9, 2.10)",
        "flight_recorder.backends": "list<string>: collective backends seen in the entries (nccl, gloo, ...)",
        "flight_recorder.n_entries": "int: entries across all dumps",
        "flight_recorder.n_groups": "int: process groups seen",
        "flight_recorder.groups": "list<map>: per process group with something to say (pending, behind, mismatch), at most 200, most telling first",
        "flight_recorder.groups[].pg": "string: process-group name (global id, e.g. '0' for the default group)",
        "flight_recorder.groups[].desc": "string: process-group description (default_pg, TENSOR_MODEL_PARALLEL_GROUP, ...)",
        "flight_recorder.groups[].size": "int: member ranks (pg_config, else the ranks whose dumps show the group)",
        "flight_recorder.groups[].dumped": "int: members that left a dump",
        "flight_recorder.groups[].missing": "list<int>: members without a dump",
        "flight_recorder.groups[].p2p": "bool: the group carries send/recv; its collective seq ids do not align across ranks and are not compared",
        "flight_recorder.groups[].consistent": "bool: no member completed a seq another member never issued (false: dumps taken at different moments, or failed work marked done)",
        "flight_recorder.groups[].wavefront": "int: last issued collective seq of most members (ties: the highest)",
        "flight_recorder.groups[].behind": "list<int>: members whose last issued seq is below the wavefront",
        "flight_recorder.groups[].ahead": "list<int>: members whose last issued seq is above the wavefront",
        "flight_recorder.groups[].pending": "list<int>: members with an issued, not completed collective",
        "flight_recorder.groups[].waiting_seq": "int: the seq most pending members wait in (-1: none)",
        "flight_recorder.groups[].op": "string: the op at waiting_seq (e.g. nccl:all_reduce), or ''",
        "flight_recorder.groups[].last_enqueued": "map<string,int>: last issued seq per member rank",
        "flight_recorder.groups[].last_completed": "map<string,int>: last completed seq per member rank",
        "flight_recorder.waiting_ranks": "list<int>: ranks with an issued, not completed collective or p2p op",
        "flight_recorder.idle_ranks": "list<int>: ranks with nothing pending in any group (outside every collective at dump time)",
        "flight_recorder.culprits": "list<int>: ranks others wait for that wait for no one (sinks of the wait-for graph), the culprits of cycles and blockers without dumps",
        "flight_recorder.culprit_reasons": "map<string,string>: per culprit rank, one line on why",
        "flight_recorder.culprit_kinds": "map<string,string>: per culprit rank: not_issued (never issued the collective others wait in, nothing pending: outside collectives) | not_completed (issued it, peers completed it, it did not: device side stuck) | no_dump | cycle",
        "flight_recorder.reasons_by_kind": "map<string,list<string>>: per culprit kind, up to 10 lines 'rank R: why' (for a rule's evidence)",
        "flight_recorder.outside_ranks": "list<int>: culprits of kind not_issued",
        "flight_recorder.stalled_ranks": "list<int>: culprits of kind not_completed",
        "flight_recorder.undumped_blockers": "list<int>: ranks without a dump that are the only members others still wait for, named only when no rank with a dump is to blame",
        "flight_recorder.blocked": "list<map>: collectives ranks wait in, with who they wait for (at most 50)",
        "flight_recorder.blocked[].pg": "string: process-group name",
        "flight_recorder.blocked[].desc": "string: process-group description",
        "flight_recorder.blocked[].seq": "int: collective seq id waited in",
        "flight_recorder.blocked[].op": "string: op of the waiters' entry at that seq, or ''",
        "flight_recorder.blocked[].waiters": "list<int>: ranks waiting in it",
        "flight_recorder.blocked[].not_issued": "list<int>: members (with a dump) that have not issued it",
        "flight_recorder.blocked[].no_dump": "list<int>: members without a dump",
        "flight_recorder.blocked[].completed_by": "list<int>: members that already completed it",
        "flight_recorder.cycles": "list<map>: ranks waiting for each other across groups (no one outside the cycle to blame): a collective order mismatch",
        "flight_recorder.cycles[].ranks": "list<int>: ranks in the cycle",
        "flight_recorder.cycles[].culprits": "list<int>: the minority: ranks waiting in a different group than most of the cycle",
        "flight_recorder.cycles[].text": "string: one line for a report",
        "flight_recorder.cycles[].pgs": "list<string>: the groups involved, as 'name:desc seq op'",
        "flight_recorder.mismatches": "list<map>: op/size/dtype disagreements at the same seq of the same group (at most 10 per group, 50 in all)",
        "flight_recorder.mismatches[].pg": "string: process-group name",
        "flight_recorder.mismatches[].desc": "string: process-group description",
        "flight_recorder.mismatches[].seq": "int: collective seq id",
        "flight_recorder.mismatches[].kind": "string: op | size | dtype",
        "flight_recorder.mismatches[].values": "list<map>: {value, ranks, where}: each distinct value and the ranks that have it, most common first",
        "flight_recorder.mismatches[].values[].value": "string: the op, the [input sizes, output sizes] or the [input dtypes, output dtypes] as JSON",
        "flight_recorder.mismatches[].values[].ranks": "list<int>: ranks with that value",
        "flight_recorder.mismatches[].values[].where": "string: call site of the lowest such rank's entry (function (file:line)), '' when the dump has no frames",
        "flight_recorder.mismatches[].text": "string: one line for a report",
        "flight_recorder.mismatches[].culprits": "list<int>: the ranks outside the most common value (every rank when no value has a majority)",
        "flight_recorder.n_mismatches": "int: mismatches found before the caps",
        "flight_recorder.first_divergence": "map: the earliest mismatch (by entry creation time): pg, desc, seq, kind, culprits",
        "flight_recorder.first_divergence.pg": "string: process-group name of the earliest mismatch",
        "flight_recorder.first_divergence.desc": "string: that group's description",
        "flight_recorder.first_divergence.seq": "int: collective seq id where the ranks first disagree",
        "flight_recorder.first_divergence.kind": "string: what differs there: op | size | dtype",
        "flight_recorder.first_divergence.culprits": "list<int>: ranks outside the most common value at that seq",
        "flight_recorder.timeouts": "list<map>: collectives that provably waited past their timeout: {pg, desc, seq, op, timeout_ms, waited_ms, waiting_ranks, late_ranks}",
        "flight_recorder.timeouts[].text": "string: one line for a report",
        "flight_recorder.timeouts[].pg": "string: process-group name",
        "flight_recorder.timeouts[].desc": "string: process-group description",
        "flight_recorder.timeouts[].seq": "int: collective seq id",
        "flight_recorder.timeouts[].op": "string: the op (most common across ranks)",
        "flight_recorder.timeouts[].late_ranks": "list<int>: ranks that issued the collective only after the others had waited timeout_ms (they did arrive: slow, not stuck)",
        "flight_recorder.timeouts[].waiting_ranks": "list<int>: ranks that issued it first and waited",
        "flight_recorder.timeouts[].waited_ms": "float: lower bound of the wait (from entry timestamps; dumps carry no dump time)",
        "flight_recorder.timeouts[].timeout_ms": "int: the collective's timeout",
        "flight_recorder.max_wait_ms": "float: longest provable wait of a pending or late-joined collective (lower bound)",
        "flight_recorder.timeout_ms": "list<int>: distinct collective timeouts seen",
        "flight_recorder.inconsistent_groups": "list<string>: groups left out of the culprit search because their dumps disagree in time",
        "flight_recorder.by_rank": "map<string,map>: per rank: entries, pending, state (waiting|idle|no_entries), waits_in, last_op, culprit",
        "flight_recorder.by_rank[].entries": "int: entries in this rank's dump",
        "flight_recorder.by_rank[].pending": "int: of them, issued and not completed",
        "flight_recorder.by_rank[].state": "string: waiting (something pending) | idle | no_entries (recorder off or no collective yet)",
        "flight_recorder.by_rank[].waits_in": "string: the collective it waits in as 'pg name (desc) seq N op', '' when none",
        "flight_recorder.by_rank[].last_op": "string: op of its newest entry, '' when it has none",
        "flight_recorder.by_rank[].culprit": "string: its culprit kind (not_issued, not_completed, ...) when it is a culprit, else ''",
    }

    def sniff(self, sample: Sample) -> bool:
        raw = sample.raw
        if is_pickle(raw):
            return b"version" in raw and sum(k in raw for k in _FR_KEYS) >= 2
        # the first non-blank byte, without copying the sample to strip it (every file of a folder
        # comes through here); bytes.isspace and bytes.lstrip agree on what is blank
        head = raw[:1]
        if head.isspace():
            head = raw.lstrip()[:1]
        if head == b"{":
            return sum(b'"' + k + b'"' in raw for k in _FR_KEYS) >= 2
        # A binary file named like a dump that is not a readable one: claim it, so the report says
        # why it could not be used instead of silently ignoring a rank's evidence.
        if _NAME_RE.search(sample.name) and raw:
            odd = sum(1 for b in raw[:4096] if b < 9 or 13 < b < 32 or b > 126)
            return odd / min(len(raw), 4096) > 0.3
        return False

    #: torch's debug server serves every rank's dump on one page (``/fr_trace_json``); the page
    #: belongs to the debug_server kind (who answered), the dumps in it are read here.
    also_reads: ClassVar[frozenset[str] | None] = frozenset({"debug_server"})

    def also_sniff(self, sample: Sample) -> bool:
        return not sample.is_binary and any(is_page(sample.text, e) for e in _SERVER_ENDPOINTS)

    def parse(self, path: Path, rel: str, hints: Hints) -> Parsed | list[Parsed]:
        with open(path, "rb") as fh:
            raw = fh.read(self.max_bytes + 1)
        if raw[:1] in (b"\n", b"<", b" ") and any(is_page(raw[:65536].decode("utf-8", "replace"), e)
                                                 for e in _SERVER_ENDPOINTS):
            return self._parse_page(raw.decode("utf-8", errors="replace"), rel, hints)
        dump = load_dump(raw, rel, hints)
        return Parsed(self.name, rel, dump, dump.rank, hints.host, dump.notes)

    def _parse_page(self, text: str, rel: str, hints: Hints) -> list[Parsed]:
        """One dump per rank that answered (the page's section names the rank); a rank that did
        not answer is the debug_server kind's evidence, not a dump."""
        out: list[Parsed] = []
        bad: list[str] = []
        for a in rank_answers(text):
            if a.status != 200 or not a.text.startswith("{"):
                continue
            try:
                dump = load_dump(a.text.encode(), f"{rel}#rank{a.rank}", Hints(rank=a.rank, host=hints.host))
            except EvidenceError as exc:  # one rank's bad answer leaves the others readable
                bad.append(f"rank {a.rank}: {exc.what}")
                continue
            out.append(Parsed(self.name, rel, dump, dump.rank, hints.host, dump.notes + bad[:5]))
        if not out:
            raise EvidenceError(rel, "debug-server page without a readable flight-recorder dump"
                                + (f" ({bad[0]})" if bad else ""))
        return out

    def build(self, parsed: list[Parsed], facts: dict[str, Any]) -> None:
        dumps = [p.data for p in parsed if isinstance(p.data, Dump)]
        facts[self.name] = analyze(dumps, facts)

    def collect(self, ctx: CollectContext) -> dict[str, Any]:
        """Copy the dumps the ranks' watchdogs already wrote (dump on timeout).

        Where: ``TORCH_FR_DUMP_TEMP_FILE`` (or the pre-2.9 ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``)
        from the rank's environment plus its rank, else torch's defaults (:func:`dump_prefixes`);
        read through ``/proc/PID/root`` so a rank in a container is read in its own filesystem.
        Nothing is asked of the job: an on-demand dump needs an in-job hook (see the playbooks,
        or torch's debug server: the debug_server kind); a probe never pokes the job.
        """
        ranks = [p for p in ctx.ranks if p.rank is not None]
        if not ranks:
            raise ProbeSkipped("no rank processes with a known rank on this host")
        found, looked = 0, set()
        for p in ranks:
            for prefix in dump_prefixes(p.env, _job_home(p.pid)):
                looked.add(prefix)
                if self._copy(ctx, p, prefix):
                    found += 1
                    break
        if not found:
            raise ProbeSkipped(
                f"no flight-recorder dump at {', '.join(sorted(looked))}<rank>: the watchdog writes one on "
                "timeout when TORCH_FR_BUFFER_SIZE > 0 (TORCH_FR_DUMP_TEMP_FILE sets where)")
        return {"dumps": found, "ranks": len(ranks)}

    def _copy(self, ctx: CollectContext, p: Any, prefix: str) -> bool:
        """Copy ``<prefix><rank>`` into the bundle when it is there and not too big."""
        name = f"{prefix}{p.rank}"
        try:  # the job chose this path: opened with its user's rights, never through a planted link
            data, size, mtime = read_job_file(name, p.pid, self.max_bytes + 1)
        except JobFileRefused as exc:
            ctx.bundle.note(f"flight_recorder: rank {p.rank}: {exc}")
            return False
        except OSError:
            return False
        if not size or size > self.max_bytes:
            return False
        ctx.add(f"_dump_{p.rank}", data, rank=p.rank, pid=p.pid, text=False, meta={"source": name, "mtime": mtime})
        return True

    def rank_details(self, facts: dict[str, Any]) -> dict[str, dict[int, str]]:
        """The newest collective each rank issued (the TUI's "last collective" column)."""
        ns = facts.get(self.name)
        by_rank = ns.get("by_rank") if isinstance(ns, dict) else None
        col = {int(r): str(info["last_op"]) for r, info in (by_rank.items() if isinstance(by_rank, dict) else ())
               if isinstance(info, dict) and info.get("last_op") and str(r).lstrip("-").isdigit()}
        return {"last collective": col}


PROBE = FlightRecorderProbe()
