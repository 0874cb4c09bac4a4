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

The cross-rank work happens in ``build`` (see :func:`analyze`): per process group, align the
ranks by collective sequence id, then build a wait-for graph (a rank waiting at seq ``s`` of a
group waits for every member that has not issued ``s``). The culprits are its sinks: ranks others
wait for that wait for nobody. Mismatches (op, size, dtype at the same seq of the same group),
cycles (ranks waiting for each other across groups) and timeouts come from the same alignment.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

from doctor.evidence.contract import (
    CollectContext,
    Hints,
    Parsed,
    Probe,
    ProbeSkipped,
    Sample,
    set_world_size,
)
from doctor.evidence.errors import EvidenceError
from doctor.evidence.unpickle import UnpickleError, is_pickle, safe_loads

_FR_KEYS = (b"entries", b"pg_config", b"pg_status", b"nccl_version", b"comm_lib_version",
            b"collective_seq_id", b"profiling_name")
# Names FR dumps get: NVRx/_dump_<rank>, the default TORCH_FR_DUMP_TEMP_FILE prefix
# (nccl_trace_rank_<rank>), and common hand-picked ones (fr_rank3.pkl). Only used to claim a
# binary file that is not a readable dump, so that it is reported instead of ignored.
_NAME_RE = re.compile(r"(?:^|[_-])(?:dump|nccl_trace_rank|fr_trace|fr_rank|fr_dump|fr)_?\d+(?:\.(?:pkl|pickle|bin|json))?$", re.I)
_INT_RE = re.compile(r"-?\d+")
# Ops whose input/output sizes must agree on every rank at the same seq. The rest (all_to_all,
# *_v ops, gather/scatter, coalesced, send/recv) have legitimately different sizes per rank.
_SYMMETRIC_OPS = frozenset({
    "all_reduce", "allreduce", "allreduce_coalesced", "broadcast", "reduce", "barrier",
    "all_gather", "allgather", "_all_gather_base", "all_gather_into_tensor", "allgather_into_tensor_coalesced",
    "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced",
})
# Backends whose completion is tracked on the device (CUDA/XPU events). Only for these does
# "a peer completed seq s but this rank did not" mean the rank's device stopped; gloo completes
# on the CPU and marks failed work done too.
_CPU_BACKENDS = frozenset({"gloo", "mpi", "ucc_cpu"})
MISMATCH_CAP_PER_GROUP = 10  # the same default as torchfrtrace's --mismatch_cap
MISMATCH_CAP = 50
GROUPS_CAP = 200
BLOCKED_CAP = 50
TIMEOUTS_CAP = 20
REASON_LINES_CAP = 10


# -- parsing ---------------------------------------------------------------------------------

@dataclass(slots=True)
class Entry:
    """One FR record, trimmed to what the analysis reads."""

    pg: str
    seq: int
    op_id: int
    p2p_seq: int
    is_p2p: bool
    op: str
    in_sizes: Any
    out_sizes: Any
    in_dtypes: Any
    out_dtypes: Any
    state: str
    done: bool
    created_ns: int
    timeout_ms: int
    where: str


@dataclass(slots=True)
class PgView:
    """One process group as one rank's dump sees it."""

    name: str
    desc: str = ""
    ranks: tuple[int, ...] | None = None
    enqueued: int | None = None
    started: int | None = None
    completed: int | None = None
    entries: list[Entry] = field(default_factory=list)
    has_p2p: bool = False
    pending_p2p: int = 0
    # Which entry counter pg_status counts in: NCCL's is the collective seq id, gloo's (2.10+)
    # is op_id, which also counts the send/recv it does not record as entries.
    space: str = "seq"

    def key(self, e: Entry) -> int:
        return e.op_id if self.space == "op_id" else e.seq


@dataclass
class Dump:
    rank: int
    rel: str
    fmt: str
    version: str
    lib_version: str
    pgs: dict[str, PgView]
    n_entries: int
    newest_ns: int
    backends: list[str]
    notes: list[str] = field(default_factory=list)


def _as_int(v: Any, default: int | None = None) -> int | None:
    if type(v) is int:
        return v
    if v is None:
        return default
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v == v:
        return int(v)
    if isinstance(v, (str, bytes)):
        try:
            return int(v)
        except ValueError:
            return default
    return default


def _ranks_of(v: Any) -> tuple[int, ...] | None:
    """pg_config ranks: a string like "[0, 1]" (torch writes it so) or a list."""
    if isinstance(v, (list, tuple)):
        out = [_as_int(x) for x in v]
        return tuple(x for x in out if x is not None) or None
    if isinstance(v, str):
        return _ranks_of_str(v)
    return None


@lru_cache(maxsize=4096)
def _ranks_of_str(v: str) -> tuple[int, ...] | None:
    # Every rank's dump repeats the same strings (the default group's lists all ranks): parse once.
    return tuple(map(int, _INT_RE.findall(v))) or None


def _canon_pg(name: Any) -> str:
    # gloo in torch 2.10-2.13 writes the default group's pg_config under '' while its entries
    # and pg_status say '0'; the default group is '0' everywhere else.
    s = str(name) if name is not None else ""
    return s if s else "0"


def _plain(v: Any) -> Any:
    """Sizes and dtypes as JSON-friendly lists (tuples from pickles become lists)."""
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


