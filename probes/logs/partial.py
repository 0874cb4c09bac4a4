"""Reasoning over the watchdog lines of *some* ranks: what the timeouts, queue positions and
silences of the ranks a log speaks for say about the ranks it does not.

Why a module of its own: people bring the watchdog lines of a few ranks, not a whole job. Those
lines still carry the flight recorder's most useful numbers (torch writes them into the log):
the sequence number and op of the collective each rank timed out in, and where its NCCL queue
stood (last enqueued / last completed work). Compared across ranks of one process group they
separate the usual causes, the way ``torch/distributed/flight_recorder`` compares dumps:

- ranks that timed out at different sequence numbers, or in different ops or sizes at the same
  one, are not running the same program order (a collective mismatch); the ranks behind are the
  suspects;
- ranks that all time out at one sequence number while a rank the logs show alive never does:
  that rank never entered the collective;
- a rank whose queue holds work its peers already completed: its GPU did not finish it;
- a rank whose queue never reached the collective its peers wait in: it is elsewhere.

Everything here works on the small per-file aggregates of :mod:`.scan` (one record per timeout
or queue report), so it stays cheap whatever the log size; the results are lists of a handful of
groups, which is what rules iterate over.
"""

from __future__ import annotations

from typing import Any

from .nccl_progress import progress_facts

#: torch's default NCCL collective timeout since 2.2 is 10 minutes (it was 30 before); a job
#: that set a smaller one has chosen a timeout any long phase can outlast.
#: source: torch/distributed/constants.py (default_pg_nccl_timeout), torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp (kProcessGroupNCCLDefaultTimeoutMillis)
DEFAULT_NCCL_TIMEOUT_MS = 600_000
#: ops that a barrier becomes with NCCL: ProcessGroupNCCL::barrier all-reduces a one-element
#: tensor ("nccl:all_reduce_barrier"), so its watchdog line reads OpType=ALLREDUCE, NumelIn=1.
#: source: torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (ProcessGroupNCCL::barrier)
_BARRIER_OPS = frozenset({"BARRIER", "ALLREDUCE", "BROADCAST"})
#: a collective this early in a group's life is the first after start-up (model build, data
#: preparation, loading a checkpoint): a phase that often outlasts a short timeout
FIRST_SEQS = 2


