"""The cross-rank analysis: which ranks wait where, and who is the odd one out.

A hang is read across ranks, STAT-style: thousands of main threads collapse into a handful of
stack groups, the largest presumed healthy and the rest suspects. Each step is its own function
(one dump per member and snapshot with ranks filled in, progress across snapshots, DataLoader
workers, groups, lock holders) so each can be read and tested alone; ``analyze`` only chains
them. Everything is keyed by dicts, so 16k ranks cost milliseconds beyond parsing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from doctor.probes.stacks import classify as ss
from doctor.probes.stacks.model import DumpError, ProcDump

MAX_GROUPS = 48
MAX_LIST = 64


def _score(d: ProcDump) -> tuple[int, int, int]:
    m = d.main
    specific = m is not None and m.state not in ("python", "unknown", "idle")
    has_py = d.fmt not in ("gdb", "ide")  # gdb bt and IDE stacks show only native frames
    # py-spy over faulthandler next (a debug-server dump beside a live py-spy one): it says
    # whether the thread runs, and later snapshots are py-spy too, whose frames (qualified
    # names) would never equal faulthandler's, making a frozen rank look like it moved
    return (4 * specific + 2 * has_py + d.native, int(d.fmt.startswith("pyspy")), len(d.others))


def _better(a: ProcDump, b: ProcDump) -> ProcDump:
    """Of two dumps of one rank in one snapshot keep the more telling: a specific state first,
    then Python frames (py-spy over gdb), then native frames, then more threads."""
    return a if _score(a) >= _score(b) else b


_STATE_PRIORITY = {s: i for i, s in enumerate(
    ["collective", "init", "dataloader_wait", "io", "lock_wait", "cuda_sync", "dataloader_fetch",
     "ipc_wait", "gc", "sleeping", "python", "unknown", "idle"])}
_PLAIN_WAITS = {"lock_wait", "sleeping", "dataloader_wait", "ipc_wait", "idle", "collective"}


Member = Any  # a rank (int), or "host:pid" when the rank is unknown


def _pid_ranks(dumps: list[ProcDump]) -> tuple[dict[tuple[str | None, int], int], dict[int, set[int]]]:
    pid_rank: dict[tuple[str | None, int], int] = {}
    pid_only: dict[int, set[int]] = {}
    for d in dumps:
        if d.role == "rank" and d.rank is not None and d.pid is not None:
            pid_rank[(d.host, d.pid)] = d.rank
            pid_only.setdefault(d.pid, set()).add(d.rank)
    return pid_rank, pid_only


def assign_members(dumps: list[ProcDump], notes: list[str]) -> tuple[dict[Member, dict[int, ProcDump]],
                                                                       dict[int, dict[int | None, ProcDump]]]:
    """One dump per member and snapshot, and the DataLoader workers per rank.

    A dump without a rank takes the rank another dump of the same process names, and a worker
    its parent's: files of one job rarely all say whose they are. Two dumps of one rank in one
    snapshot keep the more telling.
    """
    pid_rank, pid_only = _pid_ranks(dumps)

    def rank_of_pid(host: str | None, pid: int | None) -> int | None:
        """The same host, or any host when the pid is unambiguous (one file named the host,
        the other not)."""
        if pid is None:
            return None
        r = pid_rank.get((host, pid))
        if r is None and len(pid_only.get(pid, ())) == 1:
            r = next(iter(pid_only[pid]))
        return r

    for d in dumps:
        if d.role == "rank" and d.rank is None and d.pid is not None:
            r = rank_of_pid(d.host, d.pid)
            if r is not None:
                d.rank, d.rank_source = r, "pid"
    per: dict[Member, dict[int, ProcDump]] = {}
    workers: dict[int, dict[int | None, ProcDump]] = {}
    dup = 0
    anonymous = 0  # dumps with neither rank nor pid: each is a member of its own, named stably
    for d in dumps:
        if d.role == "worker":
            if d.rank is None and d.parent is not None:
                d.rank = rank_of_pid(d.host, d.parent)
            if d.rank is not None:
                snaps = workers.setdefault(d.rank, {})
                key = d.pid if d.pid is not None else len(snaps)
                prev = snaps.get(key)
                if prev is None or d.snapshot >= prev.snapshot:
                    snaps[key] = d
            continue
        if d.role != "rank" or d.main is None:
            continue
        if d.rank is not None:
            member: Member = d.rank
        elif d.pid is not None:
            member = f"{d.host or ''}:{d.pid}"
        else:  # the same input gives the same facts: a position, never an object id
            anonymous += 1
            member = f"{d.host or ''}:{d.path or 'dump'}#{anonymous}"
        snaps2 = per.setdefault(member, {})
        if d.snapshot in snaps2:
            dup += 1
            snaps2[d.snapshot] = _better(snaps2[d.snapshot], d)
        else:
            snaps2[d.snapshot] = d
    if dup:
        notes.append(f"{dup} extra dump(s) of a rank in the same snapshot: kept the most telling (specific state, Python frames, native frames)")
    return per, workers


@dataclass
class Progress:
    """Each member's current dump and whether its stack moved across snapshots."""

    current: dict[Member, ProcDump] = field(default_factory=dict)
    frozen: list[int] = field(default_factory=list)
    moving: list[int] = field(default_factory=list)
    frozen_keys: set[Member] = field(default_factory=set)
    snapshots: set[int] = field(default_factory=set)
    progress: str = "unknown"  # unknown (one snapshot) | moving | frozen