def _where(frames: Any) -> str:
    """The first Python frame outside torch.distributed: where the job called the collective."""
    if not isinstance(frames, list):
        return ""
    for fr in frames:
        if not isinstance(fr, dict):
            continue
        fn = str(fr.get("filename", ""))
        if "torch/distributed" in fn or "torch\\distributed" in fn:
            continue
        return f"{fr.get('name', '?')} ({Path(fn).name}:{fr.get('line', '?')})"
    return ""


def _entry(e: dict[str, Any]) -> Entry | None:
    pg = e.get("process_group")
    seq = _as_int(e.get("collective_seq_id"))
    if not isinstance(pg, (list, tuple)) or not pg or seq is None:
        return None
    state = str(e.get("state") or "")
    retired = bool(e.get("retired"))
    return Entry(
        pg=_canon_pg(pg[0]), seq=seq, op_id=_as_int(e.get("op_id"), seq) or seq,
        p2p_seq=_as_int(e.get("p2p_seq_id"), 0) or 0,
        is_p2p=bool(e.get("is_p2p")), op=str(e.get("profiling_name") or "?"),
        in_sizes=e.get("input_sizes") or [], out_sizes=e.get("output_sizes") or [],
        in_dtypes=e.get("input_dtypes") or [], out_dtypes=e.get("output_dtypes") or [],
        state=state, done=state == "completed" or retired, created_ns=_as_int(e.get("time_created_ns"), 0) or 0,
        timeout_ms=_as_int(e.get("timeout_ms"), 0) or 0, where=_where(e.get("frames")),
    )


def _map_status_keys(status_keys: list[str], config_names: list[str], known: dict[str, str]) -> dict[str, str]:
    """Map pg_status keys (local pg ids) to process-group names.

    Entries give ``pg_id -> name`` for every group that has one. For the others: process-group
    names are a global creation counter ('0', '1', '33', ...) and pg ids the local creation
    order, so both sort the same way; the sorted pairing is used only when the counts match, the
    names are numbers and the pairing agrees with every pair the entries gave.
    """
    out = dict(known)
    left_k = [k for k in status_keys if k not in out]
    if not left_k:
        return out
    if (len(status_keys) == len(config_names) and all(n.lstrip("-").isdigit() for n in config_names)
            and all(k.lstrip("-").isdigit() for k in status_keys)):
        pairs = dict(zip(sorted(status_keys, key=int), sorted(config_names, key=int), strict=True))
        if all(pairs[k] == v for k, v in known.items() if k in pairs):
            return pairs
    left_n = [n for n in config_names if n not in out.values()]
    if len(left_k) == 1 and len(left_n) == 1:
        out[left_k[0]] = left_n[0]
    return out


def load_dump(raw: bytes, rel: str, hints: Hints) -> Dump:
    """Decode one dump (pickle or JSON) into a :class:`Dump`; ``EvidenceError`` when unusable."""
    if is_pickle(raw):
        fmt = "pickle"
        try:
            obj = safe_loads(raw, max_bytes=FlightRecorderProbe.max_bytes)
        except UnpickleError as exc:
            raise EvidenceError(rel, f"unreadable flight-recorder dump: {exc}") from None
    elif raw.lstrip()[:1] == b"{":
        fmt = "json"
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise EvidenceError(rel, f"unreadable flight-recorder JSON: {str(exc)[:160]}") from None
    else:
        raise EvidenceError(rel, "not a flight-recorder dump (neither a pickle nor JSON)")
    if not isinstance(obj, dict) or not ({"entries", "pg_status", "pg_config"} & set(obj)):
        raise EvidenceError(rel, "not a flight-recorder dump (no entries, pg_config or pg_status)")
    rank = _as_int(obj.get("rank"))
    if rank is None or rank < 0:
        rank = hints.rank
    if rank is None:
        raise EvidenceError(rel, "flight-recorder dump without a rank (no 'rank' key and none in the file name)")
    notes: list[str] = []

    pgs: dict[str, PgView] = {}
    cfg = obj.get("pg_config") if isinstance(obj.get("pg_config"), dict) else {}
    for key, c in cfg.items():
        c = c if isinstance(c, dict) else {}
        name = _canon_pg(c.get("name") or key)
        desc = str(c.get("desc") or "") or ("default_pg" if name == "0" else "")
        pgs[name] = PgView(name, desc, _ranks_of(c.get("ranks")))

    raw_entries = obj.get("entries") if isinstance(obj.get("entries"), list) else []
    bad = 0
    known_ids: dict[str, str] = {}
    newest = 0
    backends: Counter[str] = Counter()
    for e in raw_entries:
        ent = _entry(e) if isinstance(e, dict) else None
        if ent is None:
            bad += 1
            continue
        view = pgs.get(ent.pg)
        if view is None:
            pgs[ent.pg] = view = PgView(ent.pg)
        pgd = e["process_group"]
        if len(pgd) > 1 and pgd[1] and not view.desc:
            view.desc = str(pgd[1])
        view.entries.append(ent)
        if ent.is_p2p:
            view.has_p2p = True
            view.pending_p2p += not ent.done
        pid = _as_int(e.get("pg_id"))
        if pid is not None:
            known_ids[str(pid)] = ent.pg
        for k in ("time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns"):
            t = _as_int(e.get(k), 0) or 0
            newest = max(newest, t)
        backends[ent.op.split(":", 1)[0] if ":" in ent.op else "?"] += 1
    if bad:
        notes.append(f"{bad} malformed entries skipped")

    status = obj.get("pg_status") if isinstance(obj.get("pg_status"), dict) else {}
    if status:
        keys = [str(k) for k in status]
        mapping = _map_status_keys(keys, list(pgs), known_ids)
        unmapped = 0
        for k, st in status.items():
            name = mapping.get(str(k))
            if name is None or not isinstance(st, dict):
                unmapped += 1
                continue
            view = pgs.setdefault(name, PgView(name))
            view.enqueued = _as_int(st.get("last_enqueued_collective"))
            view.started = _as_int(st.get("last_started_collective"))
            view.completed = _as_int(st.get("last_completed_collective"))
        if unmapped:
            notes.append(f"{unmapped} pg_status groups could not be matched to a process group")

    for view in pgs.values():
        view.entries.sort(key=lambda x: x.seq)
        if view.enqueued is None or view.completed is None:
            _status_from_entries(view)
            continue
        coll = [e for e in view.entries if not e.is_p2p]
        if coll and view.enqueued != max(e.seq for e in coll) and view.enqueued == max(e.op_id for e in coll):
            view.space = "op_id"

    return Dump(
        rank=rank, rel=rel, fmt=fmt, version=str(obj.get("version") or ""),
        lib_version=str(obj.get("nccl_version") or obj.get("comm_lib_version") or ""),
        pgs=pgs, n_entries=len(raw_entries) - bad, newest_ns=newest,
        backends=[b for b, _ in backends.most_common()], notes=notes,
    )


