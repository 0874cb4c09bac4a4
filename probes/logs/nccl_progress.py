"""Where an NCCL_DEBUG=INFO log stops: the furthest set-up stage each process reached, and
whether anything came after it.

Why a module of its own: the most common evidence in a hang ticket is a NCCL INFO log that
looks normal and then ends, with "it hangs here". NCCL prints its set-up in a fixed order, so the
last line before the silence says which step never finished:

1. ``bootstrap``: "Bootstrap: Using <if>" (src/bootstrap.cc:133/592), "NCCL version",
   "cudaDriverVersion" (src/misc/cudawrap.cc:282), "NET/IB : Using ..." (src/transport/net_ib/
   init.cc:513), "NET/Socket : Using ..." (src/transport/net_socket.cc:77), "Using network %s"
   (src/init.cc:486);
2. ``init_start``: "comm %p rank %d nranks %d ... - Init START" (src/init.cc), the bootstrap ring
   between ranks is being built;
3. ``channels``: "Channel %02d/%d : %d[%d] -> %d[%d] via P2P/%s" (src/transport/p2p.cc:423),
   "... via SHM/direct" (src/transport/shm.cc:116), "... [send] via NET/%s/%d"
   (src/transport/net.cc:324/377): peers are being connected;
4. ``connected``: "Connected all rings" / "Connected all trees" (src/transport/generic.cc:40/61);
5. ``complete``: "... - Init COMPLETE" (src/init.cc:1945) and "Init timings" (src/init.cc:1951):
   the communicator is ready, the next thing is the job's first collective;
6. ``teardown``: "comm %p ... - Destroy COMPLETE" / "Abort COMPLETE" (src/init.cc:375).

A log that ends at stage 5 on every rank with nothing after it is a job whose first collective
never returned (on one node with P2P channels: the classic P2P/ACS/IOMMU hang); one that ends at
stage 1-2 never connected its peers (interface, firewall, a rank that never started). Whether
anything came after is told by the lines that follow a file's last NCCL line: a job that trains
prints its steps there, and a clean end prints "Destroy COMPLETE".

The input is the per-file scans of :mod:`.scan` (their kept events, at most 20 per signature and
file, and their line counts); a file whose last NCCL lines were not all kept looks as if more
followed, which only ever makes the facts below more cautious.
"""

from __future__ import annotations

from typing import Any

#: set-up stages in NCCL's order; a process's stage is the furthest one its lines show
STAGES = ("none", "bootstrap", "init_start", "channels", "connected", "complete", "teardown")
_STAGE_OF_KIND = {
    "nccl_version": 1, "nccl_bootstrap": 1, "nccl_net": 1, "nccl_ib_absent": 1, "nccl_network": 1,
    "nccl_env": 1, "nccl_driver": 1, "nccl_init_start": 2, "nccl_topology": 2, "nccl_transport": 3,
    "nccl_gdr": 3, "nccl_connected": 4, "nccl_init_complete": 5, "nccl_init_timings": 5,
    "nccl_comm_end": 6,
}
#: kinds of lines a training loop prints as it goes (step counters, progress bars: the training
#: signatures of patterns/*.yaml); any of them after the set-up means the job got past it
PROGRESS_KINDS = frozenset({"train_progress"})
#: lines after a file's last NCCL line that still count as "the log stops there": a pasted
#: "<hangs here>" remark, a launcher's "^C", a blank line
TAIL_SLACK = 3


def _int(v: Any) -> int | None:
    """A numeric field as an int (the scanner converts only the field names it knows)."""
    if isinstance(v, int):
        return v
    return int(v) if isinstance(v, str) and v.isdigit() and len(v) < 12 else None


def _proc_key(ev: dict[str, Any]) -> tuple[str, str, Any]:
    return (str(ev.get("file") or ""), str(ev.get("host") or ""), ev.get("pid"))