def detect_progress(per: dict[Member, dict[int, ProcDump]]) -> Progress:
    """Frozen or moving from the exact stacks (with lines) of 2+ snapshots. A frozen member's
    current dump may be an earlier native one: the same Python stack all along, so the native
    frames explain the latest plain dump (which cannot see the C call it is blocked in)."""
    out = Progress()
    n_multi = n_moving = 0
    for key, snaps in per.items():
        out.snapshots.update(snaps)
        latest = snaps[max(snaps)]
        out.current[key] = latest
        if len(snaps) >= 2:
            n_multi += 1
            exacts = {s.main.exact for s in snaps.values() if s.main is not None}
            if len(exacts) == 1:
                out.frozen_keys.add(key)
                best = max(snaps.values(), key=_score)
                if _score(best)[0] > _score(latest)[0]:
                    out.current[key] = best
                if isinstance(key, int):
                    out.frozen.append(key)
            else:
                n_moving += 1
                if isinstance(key, int):
                    out.moving.append(key)
    out.progress = "unknown" if n_multi == 0 else ("moving" if n_moving * 2 > n_multi else "frozen")
    return out


def summarize_workers(workers: dict[int, dict[int | None, ProcDump]]) -> tuple[dict[str, dict[str, Any]], set[int], set[int]]:
    """Per rank: its workers' activity; ranks whose workers are blocked (none busy) and ranks
    whose workers all wait in their loop (the batch is in transit, not stuck)."""
    worker_facts: dict[str, dict[str, Any]] = {}
    workers_blocked: set[int] = set()
    workers_idle: set[int] = set()
    for rank, ws in workers.items():
        counts = Counter(w.main.worker or "waiting" for w in ws.values() if w.main is not None)
        blocked_top = next((w.main.top for w in ws.values() if w.main is not None and w.main.worker == "blocked"), "")
        worker_facts[str(rank)] = {"n": len(ws), "waiting": counts.get("waiting", 0), "busy": counts.get("busy", 0),
                                   "blocked": counts.get("blocked", 0), "top": blocked_top}
        if counts.get("blocked", 0) and not counts.get("busy", 0):
            workers_blocked.add(rank)
        elif counts.get("waiting", 0) == len(ws):
            workers_idle.add(rank)
    return worker_facts, workers_blocked, workers_idle


def order_groups(current: dict[Member, ProcDump], notes: list[str]) -> list[tuple[str, list[Member]]]:
    """Members by stack signature, largest group first (ties: the more telling state, then the
    lowest rank); past MAX_GROUPS the small groups merge per state so the facts stay bounded."""
    sig_members: dict[str, list[Member]] = {}
    for key, d in current.items():
        sig_members.setdefault(d.main.sig, []).append(key)  # type: ignore[union-attr]

    def min_rank(keys: list[Member]) -> float:
        rs = [k for k in keys if isinstance(k, int)]
        return min(rs) if rs else float("inf")

    ordered = sorted(sig_members.items(), key=lambda kv: (
        -len(kv[1]), _STATE_PRIORITY.get(current[kv[1][0]].main.state, 99), min_rank(kv[1])))  # type: ignore[union-attr]
    if len(ordered) > MAX_GROUPS:
        keep, rest = ordered[:MAX_GROUPS - 8], ordered[MAX_GROUPS - 8:]
        merged: dict[str, list[Member]] = {}
        for _sig, keys in rest:
            st = current[keys[0]].main.state  # type: ignore[union-attr]
            merged.setdefault(f"{st}|(several stacks)|", []).extend(keys)
        ordered = keep + sorted(merged.items(), key=lambda kv: -len(kv[1]))
        notes.append(f"{len(rest)} small stack groups merged per state")
    return ordered