def _status_from_entries(view: PgView) -> None:
    """Dumps without pg_status (or whose status cannot be aligned): last issued/completed
    collective seq from the entries themselves."""
    view.space = "seq"
    coll = [e for e in view.entries if not e.is_p2p]
    if not coll:
        return
    view.enqueued = max(e.seq for e in coll)
    pending = [e.seq for e in coll if not e.done]
    done = [e.seq for e in coll if e.done]
    if pending:
        view.completed = min(pending) - 1
    else:
        view.completed = max(done) if done else view.enqueued


# -- the probe -------------------------------------------------------------------------------

class FlightRecorderProbe(Probe):
    name: ClassVar[str] = "flight_recorder"
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
    max_bytes: ClassVar[int] = 512 * 2**20
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
    }

    def sniff(self, sample: Sample) -> bool:
        raw = sample.raw
        if is_pickle(raw):
            return b"version" in raw and sum(k in raw for k in _FR_KEYS) >= 2
        head = raw.lstrip()[:1]
        if head == b"{":
            return sum(b'"' + k + b'"' in raw for k in _FR_KEYS) >= 2
        # A binary file named like a dump that is not a readable one: claim it, so the report says
        # why it could not be used instead of silently ignoring a rank's evidence.
        if _NAME_RE.search(sample.name) and raw:
            odd = sum(1 for b in raw[:4096] if b < 9 or 13 < b < 32 or b > 126)
            return odd / min(len(raw), 4096) > 0.3
        return False

    def parse(self, path: Path, rel: str, hints: Hints) -> Parsed:
        with open(path, "rb") as fh:
            raw = fh.read(self.max_bytes + 1)
        dump = load_dump(raw, rel, hints)
        return Parsed(self.name, rel, dump, dump.rank, hints.host, dump.notes)

    def build(self, parsed: list[Parsed], facts: dict[str, Any]) -> None:
        dumps = [p.data for p in parsed if isinstance(p.data, Dump)]
        facts[self.name] = analyze(dumps, facts)

    def collect(self, ctx: CollectContext) -> dict[str, Any]:
        """Copy the dumps the ranks' watchdogs already wrote (dump on timeout).

        Where: ``TORCH_FR_DUMP_TEMP_FILE`` (or the pre-2.9 ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``)
        from the rank's environment plus its rank, else torch's default
        ``<tmp>/nccl_trace_rank_<rank>``; read through ``/proc/PID/root`` so a rank in a
        container is read in its own filesystem. Nothing is asked of the job: an on-demand dump
        needs an in-job hook (see the playbooks); a probe never pokes the job.
        """
        ranks = [p for p in ctx.ranks if p.rank is not None]
        if not ranks:
            raise ProbeSkipped("no rank processes with a known rank on this host")
        found, looked = 0, set()
        for p in ranks:
            prefix = (p.env.get("TORCH_FR_DUMP_TEMP_FILE") or p.env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
                      or os.path.join(tempfile.gettempdir(), "nccl_trace_rank_"))
            looked.add(prefix)
            name = f"{prefix}{p.rank}"
            base = f"/proc/{p.pid}/cwd" if not os.path.isabs(name) else f"/proc/{p.pid}/root"
            for cand in (Path(base + "/" + name.lstrip("/")), Path(name)):
                try:
                    size = cand.stat().st_size
                    if not size or size > self.max_bytes:
                        continue
                    data = cand.read_bytes()
                    mtime = cand.stat().st_mtime
                except OSError:
                    continue
                ctx.add(f"_dump_{p.rank}", data, rank=p.rank, pid=p.pid, text=False,
                        meta={"source": name, "mtime": mtime})
                found += 1
                break
        if not found:
            raise ProbeSkipped(
                f"no flight-recorder dump at {', '.join(sorted(looked))}<rank>: the watchdog writes one on "
                "timeout when TORCH_FR_BUFFER_SIZE > 0 and TORCH_FR_DUMP_TEMP_FILE are set")
        return {"dumps": found, "ranks": len(ranks)}


