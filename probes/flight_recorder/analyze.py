"""The cross-rank analysis of flight-recorder dumps: who waits for whom, and who is to blame.

Per process group, the ranks are aligned by collective sequence id, then a wait-for graph is
built (a rank waiting at seq ``s`` of a group waits for every member that has not issued ``s``).
The culprits are its sinks: ranks others wait for that wait for nobody. Mismatches (op, size,
dtype at the same seq of the same group), cycles (ranks waiting for each other across groups)
and timeouts come from the same alignment.

Why sequence ids and not timestamps: ranks' clocks and dump moments differ, while the seq id of a
collective is the same on every member; timestamps are used only for lower bounds of waits.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from doctor.evidence.contract import set_world_size

from .read import Dump, Entry, PgView, _plain, _status_from_entries

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


def analyze(dump_list: list[Dump], facts: dict[str, Any]) -> dict[str, Any]:
    """The cross-rank analysis: every ``flight_recorder.*`` fact from the per-rank dumps.

    The steps, in order: one dump per rank, the job's world, groups aligned by sequence id and
    their waits, the wait-for graph, its culprits and cycles, then what needs no graph
    (mismatches, timeouts) and the per-group and per-rank summaries.
    """
    dumps = _one_dump_per_rank(dump_list)
    world = _world(dumps, facts)
    cpu = {b for d in dumps.values() for b in d.backends}
    backend_cpu = bool(cpu) and cpu <= _CPU_BACKENDS

    groups = _groups(dumps, world)
    by_name = {g.name: g for g in groups}
    waits, self_blocked, inconsistent = _align(groups, backend_cpu)
    pending_any = _pending_ranks(dumps)
    graph = _WaitGraph.of(waits, dumps)
    culprits = _culprits(dumps, graph, by_name, self_blocked, pending_any)
    undumped = _undumped_blockers(waits, by_name, culprits)
    cycles = _cycles(graph.edges, waits, by_name, culprits)
    mismatches, n_mis, first = _all_mismatches(groups)

    newest = max((d.newest_ns for d in dumps.values()), default=0)
    timeouts, max_wait = _timeouts(groups, newest)
    tmos = sorted({e.timeout_ms for d in dumps.values() for v in d.pgs.values() for e in v.entries if e.timeout_ms})
    empty = sorted(r for r, d in dumps.items() if not d.n_entries and all(v.enqueued is None for v in d.pgs.values()))
    return {
        "dumps": len(dumps),
        "ranks": sorted(dumps),
        "missing_dumps": sorted(set(range(world)) - set(dumps)) if world else [],
        "empty_dumps": empty,
        "versions": sorted({d.version for d in dumps.values() if d.version}),
        "backends": sorted(cpu - {"?"}),
        "n_entries": sum(d.n_entries for d in dumps.values()),
        "n_groups": len(groups),
        "groups": _group_facts(groups, waits, mismatches),
        "waiting_ranks": sorted(pending_any),
        "idle_ranks": sorted(set(dumps) - pending_any),
        **_culprit_facts(culprits),
        "undumped_blockers": sorted(undumped),
        "blocked": _blocked(waits, by_name),
        "cycles": cycles,
        "mismatches": mismatches,
        "n_mismatches": n_mis,
        "first_divergence": first,
        "timeouts": timeouts,
        "max_wait_ms": max_wait,
        "timeout_ms": tmos,
        "inconsistent_groups": inconsistent,
        "by_rank": _by_rank(dumps, waits, by_name, pending_any, culprits),
    }


def _one_dump_per_rank(dump_list: list[Dump]) -> dict[int, Dump]:
    """Two dumps for one rank (a re-run collection, a renamed copy): the richer one says more."""
    dumps: dict[int, Dump] = {}
    for d in dump_list:
        if d.rank not in dumps or d.n_entries > dumps[d.rank].n_entries:
            dumps[d.rank] = d
    return dumps


def _world(dumps: dict[int, Dump], facts: dict[str, Any]) -> int:
    """The job's world size: the process groups' member lists tell it even for ranks that left
    no dump, which is how missing dumps are noticed at all."""
    cfg_world = 0
    for d in dumps.values():
        for v in d.pgs.values():
            if v.ranks:
                cfg_world = max(cfg_world, max(v.ranks) + 1)
    set_world_size(facts, cfg_world)
    return int(facts.get("job", {}).get("world_size") or 0) or (max(dumps) + 1 if dumps else 0)


def _consistent(g: _Group) -> bool:
    """No member completed a seq another member never issued: dumps taken at one moment."""
    es = [v.enqueued for v in g.views.values() if v.enqueued is not None]
    cs = [v.completed for v in g.views.values() if v.completed is not None]
    return not (es and cs and max(cs) > min(es))


def _align(groups: list[_Group], backend_cpu: bool
           ) -> tuple[list[_Wait], dict[int, tuple[int, str, str, int]], list[str]]:
    """The waits of every comparable group, the ranks whose own completion lags (worst group
    kept), and the groups left out because their dumps disagree in time."""
    waits: list[_Wait] = []
    self_blocked: dict[int, tuple[int, str, str, int]] = {}
    inconsistent: list[str] = []
    for g in groups:
        g.consistent = _consistent(g)
        if g.p2p or len(g.views) < 1:
            continue
        if _realign(g):
            g.consistent = _consistent(g)
        if not g.consistent:
            inconsistent.append(f"{g.name}:{g.desc}" if g.desc else g.name)
            continue
        gw, sb = _waits(g, backend_cpu)
        waits.extend(gw)
        for r, (s, why, lag) in sb.items():
            if r not in self_blocked or lag > self_blocked[r][3]:
                self_blocked[r] = (s, g.name, why, lag)
    return waits, self_blocked, inconsistent


def _pending_ranks(dumps: dict[int, Dump]) -> set[int]:
    """Ranks with issued, unfinished work anywhere (a collective or a send/recv)."""
    return {r for r, d in dumps.items()
            if any((v.enqueued is not None and v.completed is not None and v.enqueued > v.completed)
                   or v.pending_p2p for v in d.pgs.values())}


@dataclass
class _WaitGraph:
    """Ranks and collective nodes: rank -> wait it is in -> ranks that have not issued it."""

    edges: dict[Any, list[Any]]
    waited_for: dict[int, list[_Wait]]  # rank -> waits others are in for it
    waits_on_someone: set[int]          # ranks with a dump that wait for another rank

    @classmethod
    def of(cls, waits: list[_Wait], dumps: dict[int, Dump]) -> _WaitGraph:
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
        return cls(edges, waited_for, {r for r in dumps if edges.get(r)})


def _culprits(dumps: dict[int, Dump], graph: _WaitGraph, by_name: dict[str, _Group],
              self_blocked: dict[int, tuple[int, str, str, int]], pending_any: set[int]
              ) -> dict[int, tuple[str, str]]:
    """The sinks of the wait-for graph, by kind: ranks outside every collective, ranks whose
    device stopped completing, and ranks still behind with unfinished work of their own."""
    culprits: dict[int, tuple[str, str]] = {}
    for q, ws in graph.waited_for.items():
        if q in graph.waits_on_someone or q in pending_any:
            continue
        w = max(ws, key=lambda x: len(x.waiters))
        g = by_name[w.pg]
        culprits[q] = ("not_issued", (
            f"never issued seq {w.shown}{' (' + w.op + ')' if w.op else ''} of {_pgname(g, w.pg)} that "
            f"rank(s) {_short(w.waiters)} wait in (its last there is seq {_last_issued(g.views.get(q))}) "
            f"and has nothing pending anywhere: it is outside the collectives"))
    for r, (s, pg, why, _lag) in self_blocked.items():
        if r in graph.waits_on_someone or r in culprits:
            continue
        v = by_name[pg].views[r]
        culprits[r] = ("not_completed", (
            f"issued seq {s} of {_pgname(by_name[pg], pg)} and {why}, but it never completed here "
            f"(issued up to {v.enqueued}, completed up to {v.completed}): its device-side work stopped"))
    for q, ws in graph.waited_for.items():
        # Others wait for q, q waits for no one, yet it has unfinished work of its own (in a
        # send/recv group, which is not aligned, or work no member holds up): it still has not
        # reached the collective the others wait in.
        if q in graph.waits_on_someone or q in culprits:
            continue
        w = max(ws, key=lambda x: len(x.waiters))
        g = by_name[w.pg]
        own = _own_pending(dumps[q])
        culprits[q] = ("not_issued", (
            f"never issued seq {w.shown}{' (' + w.op + ')' if w.op else ''} of {_pgname(g, w.pg)} that "
            f"rank(s) {_short(w.waiters)} wait in (its last there is seq {_last_issued(g.views.get(q))}); "
            f"its own unfinished work ({own}) waits for no rank with a dump"))
    return culprits


def _undumped_blockers(waits: list[_Wait], by_name: dict[str, _Group],
                       culprits: dict[int, tuple[str, str]]) -> set[int]:
    """Ranks without a dump, named (and added to ``culprits``) only when the dumps explain
    nothing else: in NCCL jobs many groups wait "jointly" (every member issued, none completed)
    because their streams are held up by the real culprit elsewhere, and a missing member of such
    a group is most likely just as stuck. When no rank with a dump is to blame, the missing ones
    are the best lead."""
    undumped: set[int] = set()
    if culprits:
        return undumped
    for w in sorted(waits, key=lambda x: -len(x.waiters)):
        if not w.not_issued and w.no_dump and not w.completed_by:
            undumped.update(w.no_dump)
            g = by_name.get(w.pg)
            for q in w.no_dump:
                culprits.setdefault(q, ("no_dump", (
                    f"left no dump, and rank(s) {_short(w.waiters)} wait in seq {w.shown} of "
                    f"{_pgname(g, w.pg)} that every member with a dump has issued")))
    return undumped


def _all_mismatches(groups: list[_Group]) -> tuple[list[dict[str, Any]], int, dict[str, Any]]:
    """Mismatches of every collective group, earliest first and capped; how many were found
    before the caps; and the first divergence (where the ranks' programs first went apart)."""
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
    return mismatches[:MISMATCH_CAP], n_mis, first


def _culprit_facts(culprits: dict[int, tuple[str, str]]) -> dict[str, Any]:
    """The culprits as rules read them: by rank, by kind, and one line of why each."""
    by_kind: dict[str, list[str]] = {}
    for r, (k, why) in sorted(culprits.items()):
        lines = by_kind.setdefault(k, [])
        if len(lines) < REASON_LINES_CAP:
            lines.append(f"rank {r}: {why}")
    return {
        "culprits": sorted(culprits),
        "culprit_reasons": {str(r): why for r, (_, why) in sorted(culprits.items())},
        "culprit_kinds": {str(r): k for r, (k, _) in sorted(culprits.items())},
        "reasons_by_kind": by_kind,
        "outside_ranks": sorted(r for r, (k, _) in culprits.items() if k == "not_issued"),
        "stalled_ranks": sorted(r for r, (k, _) in culprits.items() if k == "not_completed"),
    }


def _blocked(waits: list[_Wait], by_name: dict[str, _Group]) -> list[dict[str, Any]]:
    """The collectives ranks wait in, those with the most ranks not issued first."""
    blocked = sorted(waits, key=lambda w: (-len(w.not_issued), -len(w.no_dump), -len(w.waiters), w.pg))
    return [{"pg": w.pg, "desc": by_name[w.pg].desc, "seq": w.shown, "op": w.op, "waiters": w.waiters,
             "not_issued": w.not_issued, "no_dump": w.no_dump, "completed_by": w.completed_by}
            for w in blocked[:BLOCKED_CAP]]


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