@dataclass
class Groups:
    """The groups and what is counted while walking their members."""

    groups: list[dict[str, Any]] = field(default_factory=list)
    by_rank: dict[str, dict[str, Any]] = field(default_factory=dict)
    state_counts: Counter[str] = field(default_factory=Counter)
    state_ranks: dict[str, list[int]] = field(default_factory=dict)
    op_counts: Counter[str] = field(default_factory=Counter)
    splits: dict[str, dict[str, Any]] = field(default_factory=dict)


def build_groups(ordered: list[tuple[str, list[Member]]], prog: Progress,
                 workers_blocked: set[int], workers_idle: set[int]) -> Groups:
    """One fact per group and per rank; collectives split by (op, call site), because ranks in
    one op called from different lines are in different collectives."""
    current, frozen_keys = prog.current, prog.frozen_keys
    n_members = len(current)
    out = Groups()
    for gi, (sig, keys) in enumerate(ordered):
        gid = f"g{gi}"
        rep_key = min(keys, key=lambda k: (not isinstance(k, int), k if isinstance(k, int) else 0))
        rep = current[rep_key].main
        assert rep is not None
        merged_group = sig.endswith("|(several stacks)|")
        ranks = sorted(k for k in keys if isinstance(k, int))
        unr = [k for k in keys if not isinstance(k, int)]
        n_active = 0
        n_frz = 0
        n_wb = 0
        n_wi = 0
        native = False
        for k in keys:
            d = current[k]
            m = d.main
            assert m is not None
            if m.active:
                n_active += 1
            if k in frozen_keys:
                n_frz += 1
            native = native or d.native
            if isinstance(k, int):
                wb = k in workers_blocked
                n_wb += wb
                n_wi += k in workers_idle
                entry = {"state": m.state, "op": m.op, "top": m.top, "group": gid,
                         "active": bool(m.active), "frozen": k in frozen_keys, "workers_blocked": wb}
                pin = next((t for t in d.others if "_pin_memory_loop@" in t.sig), None)
                if pin is not None:  # the DataLoader's pin-memory thread feeds the main thread
                    entry["pin_memory"] = f"{pin.state} ({pin.op}) at {pin.top}"
                out.by_rank[str(k)] = entry
                out.state_ranks.setdefault(m.state, []).append(k)
            out.state_counts[m.state] += 1
            if m.state == "collective" and m.op:
                out.op_counts[m.op] += 1
                if m.op not in ss.P2P_OPS and m.op not in ss.VAGUE_OPS:
                    skey = f"{m.op}@{m.site}"
                    sp = out.splits.setdefault(skey, {"key": skey, "op": m.op, "site": m.site, "ranks": [], "size": 0})
                    sp["size"] += 1
                    if isinstance(k, int):
                        sp["ranks"].append(k)
        out.groups.append({
            "id": gid, "state": rep.state, "op": "" if merged_group else rep.op, "ranks": ranks,
            "size": len(keys), "share": round(len(keys) / n_members, 4) if n_members else 0.0,
            "majority": gi == 0, "top": "(several stacks)" if merged_group else rep.top,
            "anchor": "" if merged_group else rep.anchor, "site": "" if merged_group else rep.site,
            "frames": [] if merged_group else list(rep.frames),
            "n_active": n_active, "active": n_active * 2 > len(keys), "native": native,
            "n_frozen": n_frz, "workers_blocked": n_wb, "workers_idle": n_wi,
            "unranked": [str(u) for u in unr[:16]],
        })
    return out