# -- analysis --------------------------------------------------------------------------------

@dataclass
class _Group:
    name: str
    desc: str
    members: list[int]
    views: dict[int, PgView]
    missing: list[int]
    p2p: bool
    consistent: bool = True


@dataclass
class _Wait:
    """A collective some ranks wait in, and who they wait for."""

    pg: str
    seq: int  # in the group's pg_status counter (see PgView.space)
    waiters: list[int]
    not_issued: list[int]
    no_dump: list[int]
    completed_by: list[int]
    op: str = ""
    cseq: int = -1  # the collective seq id of the waiters' entry, for people to read

    @property
    def shown(self) -> int:
        return self.cseq if self.cseq >= 0 else self.seq


def _mode(values: list[int]) -> int:
    c = Counter(values)
    top = max(c.values())
    return max(v for v, n in c.items() if n == top)


def _groups(dumps: dict[int, Dump], world: int) -> list[_Group]:
    names: dict[str, dict[int, PgView]] = {}
    for r, d in dumps.items():
        for name, view in d.pgs.items():
            names.setdefault(name, {})[r] = view
    out = []
    for name, views in names.items():
        descs = Counter(v.desc for v in views.values() if v.desc)
        cfg = Counter(v.ranks for v in views.values() if v.ranks)
        members = list(cfg.most_common(1)[0][0]) if cfg else sorted(views)
        if name == "0" and not cfg and world:
            members = list(range(world))
        members = sorted(set(members) | set(views))
        # A member with a dump that does not show this group (gloo writes no pg_config for
        # subgroups) is unknown here, not missing.
        missing = [m for m in members if m not in dumps]
        out.append(_Group(name, descs.most_common(1)[0][0] if descs else "", members,
                          {r: v for r, v in views.items() if v.enqueued is not None},
                          missing, any(v.has_p2p for v in views.values())))
    return out


def _realign(g: _Group) -> bool:
    """Fall back to entry-derived seqs when pg_status counts in op_id space (gloo) and the ranks'
    op_ids disagree for one collective: they did different numbers of unrecorded send/recv, so
    their status counters cannot be compared. Returns whether it changed anything."""
    if not any(v.space == "op_id" for v in g.views.values()):
        return False
    ids: dict[int, set[int]] = {}
    for v in g.views.values():
        for e in v.entries:
            if not e.is_p2p:
                ids.setdefault(e.seq, set()).add(e.op_id)
    if all(len(x) == 1 for x in ids.values()):
        return False
    for v in g.views.values():
        v.enqueued = v.completed = None
        _status_from_entries(v)
    g.views = {r: v for r, v in g.views.items() if v.enqueued is not None}
    return True


def _waits(g: _Group, backend_cpu: bool) -> tuple[list[_Wait], dict[int, tuple[int, str, int]]]:
    """Who waits for whom in one group; and ranks whose own completion lags (self-blocked)."""
    waits: dict[int, _Wait] = {}
    self_blocked: dict[int, tuple[int, str, int]] = {}
    E = {r: v.enqueued for r, v in g.views.items()}
    C = {r: v.completed for r, v in g.views.items() if v.completed is not None}
    for r, v in g.views.items():
        if v.completed is None or v.enqueued is None or v.enqueued <= v.completed:
            continue
        # The collective it waits in: its first unfinished entry past the last completed one
        # (gloo's status does not count finished send/recv as completed), else the next seq.
        first = min((e for e in v.entries if not e.is_p2p and not e.done and v.key(e) > v.completed),
                    key=v.key, default=None)
        s = v.key(first) if first is not None and v.key(first) <= v.enqueued else v.completed + 1
        w = waits.get(s)
        if w is None:
            w = waits[s] = _Wait(
                g.name, s, [], sorted(q for q, e in E.items() if e is not None and e < s),
                list(g.missing), sorted(q for q, c in C.items() if c >= s))
        w.waiters.append(r)
        if not w.op:
            ent = next((e for e in v.entries if v.key(e) == s and not e.is_p2p), None)
            if ent is not None:
                w.op, w.cseq = ent.op, ent.seq
    for w in waits.values():
        w.waiters.sort()
        if not w.not_issued and w.completed_by and not g.missing and not backend_cpu:
            for r in w.waiters:
                lag = max(C[q] for q in w.completed_by) - C[r]
                if r not in self_blocked or lag > self_blocked[r][2]:
                    self_blocked[r] = (w.shown, f"rank(s) {_short(w.completed_by)} completed it", lag)
    return list(waits.values()), self_blocked


def _last_issued(v: PgView | None) -> str:
    """The last issued collective seq of a view, in collective seq ids where the entries allow."""
    if v is None or v.enqueued is None:
        return "?"
    ent = next((e for e in reversed(v.entries) if not e.is_p2p and v.key(e) == v.enqueued), None)
    if ent is not None:
        return str(ent.seq)
    if v.space == "op_id":
        last = max((e.seq for e in v.entries if not e.is_p2p and v.key(e) <= v.enqueued), default=None)
        return str(last) if last is not None else "?"
    return str(v.enqueued)