def wait_groups(waits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Timeouts grouped per process group: which sequence numbers, ops and sizes the ranks of
    one group timed out in, and which ranks are behind (at the lowest sequence number when the
    ranks disagree). Lines that name no group form one group ('')."""
    by_pg: dict[str, list[dict[str, Any]]] = {}
    for w in waits:
        if w.get("backend") != "nccl" or w.get("rank") is None or not isinstance(w.get("seq"), int):
            continue
        by_pg.setdefault(str(w.get("pg") or ""), []).append(w)
    out = []
    for pg, ws in sorted(by_pg.items()):
        first: dict[int, dict[str, Any]] = {}
        for w in ws:  # a rank's first timeout per group: the collective it was stuck in
            cur = first.get(w["rank"])
            if cur is None or w["seq"] < cur["seq"]:
                first[w["rank"]] = w
        seqs = sorted({w["seq"] for w in first.values()})
        ops = sorted({str(w["op"]) for w in first.values() if w.get("op")})
        by_seq: dict[int, set[tuple[str, Any]]] = {}
        for w in first.values():
            by_seq.setdefault(w["seq"], set()).add((str(w.get("op") or ""), w.get("numel_in")))
        op_differs = any(len({o for o, _ in v}) > 1 for v in by_seq.values())
        numel_differs = any(len({n for o, n in v if isinstance(n, int)}) > 1 and len({o for o, _ in v}) == 1
                            for v in by_seq.values())
        # sequence numbers that differ say little when the lines name no group (two groups of an
        # old log count their own sequences): then only the same op and size at different
        # positions counts as one collective seen at two places of the program
        same_shape = len({(str(w.get("op") or ""), w.get("numel_in")) for w in first.values()}) == 1
        seq_differs = len(seqs) > 1 and (pg != "" or same_shape)
        lowest = seqs[0] if seqs else None
        behind = sorted(r for r, w in first.items() if w["seq"] == lowest) if seq_differs else []
        ahead = sorted(r for r, w in first.items() if w["seq"] != lowest) if seq_differs else []
        out.append({
            "pg": pg, "ranks": sorted(first), "n": len(first), "seqs": seqs, "ops": ops,
            "seq_differs": seq_differs, "op_differs": op_differs, "numel_differs": numel_differs,
            "behind_ranks": behind, "ahead_ranks": ahead,
            "barrier_like": bool(ops) and all(
                str(w.get("op")) in _BARRIER_OPS and (w.get("op") == "BARRIER" or w.get("numel_in") in (0, 1))
                for w in first.values()),
            "first_seq": bool(seqs) and seqs[-1] <= FIRST_SEQS,
        })
    return out[:32]


def silent_ranks(waits: list[dict[str, Any]], seen: set[int], world: int, own_failures: set[int],
                 exited: set[int]) -> dict[str, list[int]]:
    """Ranks that did not time out while their peers did, all at one collective.

    ``quiet``: the logs show the rank alive (it printed something) but never report a timeout
    of it, while two or more peers timed out at the same sequence number: it never entered the
    collective. ``unseen``: the world size is known, every rank the logs show timed out at one
    sequence number, and a few ranks never appear at all: the likely culprits, from their
    absence alone. Ranks with a failure of their own or an exit are explained elsewhere."""
    nccl = [w for w in waits if w.get("backend") == "nccl" and w.get("rank") is not None]
    waiting = {w["rank"] for w in nccl}
    seqs = {(str(w.get("pg") or ""), w.get("seq")) for w in nccl}
    if len(waiting) < 2 or len({s for _, s in seqs}) != 1 or None in {s for _, s in seqs}:
        return {"quiet": [], "unseen": []}
    others = own_failures | exited
    quiet = sorted(r for r in seen - waiting - others if r >= 0 and (not world or r < world))
    if len(quiet) > len(waiting):
        quiet = []  # more silent ranks than waiters: a partial log, not a lone straggler
    unseen: list[int] = []
    if world and not quiet and 0 < world - len(seen | waiting) <= max(1, world // 4) and world <= 100000:
        unseen = sorted(set(range(world)) - seen - waiting)
    return {"quiet": quiet, "unseen": unseen}


def progress_groups(progress: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Queue positions per process group: which ranks hold work their peers completed (the GPU
    side of that rank stopped), which never enqueued the collective their peers wait in (the rank
    is elsewhere), and which enqueued past every peer that has nothing pending (an extra
    collective on those ranks)."""
    by_pg: dict[str, dict[int, dict[str, Any]]] = {}
    for p in progress:
        if p.get("rank") is None:
            continue
        ranks = by_pg.setdefault(str(p.get("pg") or ""), {})
        ranks.setdefault(p["rank"], p)  # the first report of a rank: before any teardown
    out = []
    for pg, reps in sorted(by_pg.items()):
        if len(reps) < 2:
            out.append(_progress_row(pg, reps, [], [], []))
            continue
        pending = {r for r, p in reps.items() if p["last_enqueued"] > p["last_completed"]}
        idle = set(reps) - pending
        stalled: list[int] = []
        behind: list[int] = []
        extra: list[int] = []
        if pending and idle:
            idle_done = min(reps[r]["last_completed"] for r in idle)
            idle_top = max(reps[r]["last_enqueued"] for r in idle)
            # pending work that the idle peers completed: this rank's GPU never finished it
            stalled = sorted(r for r in pending if reps[r]["last_completed"] < idle_done)
            if len(pending) < len(idle):
                # a minority waits for work no idle peer ever enqueued: it called collectives the
                # others did not (an extra or reordered collective on the minority)
                extra = sorted(r for r in pending if r not in stalled and reps[r]["last_completed"] >= idle_top)
            elif len(idle) < len(pending):
                # a minority has nothing pending and never enqueued what the majority waits in
                waiting_for = min(reps[r]["last_completed"] + 1 for r in pending)
                behind = sorted(r for r in idle if reps[r]["last_enqueued"] < waiting_for)
        out.append(_progress_row(pg, reps, stalled, behind, extra))
    return out[:32]


def _progress_row(pg: str, reps: dict[int, dict[str, Any]], stalled: list[int], behind: list[int],
                  extra: list[int]) -> dict[str, Any]:
    return {
        "pg": pg, "ranks": sorted(reps), "n": len(reps),
        "pending_ranks": sorted(r for r, p in reps.items() if p["last_enqueued"] > p["last_completed"]),
        "max_pending": max([p["last_enqueued"] - p["last_completed"] for p in reps.values()] + [0]),
        "stalled_ranks": stalled, "behind_ranks": behind, "extra_ranks": extra,
        "positions": [f"rank {r}: enqueued {p['last_enqueued']}, completed {p['last_completed']}"
                      for r, p in sorted(reps.items())][:16],
    }


def short_timeout(waits: list[dict[str, Any]]) -> bool:
    """Some collective ran into a timeout the job set below torch's default."""
    return any(w.get("backend") == "nccl" and isinstance(w.get("timeout_ms"), int)
               and 0 < w["timeout_ms"] < DEFAULT_NCCL_TIMEOUT_MS for w in waits)


def comm_init_facts(scans: list[dict[str, Any]]) -> dict[str, Any]:
    """NCCL communicator set-up as the INFO lines tell it: which communicators started ("Init
    START") and never completed ("Init COMPLETE"), and whether the ranks of one commId agree on
    its size (nranks). NCCL prints both lines with the comm pointer, rank, nranks and commId.
    source: NCCL src/init.cc (ncclCommInitRankFunc: "comm %p rank %d nranks %d cudaDev %d nvmlDev
    %d busId %lx commId 0x%llx - Init START" / "... - Init COMPLETE")"""
    recs: dict[str, list[Any]] = {}
    for sc in scans:
        for key, rec in (sc.get("comm_inits") or {}).items():
            cur = recs.setdefault(key, list(rec))
            cur[3] = cur[3] or rec[3]
    started = {k: r for k, r in recs.items()}
    incomplete = sorted((r for r in started.values() if not r[3]), key=lambda r: (r[2], r[0] if isinstance(r[0], int) else -1))
    sizes: dict[str, set[int]] = {}
    for r in recs.values():
        if r[2] and isinstance(r[1], int):
            sizes.setdefault(r[2], set()).add(r[1])
    differ = sorted(c for c, v in sizes.items() if len(v) > 1)
    return {
        "comms": len(recs),
        "completed": sum(1 for r in recs.values() if r[3]),
        "incomplete_ranks": sorted({r[0] for r in incomplete if isinstance(r[0], int)}),
        "incomplete": [f"rank {r[0]} of {r[1]} (commId {r[2] or '?'})" for r in incomplete][:32],
        "nranks_differ": differ[:16],
        "nranks_seen": [f"commId {c}: nranks {', '.join(map(str, sorted(sizes[c])))}" for c in differ][:16],
    }


def _int_list(text: Any) -> list[int]:
    return sorted({int(t) for t in str(text or "").replace(",", " ").split() if t.isdigit()})[:1024]


def verdicts(events: list[dict[str, Any]]) -> dict[str, list[int]]:
    """The ranks torch itself names at a timeout: desync debug (TORCH_NCCL_DESYNC_DEBUG=1) says
    which ranks finished collective #k and never joined #k+1 (``lagging``), joined and never
    finished (``unfinished``), or never joined any collective of the group (``never_joined``);
    monitored_barrier (and TORCH_DISTRIBUTED_DEBUG=DETAIL's barrier) names the ranks that never
    reached it (``missed_barrier``).
    source: torch/csrc/distributed/c10d/TraceUtils.h (retrieveDesyncReport),
    torch/csrc/distributed/c10d/ProcessGroupGloo.cpp (monitoredBarrier)"""
    out: dict[str, set[int]] = {"lagging": set(), "unfinished": set(), "never_joined": set(), "missed_barrier": set()}
    for e in events:
        f = e.get("fields") or {}
        if e["kind"] == "desync_lagging" and isinstance(f.get("rank"), int):
            out["lagging"].add(f["rank"])
        elif e["sig"] == "desync_joined_not_finished" and isinstance(f.get("rank"), int):
            out["unfinished"].add(f["rank"])
        elif e["sig"] == "desync_never_joined":
            out["never_joined"].update(_int_list(f.get("ranks")))
        elif e["kind"] == "barrier_missing_ranks":
            out["missed_barrier"].update(_int_list(f.get("ranks")))
    return {k: sorted(v) for k, v in out.items()}


def _pg_from_progress(waits: list[dict[str, Any]], progress: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Waits whose watchdog line names no process group, given the group that the same rank's own
    queue report for the same work names. Why: torch 2.3-2.5 print the timeout line as
    "[Rank N] Watchdog caught ..." with no group, but the line after it ("[PG ID 0 PG GUID
    0(default_pg) Rank N] Exception ... detected by watchdog at work: S") does; without the group,
    different sequence numbers of two ranks could belong to two groups and say nothing.
    source: torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (watchdogHandler, logPrefix)"""
    named = {(p.get("rank"), p.get("host") or "", p.get("seq")): p["pg"] for p in progress
             if p.get("own") and p.get("pg") and isinstance(p.get("seq"), int)}
    if not named:
        return waits
    out = []
    for w in waits:
        pg = "" if w.get("pg") else named.get((w.get("rank"), w.get("host") or "", w.get("seq")), "")
        out.append({**w, "pg": pg} if pg else w)
    return out


def partial_facts(scans: list[dict[str, Any]], waits: list[dict[str, Any]], world: int,
                  own_failures: set[int], exited: set[int],
                  events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The facts above, for :func:`doctor.probes.logs.facts.build_facts`."""
    seen = {r for sc in scans for r in sc["ranks"]}
    progress = [p for sc in scans for p in sc.get("progress", [])]
    silent = silent_ranks(waits, seen, world, own_failures, exited)
    return {
        "wait_groups": wait_groups(_pg_from_progress(waits, progress)),
        "quiet_ranks": silent["quiet"],
        "unseen_ranks": silent["unseen"],
        "progress_groups": progress_groups(progress),
        "short_timeout": short_timeout(waits),
        "nccl_init": comm_init_facts(scans),
        "named_by_torch": verdicts(events or []),
        "nccl_progress": progress_facts(scans),
    }
