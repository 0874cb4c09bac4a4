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

import re
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
#: kinds of InfiniBand/GPUDirect fault lines (patterns nccl*.yaml, net_more.yaml) that the job may
#: still have got past: see :func:`ib_fault_facts`
IB_FAULT_KINDS = frozenset({"ib_error", "gdr_error"})
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
        **ib_fault_facts(scans),
        **address_facts(scans),
    }


_ADDR = re.compile(r"(?:\[\d+\])?(?P<iface>[\w.-]+):(?P<addr>[0-9a-fA-F.:%\w-]+?)<\d+>")
#: addresses that name the host itself, never a peer: loopback
_LOOPBACK = re.compile(r"^(?:127\.|::1$|::ffff:127\.)")
#: interface names that only reach the host itself or its local containers/VMs: loopback,
#: Docker's and libvirt's bridges, Docker user bridges (br-<id>), container veth ends
_LOCAL_IFACE = re.compile(r"^(?:lo|docker\d*|virbr\d*|br-[0-9a-f]{6,}|veth\w*)$")


def address_facts(scans: list[dict[str, Any]]) -> dict[str, Any]:
    """The IP addresses each host's NCCL bootstrap and socket transport use, and the ones that
    cannot carry traffic between hosts.

    Why: NCCL advertises the address of the interface it picked ("Bootstrap : Using
    eth0:10.0.0.2<0>", src/bootstrap.cc; "NET/Socket : Using [0]eth0:10.0.0.2<0>",
    src/transport/net_socket.cc) and its peers connect to it. Two different hosts that advertise
    the same address picked a host-local network: containers on Docker's default bridge all get
    172.17.0.2, a libvirt bridge is 192.168.122.1 everywhere, a NAT'd pod network repeats; and a
    loopback address (127.x, ::1) on a job of several hosts is unreachable by definition. Both
    stop the job at set-up (a hang in bootstrap, or connect errors), whatever the interface is
    called, which the interface-name check (lo, docker0, virbr0) alone misses. ``local_ifaces``
    adds the host-local interface names (lo, docker*, virbr*, br-<id>, veth*) that the socket
    transport lists next to a good one ("NET/Socket : Using [0]eth0:... [1]docker0:..."): NCCL
    spreads traffic over every listed interface, so the peers' connections to the bridge fail."""
    by_host: dict[str, set[str]] = {}
    ifaces: dict[str, set[str]] = {}
    sock_ifaces: dict[str, set[str]] = {}
    chosen: set[str] = set()
    for sc in scans:
        for e in sc.get("events", []):
            host = str(e.get("host") or "")
            if not host:
                continue
            f = e.get("fields") or {}
            if e.get("kind") == "nccl_bootstrap" and f.get("addr"):
                by_host.setdefault(host, set()).add(str(f["addr"]))
                ifaces.setdefault(host, set()).add(str(f.get("iface") or ""))
            elif e.get("kind") == "nccl_net" and f.get("net") == "Socket" and f.get("devices"):
                for m in _ADDR.finditer(str(f["devices"])):
                    by_host.setdefault(host, set()).add(m.group("addr"))
                    sock_ifaces.setdefault(host, set()).add(m.group("iface"))
            elif e.get("kind") == "nccl_network" and f.get("net"):
                chosen.add(str(f["net"]))
    owners: dict[str, set[str]] = {}
    for host, addrs in by_host.items():
        for a in addrs:
            owners.setdefault(a, set()).add(host)
    shared = sorted(a for a, hs in owners.items() if len(hs) > 1 and not _LOOPBACK.match(a))
    # several hosts: addresses from more than one, or NCCL lines of more than one host at all
    multi = len(by_host | {h: set() for sc in scans for h in sc.get("nccl_hosts", []) if h}) > 1
    loop = sorted(h for h, addrs in by_host.items() if multi and any(_LOOPBACK.match(a) for a in addrs))
    if not chosen or "Socket" in chosen:  # the socket transport's list matters only when it carries data
        for h, names in sock_ifaces.items():
            ifaces.setdefault(h, set()).update(names)
    local = sorted({f"{h}: {i}" for h, names in ifaces.items() for i in names if multi and _LOCAL_IFACE.match(i)})
    lines = [f"{h}: {', '.join(sorted(a))}" for h, a in sorted(by_host.items())][:16]
    return {
        "addr_hosts": len(by_host),
        "shared_addrs": shared[:16],          # one address advertised by several hosts
        "shared_addr_hosts": sorted({h for a in shared for h in owners[a]})[:64],
        "loopback_hosts": loop[:64],          # hosts advertising 127.x / ::1 on a multi-host job
        "local_ifaces": local[:16],           # "host: docker0": host-local interfaces NCCL uses, multi-host job
        "addr_lines": lines,
    }