def _own_pending(d: Dump) -> str:
    """Where a rank's own unfinished work is, in a few words."""
    out = []
    for v in d.pgs.values():
        if v.enqueued is not None and v.completed is not None and v.enqueued > v.completed or v.pending_p2p:
            ent = next((e for e in v.entries if not e.done), None)
            out.append(f"{_pgname(None, v.name)}{' ' + v.desc if v.desc else ''}"
                       f"{' ' + ent.op if ent else ''}")
    return "; ".join(out[:3]) + (f"; +{len(out) - 3} more" if len(out) > 3 else "") if out else "none"


def _short(ranks: list[int], cap: int = 8) -> str:
    rs = sorted(ranks)
    if len(rs) <= cap:
        return ",".join(map(str, rs))
    return ",".join(map(str, rs[:cap])) + f",... ({len(rs)} ranks)"


def _pgname(g: _Group | None, name: str) -> str:
    return f"pg {name} ({g.desc})" if g and g.desc else f"pg {name}"


def _sccs(nodes: list[Any], edges: dict[Any, list[Any]]) -> list[list[Any]]:
    """Tarjan's strongly connected components, iterative (no recursion limit at 16k ranks)."""
    index: dict[Any, int] = {}
    low: dict[Any, int] = {}
    on: set[Any] = set()
    stack: list[Any] = []
    out: list[list[Any]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(edges.get(root, ())))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(edges.get(nxt, ()))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                out.append(comp)
    return out


def _size_key(e: Entry) -> str:
    return json.dumps([_plain(e.in_sizes), _plain(e.out_sizes)], separators=(",", ":"))


def _dtype_key(e: Entry) -> str | None:
    if not e.in_dtypes and not e.out_dtypes:
        return None
    return json.dumps([_plain(e.in_dtypes), _plain(e.out_dtypes)], separators=(",", ":"))


def _all_equal(ents: list[Entry], attrs: tuple[str, ...]) -> bool:
    """The common case, checked with C-level list comparison before any key is built."""
    first = ents[0]
    want = [_norm(getattr(first, a)) for a in attrs]
    return all([_norm(getattr(e, a)) for a in attrs] == want for e in ents[1:])


def _norm(v: Any) -> Any:
    # pickles give tuples where JSON gives lists; compare them alike
    return _plain(v) if isinstance(v, tuple) or (isinstance(v, list) and v and isinstance(v[0], tuple)) else v


def _mismatches(g: _Group) -> tuple[list[dict[str, Any]], int, dict[tuple[str, int], int]]:
    """Op, then size (symmetric ops only), then dtype disagreement at each shared seq."""
    by_seq: dict[int, dict[int, Entry]] = {}
    for r, v in g.views.items():
        for e in v.entries:
            if not e.is_p2p:
                by_seq.setdefault(e.seq, {})[r] = e
    out: list[dict[str, Any]] = []
    total = 0
    first_ns: dict[tuple[str, int], int] = {}
    for seq in sorted(by_seq):
        ents = by_seq[seq]
        if len(ents) < 2:
            continue
        elist = list(ents.values())
        groups: dict[str, list[int]] = {}
        if not _all_equal(elist, ("op",)):
            kind, groups = "op", _split(ents, lambda e: e.op)
        else:
            base = elist[0].op.split(":")[-1].strip()
            if base in _SYMMETRIC_OPS and not _all_equal(elist, ("in_sizes", "out_sizes")):
                kind, groups = "size", _split(ents, _size_key)
            if len(groups) <= 1 and not _all_equal(elist, ("in_dtypes", "out_dtypes")):
                kind, groups = "dtype", _split(ents, _dtype_key)
        if len(groups) <= 1:
            continue
        total += 1
        if len(out) >= MISMATCH_CAP_PER_GROUP:
            continue
        ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
        top = len(ordered[0][1])
        majority = top > len(ordered[1][1])
        culprits = sorted(r for val, rs in ordered[1 if majority else 0:] for r in rs)
        values = [{"value": val, "ranks": sorted(rs), "where": ents[min(rs)].where} for val, rs in ordered]
        text = f"{kind} differs at seq {seq} of {_pgname(g, g.name)}: " + "; ".join(
            f"{v['value']} on rank(s) {_short(v['ranks'])}" + (f" from {v['where']}" if v["where"] else "")
            for v in values)
        out.append({"pg": g.name, "desc": g.desc, "seq": seq, "kind": kind, "values": values,
                    "culprits": culprits, "text": text})
        first_ns[(g.name, seq)] = min((e.created_ns for e in ents.values() if e.created_ns), default=0)
    return out, total, first_ns


def _split(ents: dict[int, Entry], key: Any) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for r, e in ents.items():
        k = key(e)
        if k is None:
            continue
        out.setdefault(str(k), []).append(r)
    return out