def progress_facts(scans: list[dict[str, Any]]) -> dict[str, Any]:
    """The stage each NCCL process reached and whether its file stops there (see the module
    docstring for the stages and their NCCL sources)."""
    stage: dict[tuple[str, str, Any], int] = {}
    rank_of: dict[tuple[str, str, Any], int] = {}
    tails: list[int] = []
    last_lines: list[str] = []
    nnodes = 0
    drivers: dict[str, set[int]] = {}
    chosen: set[str] = set()
    env: set[str] = set()
    progressed = 0
    for sc in scans:
        nccl = [e for e in sc.get("events", []) if e.get("kind") in _STAGE_OF_KIND]
        steps = [e["line"] for e in sc.get("events", []) if e.get("kind") in PROGRESS_KINDS]
        if not nccl:
            progressed += len(steps)  # another file of the job (its stderr, the launcher's) counts steps
            continue
        last = max(nccl, key=lambda e: e["line"])
        progressed += sum(1 for ln in steps if ln > last["line"])
        tails.append(max(0, int(sc.get("lines") or 0) - int(last["line"])))
        last_lines.append(f"{sc.get('path', '?')}:{last['line']}: {last['text'][:200]}")
        for e in nccl:
            k = _proc_key(e)
            stage[k] = max(stage.get(k, 0), _STAGE_OF_KIND[e["kind"]])
            f = e.get("fields") or {}
            if _int(f.get("comm_rank")) is not None:
                rank_of.setdefault(k, _int(f.get("comm_rank")) or 0)
            elif isinstance(e.get("rank"), int):
                rank_of.setdefault(k, e["rank"])
            if e["kind"] == "nccl_topology" and _int(f.get("nnodes")) is not None:
                nnodes = max(nnodes, _int(f.get("nnodes")) or 0)
            elif e["kind"] == "nccl_driver" and _int(f.get("driver")) is not None:
                drivers.setdefault(str(e.get("host") or ""), set()).add(_int(f.get("driver")) or 0)
            elif e["kind"] == "nccl_network" and f.get("net"):
                chosen.add(str(f["net"]))
            elif e["kind"] == "nccl_env" and f.get("param"):
                # "%s set by environment to %lld." (src/misc/param.cc:100): the value ends in a dot
                env.add(f"{f['param']}={str(f.get('value') or '').rstrip('.')}")
    transports = sorted({t for sc in scans for t in sc.get("transports", [])})
    hosts = sorted({h for sc in scans for h in sc.get("nccl_hosts", []) if h})
    nets = sorted({n for sc in scans for n in sc.get("nets", [])})
    values = list(stage.values())
    lo = min(values) if values else 0
    hi = max(values) if values else 0
    net_channels = any(t.startswith("NET/") or t.startswith("CollNet") for t in transports)
    if not nnodes and values:
        nnodes = 2 if (net_channels or len(hosts) > 1) else 1 if transports else 0
    distinct_drivers = sorted({d for ds in drivers.values() for d in ds})
    by_stage: dict[str, list[int]] = {}
    for k, s in stage.items():
        if k in rank_of:
            by_stage.setdefault(STAGES[s], []).append(rank_of[k])
    return {
        "procs": len(stage),
        "stage": STAGES[lo],            # the stage every process reached
        "top_stage": STAGES[hi],        # the furthest any process reached
        "stage_index": lo,
        "ranks_by_stage": {s: sorted(set(r))[:64] for s, r in sorted(by_stage.items())},
        # every file with NCCL lines ends within TAIL_SLACK lines of its last NCCL line, no
        # communicator was torn down and no file shows a training step after the set-up: the
        # log stops inside or right after NCCL's set-up
        "stopped": bool(tails) and max(tails) <= TAIL_SLACK and hi < 6 and progressed == 0,
        "progress_lines": progressed,
        "tail_lines": max(tails) if tails else 0,
        "last_lines": last_lines[:8],
        "nodes": nnodes,
        "single_node": nnodes == 1,
        "p2p": any(t.startswith("P2P") for t in transports),
        "shm": any(t.startswith("SHM") for t in transports),
        "net_ib": any(t.startswith("NET/IB") for t in transports),
        "net_socket": any(t.startswith("NET/Socket") for t in transports),
        "ib_devices": "IB" in nets,
        "networks": sorted(chosen | set(nets)),
        "chosen_networks": sorted(chosen),   # "Using network %s" (src/init.cc:486)
        "env": sorted(env)[:32],             # NCCL_* settings NCCL printed as read from the environment
        "transports": transports,
        "driver_versions": distinct_drivers,
        "driver_lines": [f"{h or 'host unknown'}: cudaDriverVersion {', '.join(map(str, sorted(v)))}"
                         for h, v in sorted(drivers.items())][:16],
        "driver_differ": len(distinct_drivers) > 1,
        "never_started": never_started(scans),
    }


def never_started(scans: list[dict[str, Any]]) -> list[int]:
    """Ranks of a communicator that no line shows starting it, while its other ranks logged
    "Init START" and none completed: NCCL prints Init START before its bootstrap ring
    (src/init.cc, ncclCommInitRankFunc), and the ring cannot close without every rank, so the
    ranks shown wait for the missing ones. Only when few are missing (at most a quarter, one at
    least): a log of one node of many misses whole nodes, which says nothing."""
    by_comm: dict[str, tuple[int, set[int], bool]] = {}
    for sc in scans:
        for rec in (sc.get("comm_inits") or {}).values():
            rank, nranks, comm_id, done = rec[0], rec[1], rec[2], rec[3]
            if not comm_id or not isinstance(nranks, int) or not isinstance(rank, int):
                continue
            n, seen, any_done = by_comm.get(comm_id, (nranks, set(), False))
            seen.add(rank)
            by_comm[comm_id] = (max(n, nranks), seen, any_done or bool(done))
    out: set[int] = set()
    for n, seen, any_done in by_comm.values():
        if any_done or n > 4096 or n < 2:
            continue
        missing = set(range(n)) - seen
        if 0 < len(missing) <= max(1, n // 4):
            out |= missing
    return sorted(out)[:64]