def ib_fault_facts(scans: list[dict[str, Any]]) -> dict[str, Any]:
    """How many InfiniBand/GPUDirect fault lines the job did not get past.

    Why: NCCL's IB transport prints WARN lines that healthy jobs also show, for a HCA it then
    skips at set-up or a port event it rides out. What tells a fault from noise is what the same
    process did next: a fatal IB error aborts NCCL's set-up (the result code climbs back to
    ncclCommInitRank), so an "Init COMPLETE" printed later by the same process (file, host, pid)
    means the error did not stop it; and training steps after the error (``survived``, from
    probes/logs/survival.py) mean the job went on. Device discovery lines NCCL skips past by
    design ("Unable to open device", see _IB_SKIP_SIGS) are ``ib_devices_skipped``.
    ``ib_faults`` counts the other lines with neither, ``ib_faults_passed`` the passed ones. Lines without a pid (pasted without NCCL's host:pid prefix)
    can only be passed by training progress."""
    open_, passed, skipped = 0, 0, 0
    for sc in scans:
        events = sc.get("events", [])
        done_at: dict[tuple[str, str, Any], int] = {}
        for e in events:
            if e.get("kind") == "nccl_init_complete" and e.get("pid") is not None:
                k = _proc_key(e)
                done_at[k] = max(done_at.get(k, 0), int(e.get("line") or 0))
        for e in events:
            if e.get("kind") not in IB_FAULT_KINDS:
                continue
            later_init = e.get("pid") is not None and done_at.get(_proc_key(e), 0) > int(e.get("line") or 0)
            if e.get("survived") or later_init:
                passed += 1
            elif _ib_device_skipped(e):
                skipped += 1
            else:
                open_ += 1
    return {"ib_faults": open_, "ib_faults_passed": passed, "ib_devices_skipped": skipped}


#: NCCL's IB device discovery: a device or port it cannot open or query is skipped (``continue``
#: after the WARN, NVIDIA/nccl v2.21.5-1 src/transport/net_ib.cc:426/433/440; the RoCE version
#: probe of src/transport/net_ib/connect.cc:242/252 falls back the same way); set-up goes on with
#: the other devices or with sockets
_IB_SKIP_SIGS = frozenset({
    "nccl_net_net_ib_unable_to_query", "nccl_net_net_ib_unable_to_query_2", "nccl_net_net_ib_unable_to_query_3",
    "nccl_net_net_ib_open_failed_in", "nccl_net_net_ib_read_failed_in",
})
_IB_SKIP_CALLS = frozenset({"open_device", "query_device", "query_port", "get_device_list", "query_gid"})


def _ib_device_skipped(ev: dict[str, Any]) -> bool:
    """An IB line of device discovery that NCCL skips past (see _IB_SKIP_SIGS)."""
    if ev.get("sig") in _IB_SKIP_SIGS:
        return True
    f = ev.get("fields") or {}
    return ev.get("sig") == "nccl_ibv_failed" and (bool(f.get("device")) or f.get("call") in _IB_SKIP_CALLS)


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