def _timeouts(groups: list[_Group], newest_ns: int) -> tuple[list[dict[str, Any]], float]:
    """Collectives whose wait provably exceeded their timeout, from entry timestamps alone.

    Two lower bounds (dumps carry no dump time): the spread of creation times of one seq across
    ranks (a rank that issued it ``t`` after the others made them wait at least ``t``), and the
    age of a pending entry against the newest timestamp anywhere in the dumps.
    """
    out: list[dict[str, Any]] = []
    max_wait = 0.0
    for g in groups:
        if g.p2p:
            continue
        by_seq: dict[int, dict[int, Entry]] = {}
        for r, v in g.views.items():
            for e in v.entries:
                if not e.is_p2p and e.created_ns:
                    by_seq.setdefault(e.seq, {})[r] = e
        for seq, ents in by_seq.items():
            first = min(e.created_ns for e in ents.values())
            tmo = max((e.timeout_ms for e in ents.values()), default=0)
            late = sorted(r for r, e in ents.items() if tmo and (e.created_ns - first) / 1e6 >= tmo)
            pending = [r for r, e in ents.items() if not e.done]
            spread = (max(e.created_ns for e in ents.values()) - first) / 1e6
            age = (newest_ns - first) / 1e6 if pending else 0.0
            waited = max(spread, age)
            max_wait = max(max_wait, waited)
            if tmo and waited >= tmo:
                early = sorted(r for r in ents if r not in late)
                op = Counter(e.op for e in ents.values()).most_common(1)[0][0]
                text = (f"seq {seq} {op} of {_pgname(g, g.name)}: " + (
                    f"rank(s) {_short(late)} issued it {waited:.0f} ms after rank(s) {_short(early)}"
                    if late else f"rank(s) {_short(early)} waited at least {waited:.0f} ms") + f" (timeout {tmo} ms)")
                out.append({"pg": g.name, "desc": g.desc, "seq": seq, "op": op, "timeout_ms": tmo,
                            "waited_ms": round(waited, 1), "waiting_ranks": early, "late_ranks": late,
                            "text": text})
    out.sort(key=lambda t: -t["waited_ms"])
    return out[:TIMEOUTS_CAP], round(max_wait, 1)


