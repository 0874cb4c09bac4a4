"""Process state of the job's processes from /proc: run state, CPU time, threads, memory, wchan.

Two readings a few seconds apart tell a rank that burns CPU (computing or busy-spinning) from one
that sleeps in a wait, and a rank in uninterruptible sleep (D state: stuck in the kernel, often
storage) from one that is merely blocked. Reading /proc never pauses the process.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, ClassVar

from doctor.evidence import procfs
from doctor.evidence.contract import CollectContext, Hints, Parsed, Probe, ProbeFailed, Sample
from doctor.evidence.errors import EvidenceError

SCHEMA = "mldoctor.procs/1"
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
BUSY_PCT = 50.0  # above this a rank is computing or spinning, not waiting
IDLE_PCT = 5.0   # below this a rank is waiting
# A main thread blocked in one wait (gloo recv, a lock, a full pipe) does not wake up; one that
# runs a training loop blocks and wakes many times a second (queues, collectives, the GPU).
MAIN_WAKEUPS = 3


def read_process(pid: int) -> dict[str, Any] | None:
    rest = procfs.stat(pid)
    if rest is None:
        return None
    state = rest[0]
    utime, stime = int(rest[11]), int(rest[12])
    threads = int(rest[17])
    rss_pages = int(rest[21])
    task_states: dict[str, int] = {}
    for tid in procfs.thread_ids(pid):
        ts = procfs.stat(pid, tid)
        if ts:
            task_states[ts[0]] = task_states.get(ts[0], 0) + 1
    main_cpu = None
    main_stat = procfs.stat(pid, pid)
    if main_stat:
        main_cpu = (int(main_stat[11]) + int(main_stat[12])) / CLK_TCK
    main_switches = None
    main_status = procfs.read_text(pid, f"task/{pid}/status")
    if main_status:
        for line in main_status.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                main_switches = int(line.split()[1])
    return {
        "pid": pid, "state": state, "cpu_s": (utime + stime) / CLK_TCK, "threads": threads,
        "main_cpu_s": main_cpu, "main_voluntary_switches": main_switches,
        "rss_mb": round(rss_pages * PAGE / 2**20, 1), "wchan": (procfs.read_text(pid, "wchan") or "").strip(),
        "task_states": task_states,
    }


class ProcsProbe(Probe):
    name: ClassVar[str] = "procs"
    rank_state_order: ClassVar[int] = 40  # a process state says least about where a rank is
    #: Kernel process states as people read them (the rank grid).
    STATE_WORDS: ClassVar[dict[str, str]] = {"S": "sleeping", "R": "running", "D": "uninterruptible (D)",
                                            "Z": "zombie", "T": "stopped", "I": "idle"}
    title: ClassVar[str] = "Process state"
    collects: ClassVar[str] = (
        "Run state, CPU seconds, threads, RSS and kernel wait channel of the launcher, every rank and "
        "its DataLoader workers, read from /proc at each snapshot; plus the job layout on the host "
        "(expected local ranks, ranks found, zombies). No command lines or environments."
    )
    priority: ClassVar[int] = 90
    build_order: ClassVar[int] = 20
    live_first_round: ClassVar[bool] = True
    live_snapshots: ClassVar[bool] = True
    follow_ups: ClassVar[dict[str, dict[str, Any]]] = {"procs": {"snapshot": "next"}}
    state_order: ClassVar[int] = 10
    fixtures: ClassVar[tuple[str, ...]] = (
        "tests/fixtures/slow/*/bundle/hosts/*/procs/procs-snap*.json",
        "tests/fixtures/slurm/bundle_*/hosts/*/procs/procs-snap*.json",
    )
    facts_schema: ClassVar[dict[str, str]] = {
        "procs.snapshots": "int: readings taken",
        "procs.interval_s": "float: seconds between the first and last reading",
        "procs.by_rank": "map<string,map>: per rank: pid, state, cpu_pct, threads, rss_mb, wchan, d_threads, workers, workers_alive",
        "procs.by_rank[].pid": "int: the rank's process id",
        "procs.by_rank[].state": "string: its /proc state letter at the last reading (R, S, D, ...)",
        "procs.by_rank[].cpu_pct": "float: CPU use in % of a core between the first and last reading, null with one reading",
        "procs.by_rank[].threads": "int: its threads",
        "procs.by_rank[].rss_mb": "float: resident memory in MiB",
        "procs.by_rank[].wchan": "string: kernel function the main thread sleeps in, '' when running or unreadable",
        "procs.by_rank[].d_threads": "int: its threads in uninterruptible sleep (D)",
        "procs.by_rank[].workers": "int: DataLoader worker processes it started",
        "procs.by_rank[].workers_alive": "int: of them, still alive",
        "procs.busy_ranks": f"list<int>: ranks above {BUSY_PCT:.0f}% of a core between readings",
        "procs.idle_ranks": f"list<int>: ranks below {IDLE_PCT:.0f}% of a core between readings",
        "procs.d_state_ranks": "list<int>: ranks with a thread in uninterruptible sleep (D)",
        "procs.dead_ranks": "list<int>: ranks expected on this host whose process is gone or a zombie",
        "procs.ranks_on_host": "list<int>: rank processes found alive",
        "procs.local_world_size": "int: ranks the launcher started on this host (0 unknown)",
        "procs.launcher_alive": "bool: the launcher process is still there",
        "procs.threads_total": "int: threads of all rank processes together",
        "procs.workers_total": "int: DataLoader worker processes found",
        "procs.main_waking_ranks": f"list<int>: ranks whose main thread woke up (voluntary context switches) at least {MAIN_WAKEUPS} times between the first and last reading: it is not parked in one wait",
    }


    def observed_state(self, facts: dict[str, Any]) -> str:
        """Snapshots were taken and no rank is alive on the host any more: the job crashed."""
        procs = facts.get("procs") or {}
        if procs.get("snapshots") and not procs.get("ranks_on_host") and procs.get("dead_ranks"):
            return "crashed"
        return ""

    def sniff(self, sample: Sample) -> bool:
        return SCHEMA.encode() in sample.raw[:400]

    def parse(self, path: Path, rel: str, hints: Hints) -> Parsed:
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise EvidenceError(rel, f"not valid JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise EvidenceError(rel, "not an mldoctor procs snapshot")
        return Parsed(self.name, rel, data, None, data.get("host") or hints.host)

    def collect(self, ctx: CollectContext) -> None:
        snap = int(ctx.options.get("snapshot", 0))
        records = []
        for p in ctx.procs:
            info = read_process(p.pid)
            rec = {"pid": p.pid, "rank": p.rank, "role": p.role, "parent": p.parent}
            rec.update(info or {"state": "gone"})
            records.append(rec)
        if not records:
            raise ProbeFailed("no processes to read")
        layout = ctx.options.get("layout", {})
        doc = {"schema": SCHEMA, "host": ctx.host, "snapshot": snap, "t": time.monotonic(),
               "wall": time.time(), "layout": layout, "procs": records}
        ctx.add(f"procs-snap{snap}.json", json.dumps(doc, indent=1))

    def build(self, parsed: list[Parsed], facts: dict[str, Any]) -> None:
        snaps = sorted((p.data for p in parsed), key=lambda d: (d.get("host", ""), d.get("t", 0)))
        by_host: dict[str, list[dict[str, Any]]] = {}
        for s in snaps:
            by_host.setdefault(s.get("host", ""), []).append(s)
        by_rank: dict[str, dict[str, Any]] = {}
        busy, idle, dstate, dead, alive, waking = set(), set(), set(), set(), set(), set()
        interval = 0.0
        local_ws = 0
        launcher_alive = True
        threads_total = workers_total = 0
        for _host, series in by_host.items():
            first, last = series[0], series[-1]
            dt = max(0.0, float(last.get("t", 0)) - float(first.get("t", 0)))
            interval = max(interval, dt)
            lay = last.get("layout") or {}
            local_ws = max(local_ws, int(lay.get("local_world_size") or 0))
            dead |= set(lay.get("dead_ranks") or [])
            before = {r["pid"]: r for r in first["procs"]}
            for rec in last["procs"]:
                if rec.get("role") == "launcher":
                    launcher_alive = launcher_alive and rec.get("state") not in ("gone", "Z")
                    continue
                if rec.get("role") != "rank" or rec.get("rank") is None:
                    continue
                r = int(rec["rank"])
                key = str(r)
                if rec.get("state") in ("gone", "Z"):
                    dead.add(r)
                    continue
                alive.add(r)
                prev = before.get(rec["pid"])
                cpu_pct = None
                if prev is not None and dt > 0 and "cpu_s" in prev and "cpu_s" in rec:
                    cpu_pct = round(100.0 * (rec["cpu_s"] - prev["cpu_s"]) / dt, 1)
                workers = [w for w in last["procs"] if w.get("role") == "worker" and w.get("parent") == rec["pid"]]
                d_threads = int((rec.get("task_states") or {}).get("D", 0))
                if (prev is not None and rec.get("main_voluntary_switches") is not None
                        and prev.get("main_voluntary_switches") is not None
                        and rec["main_voluntary_switches"] - prev["main_voluntary_switches"] >= MAIN_WAKEUPS):
                    waking.add(r)
                by_rank[key] = {
                    "pid": rec["pid"], "state": rec.get("state", "?"), "cpu_pct": cpu_pct,
                    "threads": rec.get("threads", 0), "rss_mb": rec.get("rss_mb", 0.0),
                    "wchan": rec.get("wchan", ""), "d_threads": d_threads,
                    "workers": len(workers),
                    "workers_alive": sum(1 for w in workers if w.get("state") not in ("gone", "Z")),
                }
                threads_total += int(rec.get("threads") or 0)
                workers_total += len(workers)
                if rec.get("state") == "D" or d_threads:
                    dstate.add(r)
                if cpu_pct is not None:
                    (busy if cpu_pct >= BUSY_PCT else idle if cpu_pct < IDLE_PCT else set()).add(r)
        facts["procs"] = {
            "snapshots": len(snaps), "interval_s": round(interval, 3), "by_rank": by_rank,
            "busy_ranks": sorted(busy), "idle_ranks": sorted(idle), "d_state_ranks": sorted(dstate),
            "dead_ranks": sorted(dead - alive), "ranks_on_host": sorted(alive),
            "local_world_size": local_ws, "launcher_alive": launcher_alive,
            "threads_total": threads_total, "workers_total": workers_total,
            "main_waking_ranks": sorted(waking),
        }
        ranks = set(facts["job"].get("ranks_seen") or []) | alive | dead
        facts["job"]["ranks_seen"] = sorted(ranks)

    def describe_state(self, value: str) -> str:
        return self.STATE_WORDS.get(value, value)


PROBE = ProcsProbe()
