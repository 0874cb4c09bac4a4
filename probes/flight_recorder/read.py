"""Reading one flight-recorder dump (pickle or JSON) into what the analysis needs.

Why a restricted unpickler: a dump is a file from the job's machines, and a pickle can run code
when loaded; :mod:`doctor.evidence.unpickle` builds plain data and refuses everything else. Why
the trimming: a dump holds thousands of entries with stack frames per rank, and jobs reach
thousands of ranks, so only the fields the cross-rank analysis compares are kept.

Why ``pg_status`` keys need mapping: they are each rank's local process-group ids, while entries
and ``pg_config`` name groups by their global name; see :func:`_map_status_keys`.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from doctor.probes.common import jsonstream

from doctor.evidence.contract import Hints
from doctor.evidence.errors import EvidenceError
from doctor.evidence.unpickle import UnpickleError, is_pickle, safe_loads

#: Largest dump read (a 16k-rank job's dump with full frames stays well below).
MAX_BYTES = 512 * 2**20
_INT_RE = re.compile(r"-?\d+")


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


_TRAILING_RANK = re.compile(r"(\d{1,6})$")


def rank_from_dump_name(rel: str) -> int | None:
    """The rank torch appended to the dump's file name, after any prefix, or None.

    Why: torch's dumps carry no rank key; it writes each to ``<TORCH_FR_DUMP_TEMP_FILE><rank>``,
    and the prefix is whatever the job set (``/tmp/nccl_trace_rank_``, ``/scratch/job7_fr``). The
    generic name hints only know ``rank3``/``_dump_3``; a dump is recognized by its content, so its
    name's trailing digits can only be the rank (a ``.pkl``/``.json`` added on copy is ignored).
    """
    name = rel.replace("\\", "/").rsplit("/", 1)[-1].split(" ", 1)[0]
    for ext in (".pkl", ".pickle", ".json"):
        if name.lower().endswith(ext):
            name = name[: -len(ext)]
    m = _TRAILING_RANK.search(name)
    return int(m.group(1)) if m else None


def load_dump(raw: bytes, rel: str, hints: Hints) -> Dump:
    """Decode one dump (pickle or JSON) into a :class:`Dump`; ``EvidenceError`` when unusable."""
    fmt, obj, raw_entries = _decode(raw, rel)
    rank = _as_int(obj.get("rank"))
    if rank is None or rank < 0:
        rank = hints.rank
    if rank is None:
        rank = rank_from_dump_name(rel)
    if rank is None:
        raise EvidenceError(rel, "flight-recorder dump without a rank (no 'rank' key and none in the file name)")
    notes: list[str] = []
    pgs = _config_views(obj)
    kept: deque[tuple[Entry, Any, Any, int]] = deque(maxlen=MAX_ENTRIES)
    bad = 0
    for e in raw_entries:  # trimmed one by one; only the newest MAX_ENTRIES are kept
        prepped = _prep(e)
        if prepped is None:
            bad += 1
        else:
            kept.append(prepped)
    known_ids, newest, backends = _add_entries(pgs, kept)
    if bad:
        notes.append(f"{bad} malformed entries skipped")
    dropped = getattr(raw_entries, "n_seen", len(raw_entries)) - bad - len(kept)
    if dropped > 0:
        notes.append(f"{dropped} oldest entries dropped: only the newest {MAX_ENTRIES} are read")
    unmapped = _apply_status(pgs, obj, known_ids)
    if unmapped:
        notes.append(f"{unmapped} pg_status groups could not be matched to a process group")
    _settle_views(pgs)
    return Dump(
        rank=rank, rel=rel, fmt=fmt, version=str(obj.get("version") or ""),
        lib_version=str(obj.get("nccl_version") or obj.get("comm_lib_version") or ""),
        pgs=pgs, n_entries=len(kept), newest_ns=newest,
        backends=[b for b, _ in backends.most_common()], notes=notes,
    )


def _decode(raw: bytes, rel: str) -> tuple[str, dict[str, Any], Iterable[Any]]:
    """The dump's format, top-level mapping and its entries; a file that is not a dump is said
    so in one line, since a rank's missing evidence must be reported, not silently dropped.

    JSON entries come one at a time (``jsonstream``): ``json.loads`` of an 80 MB dump of 10 M
    tiny entries built them all at once (2.1 GB). Their list is read in full before the
    entries are filed, so the entries are kept trimmed (``_prep``) in between.
    """
    if is_pickle(raw):
        try:
            obj = safe_loads(raw, max_bytes=MAX_BYTES)
        except UnpickleError as exc:
            raise EvidenceError(rel, f"unreadable flight-recorder dump: {exc}") from None
        if not isinstance(obj, dict) or not ({"entries", "pg_status", "pg_config"} & set(obj)):
            raise EvidenceError(rel, "not a flight-recorder dump (no entries, pg_config or pg_status)")
        entries = obj.get("entries")
        return "pickle", obj, entries if isinstance(entries, list) else []
    if raw.lstrip()[:1] != b"{":
        raise EvidenceError(rel, "not a flight-recorder dump (neither a pickle nor JSON)")
    obj = {}
    entries: list[Any] | deque[Any] = []
    try:
        text = raw.decode("utf-8", errors="replace")
        kept: deque[Any] = deque(maxlen=MAX_ENTRIES)
        n_seen = 0
        for key, val, elem in jsonstream.members(text, "entries"):
            if elem:  # trimmed now: a decoded entry with its frames is ten times its Entry
                n_seen += 1
                kept.append(_prep(val) or _BAD)
            else:
                obj[key] = val
        if n_seen:
            obj["entries"] = True
            entries = _Prepped(kept, n_seen)
    except (ValueError, RecursionError) as exc:
        raise EvidenceError(rel, f"unreadable flight-recorder JSON: {str(exc)[:160]}") from None
    if not ({"entries", "pg_status", "pg_config"} & set(obj)):
        raise EvidenceError(rel, "not a flight-recorder dump (no entries, pg_config or pg_status)")
    return "json", obj, entries


def _config_views(obj: dict[str, Any]) -> dict[str, PgView]:
    """The groups ``pg_config`` declares, with their member ranks: the only place a dump names
    members that never showed up in its entries."""
    pgs: dict[str, PgView] = {}
    cfg = obj.get("pg_config") if isinstance(obj.get("pg_config"), dict) else {}
    for key, c in cfg.items():
        c = c if isinstance(c, dict) else {}
        name = _canon_pg(c.get("name") or key)
        desc = str(c.get("desc") or "") or ("default_pg" if name == "0" else "")
        pgs[name] = PgView(name, desc, _ranks_of(c.get("ranks")))
    return pgs


#: Entries read per dump: torch's ring buffer holds 2,000 by default (TORCH_NCCL_TRACE_BUFFER_SIZE);
#: a dump claiming millions is refused past this many (the newest are kept), bounding memory.
MAX_ENTRIES = 200_000
_BAD: tuple[Any, ...] = ()


class _Prepped(list):  # type: ignore[type-arg]
    """JSON entries already trimmed by ``_prep`` while streaming (``_BAD`` for malformed ones),
    with how many the dump held."""

    def __init__(self, kept: deque[Any], n_seen: int) -> None:
        super().__init__(kept)
        self.n_seen = n_seen


def _prep(e: Any) -> tuple[Entry, Any, Any, int] | None:
    """One raw entry trimmed to its Entry, group description, pg id and newest timestamp."""
    if isinstance(e, tuple):  # already trimmed while streaming
        return e or None
    ent = _entry(e) if isinstance(e, dict) else None
    if ent is None:
        return None
    pgd = e["process_group"]
    newest = 0
    for k in ("time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns"):
        newest = max(newest, _as_int(e.get(k), 0) or 0)
    return ent, (pgd[1] if len(pgd) > 1 else None), _as_int(e.get("pg_id")), newest


def _add_entries(pgs: dict[str, PgView], entries: Iterable[tuple[Entry, Any, Any, int]]
                 ) -> tuple[dict[str, str], int, Counter[str]]:
    """File the trimmed entries under their groups. Returns the ``pg_id -> name`` pairs the
    entries reveal (needed to read ``pg_status``), the newest timestamp (the only stand-in for
    the dump's time) and the backends seen."""
    known_ids: dict[str, str] = {}
    newest = 0
    backends: Counter[str] = Counter()
    for ent, desc, pid, t in entries:
        view = pgs.get(ent.pg)
        if view is None:
            pgs[ent.pg] = view = PgView(ent.pg)
        if desc and not view.desc:
            view.desc = str(desc)
        view.entries.append(ent)
        if ent.is_p2p:
            view.has_p2p = True
            view.pending_p2p += not ent.done
        if pid is not None:
            known_ids[str(pid)] = ent.pg
        newest = max(newest, t)
        backends[ent.op.split(":", 1)[0] if ":" in ent.op else "?"] += 1
    return known_ids, newest, backends


def _apply_status(pgs: dict[str, PgView], obj: dict[str, Any], known_ids: dict[str, str]) -> int:
    """Set each group's last enqueued/started/completed from ``pg_status``; returns how many
    status groups could not be matched to a process group."""
    status = obj.get("pg_status") if isinstance(obj.get("pg_status"), dict) else {}
    if not status:
        return 0
    mapping = _map_status_keys([str(k) for k in status], list(pgs), known_ids)
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
    return unmapped


def _settle_views(pgs: dict[str, PgView]) -> None:
    """Entries in seq order, and the counter each group's status counts in: the entries stand in
    for a missing status, and gloo's status counts op ids, not collective seq ids."""
    for view in pgs.values():
        view.entries.sort(key=lambda x: x.seq)
        if view.enqueued is None or view.completed is None:
            _status_from_entries(view)
            continue
        coll = [e for e in view.entries if not e.is_p2p]
        if coll and view.enqueued != max(e.seq for e in coll) and view.enqueued == max(e.op_id for e in coll):
            view.space = "op_id"


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