def analyze(dump_list: list[Dump], facts: dict[str, Any]) -> dict[str, Any]:
    """The cross-rank analysis: every ``flight_recorder.*`` fact from the per-rank dumps."""
    dumps: dict[int, Dump] = {}
    for d in dump_list:  # two dumps for one rank: keep the richer one
        if d.rank not in dumps or d.n_entries > dumps[d.rank].n_entries:
            dumps[d.rank] = d
    cfg_world = 0
    for d in dumps.values():
        for v in d.pgs.values():
            if v.ranks:
                cfg_world = max(cfg_world, max(v.ranks) + 1)
    set_world_size(facts, cfg_world)
    world = int(facts.get("job", {}).get("world_size") or 0) or (max(dumps) + 1 if dumps else 0)
    ranks = sorted(dumps)
    missing_dumps = sorted(set(range(world)) - set(ranks)) if world else []
    cpu = {b for d in dumps.values() for b in d.backends}
    backend_cpu = bool(cpu) and cpu <= _CPU_BACKENDS

    groups = _groups(dumps, world)
    by_name = {g.name: g for g in groups}
    waits: list[_Wait] = []
    self_blocked: dict[int, tuple[int, str, str, int]] = {}
    inconsistent: list[str] = []
    for g in groups:
        es = [v.enqueued for v in g.views.values() if v.enqueued is not None]
        cs = [v.completed for v in g.views.values() if v.completed is not None]
        g.consistent = not (es and cs and max(cs) > min(es))
        if g.p2p or len(g.views) < 1:
            continue
        if _realign(g):
            es = [v.enqueued for v in g.views.values() if v.enqueued is not None]
            cs = [v.completed for v in g.views.values() if v.completed is not None]
            g.consistent = not (es and cs and max(cs) > min(es))
        if not g.consistent:
            inconsistent.append(f"{g.name}:{g.desc}" if g.desc else g.name)
            continue
        gw, sb = _waits(g, backend_cpu)
        waits.extend(gw)
        for r, (s, why, lag) in sb.items():
            if r not in self_blocked or lag > self_blocked[r][3]:
                self_blocked[r] = (s, g.name, why, lag)

    pending_any = {r for r, d in dumps.items()
                   if any((v.enqueued is not None and v.completed is not None and v.enqueued > v.completed)
                          or v.pending_p2p for v in d.pgs.values())}
    idle = sorted(set(dumps) - pending_any)

    # Wait-for graph over ranks and collective nodes: rank -> wait -> ranks not issued.
    edges: dict[Any, list[Any]] = {}
    waited_for: dict[int, list[_Wait]] = {}
    for i, w in enumerate(waits):
        if not w.not_issued:
            continue
        node = ("w", i)
        edges[node] = list(w.not_issued)
        for r in w.waiters:
            edges.setdefault(r, []).append(node)
        for q in w.not_issued:
            waited_for.setdefault(q, []).append(w)
    waits_on_someone = {r for r in dumps if edges.get(r)}

    culprits: dict[int, tuple[str, str]] = {}
    for q, ws in waited_for.items():
        if q in waits_on_someone or q in pending_any:
            continue
        w = max(ws, key=lambda x: len(x.waiters))
        g = by_name[w.pg]
        culprits[q] = ("not_issued", (
            f"never issued seq {w.shown}{' (' + w.op + ')' if w.op else ''} of {_pgname(g, w.pg)} that "
            f"rank(s) {_short(w.waiters)} wait in (its last there is seq {_last_issued(g.views.get(q))}) "
            f"and has nothing pending anywhere: it is outside the collectives"))
    for r, (s, pg, why, _lag) in self_blocked.items():
        if r in waits_on_someone or r in culprits:
            continue
        v = by_name[pg].views[r]
        culprits[r] = ("not_completed", (
            f"issued seq {s} of {_pgname(by_name[pg], pg)} and {why}, but it never completed here "
            f"(issued up to {v.enqueued}, completed up to {v.completed}): its device-side work stopped"))
    for q, ws in waited_for.items():
        # Others wait for q, q waits for no one, yet it has unfinished work of its own (in a
        # send/recv group, which is not aligned, or work no member holds up): it still has not
        # reached the collective the others wait in.
        if q in waits_on_someone or q in culprits:
            continue
        w = max(ws, key=lambda x: len(x.waiters))
        g = by_name[w.pg]
        own = _own_pending(dumps[q])
        culprits[q] = ("not_issued", (
            f"never issued seq {w.shown}{' (' + w.op + ')' if w.op else ''} of {_pgname(g, w.pg)} that "
            f"rank(s) {_short(w.waiters)} wait in (its last there is seq {_last_issued(g.views.get(q))}); "
            f"its own unfinished work ({own}) waits for no rank with a dump"))

    # Ranks without a dump are named only when the dumps explain nothing else: in NCCL jobs many
    # groups wait "jointly" (every member issued, none completed) because their streams are held
    # up by the real culprit elsewhere, and a missing member of such a group is most likely just
    # as stuck. When no rank with a dump is to blame, the missing ones are the best lead.
    undumped: set[int] = set()
    if not culprits:
        for w in sorted(waits, key=lambda x: -len(x.waiters)):
            if not w.not_issued and w.no_dump and not w.completed_by:
                undumped.update(w.no_dump)
                g = by_name.get(w.pg)
                for q in w.no_dump:
                    culprits.setdefault(q, ("no_dump", (
                        f"left no dump, and rank(s) {_short(w.waiters)} wait in seq {w.shown} of "
                        f"{_pgname(g, w.pg)} that every member with a dump has issued")))

    cycles = _cycles(edges, waits, by_name, culprits)

    mismatches: list[dict[str, Any]] = []
    n_mis = 0
    first_ns: dict[tuple[str, int], int] = {}
    for g in groups:
        if g.p2p:
            continue
        ms, n, fn = _mismatches(g)
        n_mis += n
        first_ns.update(fn)
        mismatches.extend(ms)
    mismatches.sort(key=lambda m: (first_ns.get((m["pg"], m["seq"])) or 0, m["pg"], m["seq"]))
    first = dict(mismatches[0]) if mismatches else {}
    if first:
        first = {k: first[k] for k in ("pg", "desc", "seq", "kind", "culprits")}
    mismatches = mismatches[:MISMATCH_CAP]

    newest = max((d.newest_ns for d in dumps.values()), default=0)
    timeouts, max_wait = _timeouts(groups, newest)
    tmos = sorted({e.timeout_ms for d in dumps.values() for v in d.pgs.values() for e in v.entries if e.timeout_ms})

    blocked = sorted(waits, key=lambda w: (-len(w.not_issued), -len(w.no_dump), -len(w.waiters), w.pg))
    blocked_out = [{"pg": w.pg, "desc": by_name[w.pg].desc, "seq": w.shown, "op": w.op, "waiters": w.waiters,
                    "not_issued": w.not_issued, "no_dump": w.no_dump, "completed_by": w.completed_by}
                   for w in blocked[:BLOCKED_CAP]]

    group_out = _group_facts(groups, waits, mismatches)
    kinds = {str(r): k for r, (k, _) in sorted(culprits.items())}
    by_kind: dict[str, list[str]] = {}
    for r, (k, why) in sorted(culprits.items()):
        lines = by_kind.setdefault(k, [])
        if len(lines) < REASON_LINES_CAP:
            lines.append(f"rank {r}: {why}")
    reasons = {str(r): why for r, (_, why) in sorted(culprits.items())}
    by_rank = _by_rank(dumps, waits, by_name, pending_any, culprits)
    empty = sorted(r for r, d in dumps.items() if not d.n_entries and all(v.enqueued is None for v in d.pgs.values()))
    return {
        "dumps": len(dumps),
        "ranks": ranks,
        "missing_dumps": missing_dumps,
        "empty_dumps": empty,
        "versions": sorted({d.version for d in dumps.values() if d.version}),
        "backends": sorted(cpu - {"?"}),
        "n_entries": sum(d.n_entries for d in dumps.values()),
        "n_groups": len(groups),
        "groups": group_out,
        "waiting_ranks": sorted(pending_any),
        "idle_ranks": idle,
        "culprits": sorted(culprits),
        "culprit_reasons": reasons,
        "culprit_kinds": kinds,
        "reasons_by_kind": by_kind,
        "outside_ranks": sorted(r for r, (k, _) in culprits.items() if k == "not_issued"),
        "stalled_ranks": sorted(r for r, (k, _) in culprits.items() if k == "not_completed"),
        "undumped_blockers": sorted(undumped),
        "blocked": blocked_out,
        "cycles": cycles,
        "mismatches": mismatches,
        "n_mismatches": n_mis,
        "first_divergence": first,
        "timeouts": timeouts,
        "max_wait_ms": max_wait,
        "timeout_ms": tmos,
        "inconsistent_groups": inconsistent,
        "by_rank": by_rank,
    }