def collective_splits(splits: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    for sp in splits.values():
        sp["ranks"].sort()
    split_list = sorted(splits.values(), key=lambda s: (-s["size"], s["ranks"][0] if s["ranks"] else 1 << 30))
    for i, sp in enumerate(split_list):
        sp["majority"] = i == 0
    return split_list[:32]


def find_lock_holders(current: dict[Member, ProcDump], outliers: list[int]) -> list[dict[str, Any]]:
    """For ranks blocked on a lock or the GIL, the other threads that may hold it (outliers
    first: the odd rank's lock is the likelier culprit)."""
    lock_holders: list[dict[str, Any]] = []
    suspects = [k for k, d in current.items() if isinstance(k, int) and d.main is not None
                and d.main.state == "lock_wait"]
    suspects.sort(key=lambda k: (k not in outliers, k))
    for k in suspects:
        d = current[k]
        wants_gil = d.main is not None and d.main.op == "gil"
        for t in d.others:
            holds = (t.gil is True) if wants_gil else (
                t.active is True or t.gil is True or t.state not in _PLAIN_WAITS)
            if holds and len(lock_holders) < MAX_LIST:
                lock_holders.append({"rank": k, "thread": t.name or t.tid, "state": t.state, "op": t.op,
                                     "top": t.top, "active": bool(t.active), "gil": bool(t.gil)})
        if len(lock_holders) >= MAX_LIST:
            break
    return lock_holders


def analyze(dumps: list[ProcDump], errs: list[DumpError], world_size: int, notes: list[str]) -> dict[str, Any]:
    """The ``stacks`` facts: groups by state and stack signature, majority, outliers, frozen
    ranks, lock holders, dump failures."""
    per, workers = assign_members(dumps, notes)
    prog = detect_progress(per)
    current = prog.current
    worker_facts, workers_blocked, workers_idle = summarize_workers(workers)
    n_members = len(current)
    g = build_groups(order_groups(current, notes), prog, workers_blocked, workers_idle)
    groups, state_counts = g.groups, g.state_counts
    split_list = collective_splits(g.splits)

    if state_counts:
        maj_state, maj_n = min(state_counts.items(), key=lambda kv: (-kv[1], _STATE_PRIORITY.get(kv[0], 99)))
    else:
        maj_state, maj_n = "", 0
    majority_op = min(g.op_counts.items(), key=lambda kv: (-kv[1], kv[0]))[0] if g.op_counts else ""
    outliers = sorted(r for grp in groups[1:] for r in grp["ranks"])
    lock_holders = find_lock_holders(current, outliers)

    # dump failures, ranks without stacks
    have = {k for k in current if isinstance(k, int)}
    dump_errors = [{"rank": e.rank if e.rank is not None else -1, "kind": e.kind, "reason": e.reason}
                   for e in errs if e.rank is None or e.rank not in have][:MAX_LIST]
    gone = sorted({e.rank for e in errs if e.kind == "gone" and e.rank is not None and e.rank not in have})
    missing = sorted(set(range(world_size)) - have) if world_size and have else []
    for d in current.values():
        if d.truncated:
            notes.append(f"{d.path}: truncated dump; its last thread may be incomplete")
    formats = sorted({d.fmt for d in dumps})
    return {
        "n_ranks": len(have), "n_members": n_members, "n_unranked": n_members - len(have),
        "formats": formats, "native": any(d.native for d in current.values()),
        "snapshots": len(prog.snapshots), "states": list(ss.STATES),
        "state_counts": {s: state_counts.get(s, 0) for s in ss.STATES},
        "state_ranks": {s: sorted(v) for s, v in g.state_ranks.items()},
        "waiting_share": round((state_counts.get("collective", 0) + state_counts.get("cuda_sync", 0)) / n_members, 4)
        if n_members else 0.0,
        "majority_state": maj_state, "majority_share": round(maj_n / n_members, 4) if n_members else 0.0,
        "majority_op": majority_op, "majority_group": groups[0]["id"] if groups else "",
        "outliers": outliers, "groups": groups, "by_rank": g.by_rank,
        "collective_splits": split_list,
        "frozen": sorted(prog.frozen), "moving": sorted(prog.moving), "progress": prog.progress,
        "lock_holders": lock_holders, "workers": worker_facts, "workers_blocked": sorted(workers_blocked),
        "missing_ranks": missing, "gone_ranks": gone, "dump_errors": dump_errors, "notes": notes[:20],
    }