def _cycles(edges: dict[Any, list[Any]], waits: list[_Wait], by_name: dict[str, _Group],
            culprits: dict[int, tuple[str, str]]) -> list[dict[str, Any]]:
    """Sink components of the wait-for graph with more than one rank: ranks waiting for each
    other in different groups (a collective order mismatch), with no one outside to blame."""
    nodes = list(edges)
    comps = _sccs(nodes, edges)
    comp_of = {n: i for i, c in enumerate(comps) for n in c}
    out = []
    for i, comp in enumerate(comps):
        ranks = sorted(n for n in comp if isinstance(n, int))
        if len(ranks) < 2:
            continue
        if any(comp_of.get(m) != i for n in comp for m in edges.get(n, ())):
            continue  # not a sink: it waits on something outside the cycle
        where: dict[int, int] = {}
        for n in comp:
            if isinstance(n, tuple):
                for r in waits[n[1]].waiters:
                    if r in comp_of and comp_of[r] == i:
                        where.setdefault(r, n[1])
        by_wait: dict[int, list[int]] = {}
        for r, wi in where.items():
            by_wait.setdefault(wi, []).append(r)
        sizes = sorted(((len(rs), wi) for wi, rs in by_wait.items()), reverse=True)
        if len(sizes) > 1 and sizes[0][0] > sizes[1][0]:
            minority = sorted(r for wi, rs in by_wait.items() if wi != sizes[0][1] for r in rs)
        else:
            minority = ranks
        pgs = []
        for wi in sorted(by_wait):
            w = waits[wi]
            g = by_name.get(w.pg)
            pgs.append(f"{w.pg}:{g.desc if g else ''} seq {w.shown} {w.op}".strip())
        for r in minority:
            others = [pgs[j] for j, wi in enumerate(sorted(by_wait)) if r not in by_wait[wi]]
            culprits.setdefault(r, ("cycle", (
                f"waits in {pgs[[j for j, wi in enumerate(sorted(by_wait)) if r in by_wait[wi]][0]]} while "
                f"the ranks it waits for wait in {', '.join(others) or 'another group'}: the ranks call "
                f"collectives of different groups in a different order")))
        out.append({"ranks": ranks, "culprits": minority, "pgs": pgs,
                    "text": f"rank(s) {_short(ranks)} wait for each other across {' / '.join(pgs)}"})
    return out


def _group_facts(groups: list[_Group], waits: list[_Wait], mismatches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    mis_pgs = Counter(m["pg"] for m in mismatches)
    waits_by_pg: dict[str, list[_Wait]] = {}
    for w in waits:
        waits_by_pg.setdefault(w.pg, []).append(w)
    recs = []
    for g in groups:
        es = {r: v.enqueued for r, v in g.views.items() if v.enqueued is not None}
        cs = {r: v.completed for r, v in g.views.items() if v.completed is not None}
        wf = _mode(list(es.values())) if es else -1
        pending = sorted(r for r in es if r in cs and es[r] > cs[r])
        gw = waits_by_pg.get(g.name, [])
        top = max(gw, key=lambda w: len(w.waiters)) if gw else None
        rec = {
            "pg": g.name, "desc": g.desc, "size": len(g.members), "dumped": len(g.views),
            "missing": g.missing, "p2p": g.p2p, "consistent": g.consistent, "wavefront": wf,
            "behind": sorted(r for r, e in es.items() if e < wf),
            "ahead": sorted(r for r, e in es.items() if e > wf),
            "pending": pending, "waiting_seq": top.seq if top else -1, "op": top.op if top else "",
            "last_enqueued": {str(r): e for r, e in sorted(es.items())},
            "last_completed": {str(r): c for r, c in sorted(cs.items())},
        }
        score = (bool(top and top.not_issued) * 4 + bool(mis_pgs.get(g.name)) * 4 + bool(rec["behind"]) * 2
                 + bool(pending) + (not g.consistent))
        if score:
            recs.append((score, rec))
    recs.sort(key=lambda sr: (-sr[0], -sr[1]["size"], sr[1]["pg"]))
    return [r for _, r in recs[:GROUPS_CAP]]


def _by_rank(dumps: dict[int, Dump], waits: list[_Wait], by_name: dict[str, _Group], pending_any: set[int],
             culprits: dict[int, tuple[str, str]]) -> dict[str, dict[str, Any]]:
    first_wait: dict[int, _Wait] = {}
    for w in waits:
        for r in w.waiters:
            if r not in first_wait or (w.not_issued and not first_wait[r].not_issued):
                first_wait[r] = w
    out = {}
    for r, d in sorted(dumps.items()):
        newest = max((e for v in d.pgs.values() for e in v.entries), key=lambda e: e.created_ns, default=None)
        w = first_wait.get(r)
        state = "waiting" if r in pending_any else ("no_entries" if not d.n_entries and not any(
            v.enqueued is not None for v in d.pgs.values()) else "idle")
        out[str(r)] = {
            "entries": d.n_entries,
            "pending": sum(1 for v in d.pgs.values() for e in v.entries if not e.done),
            "state": state,
            "waits_in": f"{_pgname(by_name.get(w.pg), w.pg)} seq {w.shown} {w.op}".strip() if w else "",
            "last_op": newest.op if newest else "",
            "culprit": culprits[r][0] if r in culprits else "",
        }
    return out


PROBE = FlightRecorderProbe()
