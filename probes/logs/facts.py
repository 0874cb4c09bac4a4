"""Joining the per-file scans into the ``logs`` facts: who failed first, who only waited.

Why a step of its own: a scan sees one file, but a failure is a story across files (rank 3's
OOM in its own log, the launcher's exit summary in another, the peers' watchdog timeouts in a
third). Here events are ordered across files, each rank is sorted into failed on its own or only
waiting for others, exits are marked as cascade or first failure, and the first failure is picked
by time where lines carry one and by the kind's priority where clocks cannot tell.
"""

from __future__ import annotations

import re
from typing import Any

from .partial import partial_facts

MAX_EVENTS = 400                  # events kept in the facts (all hits are counted)
EXAMPLES_PER_KIND = 8
FIRST_FAILURE_WINDOW_S = 30.0     # timestamped first failures closer than this are ordered by kind

# Evidence of waiting for someone else: a rank whose own evidence is only these died of the wait.
WAIT_KINDS = frozenset({
    "watchdog_timeout", "watchdog_progress", "gloo_timeout", "store_timeout", "init_timeout",
    "peer_connection_lost", "nccl_remote_error", "store_connection_lost", "nccl_teardown",
    "desync_report", "launcher_teardown", "process_abort", "barrier_missing_ranks", "dump_signal",
    "collective_timeout",
})
TEARDOWN_SIGNALS = frozenset({"SIGTERM", "SIGINT", "SIGHUP"})
#: Families of failure kinds, for rules that weigh a prior against what the logs show ("a crash
#: prior stands back where the logs show a hang or a network failure and no CUDA or memory one"):
#: the kind names live here once instead of in every such rule (tests/test_logs_families.py checks
#: that each is a kind some signature emits).
FAMILIES: dict[str, frozenset[str]] = {
    "hang": frozenset({
        "watchdog_timeout", "collective_timeout", "watchdog_progress", "watchdog_stuck", "gloo_timeout",
        "store_timeout", "init_timeout", "init_waiting", "desync_report", "desync_lagging",
        "collective_mismatch", "fr_mismatch", "fr_missing_ranks", "ras_op_counts_differ", "ras_dead_process",
        "barrier_missing_ranks", "dump_signal", "nccl_comm_aborted", "rendezvous_closed",
        "rendezvous_keepalive_failed", "store_connection_lost", "store_connect_retry", "init_connect_failed",
        "peer_connection_lost", "nccl_remote_error"}),
    "network": frozenset({
        "net_connect_failed", "net_config_error", "net_interface_missing", "nccl_net_error",
        "nccl_bootstrap_error", "nccl_system_error", "ib_error", "ib_port_down", "ofi_error", "ofi_unreachable",
        "rdma_kernel_error"}),
    "shm": frozenset({"shm_exhausted", "shm_error", "bus_error"}),
    "cuda": frozenset({"cuda_setup", "cuda_error", "cuda_api_error", "cuda_unknown", "cuda_assert"}),
    "native": frozenset({"native_crash"}),
    "memory": frozenset({"gpu_oom", "host_oom_kill", "host_oom_invoked"}),
    "worker": frozenset({"dataloader_worker_died", "dataloader_worker_error"}),
    "gpu": frozenset({"xid", "gpu_fault"}),
}
#: Failures that explain a collective timeout on their own (a rank that ran out of memory, faulted,
#: lost its worker, its network or its GPU; ranks that issued different collectives): the timeout
#: rules (LOG007, HANG043-054) stand back when any of these is in the logs, and read the kinds
#: found from ``logs.timeout_explained_by`` instead of each carrying the list.
TIMEOUT_EXPLAINERS = frozenset({
    "gpu_oom", "host_oom_kill", "xid", "gpu_fault", "collective_mismatch", "fr_mismatch",
    "dataloader_worker_died", "shm_exhausted", "native_crash", "ib_error",
    "net_connect_failed", "cuda_error", "cuda_api_error", "cuda_setup", "host_hw_error", "kernel_hung_task",
})
#: A machine message quoted inside a reporter's sentence (an exception class, "Tried to allocate",
#: a CUDA_ERROR_* or cudaError* name): the words around it are prose, the message is the machine's.
_MACHINE_SHAPE = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\b|Tried to allocate|\b[A-Z][A-Z0-9]*_[A-Z0-9_]{3,}\b|"
                            r"\bcudaError\w+|Cuda failure '")


def _ordered_events(scans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every kept event in file order; a line without a rank of its own gets one from its pid
    when the launcher's failure summary maps that pid to a rank (NCCL lines, OOM kills)."""
    pid_rank: dict[int, int] = {}
    for sc in scans:
        pid_rank.update({int(k): v for k, v in sc["pid_rank"].items()})
    out = []
    for fi, sc in enumerate(scans):
        # A file whose prefixed lines all speak for one rank (its own log, or a 1-rank job):
        # its unprefixed errors are that rank's too.
        only = sc["ranks"][0] if len(sc["ranks"]) == 1 else None
        for ev in sc["events"]:
            ev = {**ev, "_fi": fi}
            if ev["rank"] is None and ev.get("pid") in pid_rank:
                ev["rank"] = pid_rank[ev["pid"]]
            if ev["rank"] is None and only is not None and ev["role"] == "first_failure":
                ev["rank"] = only
            out.append(ev)
    out.sort(key=lambda e: (e["_fi"], e["line"]))
    return out


def _pick_first(cands: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The earliest candidate: timestamps order events further apart than the window; inside
    it (clock skew, second resolution) the kind's priority and then file order decide."""
    if not cands:
        return None
    stamped = [c for c in cands if c.get("ts") is not None]
    if len(stamped) >= 2:
        t0 = min(c["ts"] for c in stamped)
        cands = [c for c in cands if c.get("ts") is None or c["ts"] - t0 <= FIRST_FAILURE_WINDOW_S]
    return min(cands, key=lambda c: (c["priority"], c.get("_fi", 0), c["line"]))


def _clean(ev: dict[str, Any] | None) -> dict[str, Any] | None:
    if ev is None:
        return None
    return {k: v for k, v in ev.items() if not k.startswith("_")}


def build_facts(scans: list[dict[str, Any]]) -> dict[str, Any]:
    """Join the per-file scans into the ``logs`` namespace (see facts_schema)."""
    events = _ordered_events(scans)
    counts: dict[str, int] = {}
    sig_counts: dict[str, int] = {}
    for sc in scans:
        for k, v in sc["counts"].items():
            counts[k] = counts.get(k, 0) + v
        for k, v in sc["sig_counts"].items():
            sig_counts[k] = sig_counts.get(k, 0) + v
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for ev in events:
        lst = by_kind.setdefault(ev["kind"], [])
        if len(lst) < EXAMPLES_PER_KIND:
            lst.append(_clean(ev))
    tracebacks = [tb for sc in scans for tb in sc["tracebacks"]]
    external_kill = counts.get("external_kill", 0) > 0

    # Which ranks failed on their own, which only waited for others.
    own: dict[int, set[str]] = {}      # rank -> kinds of its own first-failure evidence
    waited: dict[int, set[str]] = {}   # rank -> kinds of its waiting evidence
    for ev in events:
        r = ev["rank"]
        if r is None or ev.get("survived") or ev["kind"] in ("desync_lagging", "duplicate_gpu", "collective_mismatch", "rank_exit"):
            continue
        if ev["kind"] in WAIT_KINDS or ev["role"] == "cascade":
            waited.setdefault(r, set()).add(ev["kind"])
        elif ev["role"] == "first_failure":
            own.setdefault(r, set()).add(ev["kind"])
    for tb in tracebacks:
        r = tb["rank"]
        if r is None or tb["role"] == "context" or tb.get("survived"):
            continue
        kinds = set(tb["kinds"]) or {"python_exception"}
        if tb["role"] == "cascade" or kinds <= WAIT_KINDS:
            waited.setdefault(r, set()).update(kinds)
        else:
            own.setdefault(r, set()).update(kinds - WAIT_KINDS)

    exits = _merge_exits(scans)
    for ex in exits:
        r = ex["rank"]
        if ex.get("survived"):
            ex["cascade"], ex["why"] = True, "the job went on after it (training progress later in the log)"
        elif external_kill:
            ex["cascade"], ex["why"] = True, "the launcher or scheduler was told to stop the job"
        elif ex["signal"] in TEARDOWN_SIGNALS and not ex["root_cause"]:
            ex["cascade"], ex["why"] = True, f"stopped by the launcher ({ex['signal']}) after another failure"
        elif r is not None and r not in own and r in waited:
            ex["cascade"] = True
            ex["why"] = "its own errors are only waiting for peers (" + ", ".join(sorted(waited[r])) + ")"
        elif ex["exitcode"] == 0:
            ex["cascade"], ex["why"] = False, "exited cleanly"
        else:
            ex["cascade"] = False
            ex["why"] = ("its own error: " + ", ".join(sorted(own[r]))) if r in own else "exited or was killed with no error of its own in the logs"
    dead = sorted({ex["rank"] for ex in exits if not ex["cascade"] and ex["exitcode"] not in (0, None)
                   and ex["rank"] is not None})
    # an error the job went on after (survival.py) is no candidate for what ended it
    failed = sorted(own)
    waiting = sorted(set(waited) - set(own))

    cands = []
    for ev in events:
        if ev["role"] == "first_failure" and not (ev["kind"] == "rank_exit") and not ev.get("survived"):
            cands.append(ev)
    for tb in tracebacks:
        if tb["role"] == "first_failure" and not tb.get("survived"):
            cands.append({"sig": "python_traceback", "kind": "python_exception", "role": "first_failure",
                          "severity": "high", "priority": 40, "rank": tb["rank"], "host": "",
                          "file": tb["file"], "line": tb["exc_line"], "time": "", "ts": None,
                          "text": f"{tb['exc_type']}: {tb['message']}"[:300],
                          "fields": {"exc_type": tb["exc_type"], "last_frame": tb["last_frame"]},
                          "_fi": next((i for i, sc in enumerate(scans) if sc["path"] == tb["file"]), 0)})
    for ex in exits:
        if not ex["cascade"] and ex["exitcode"] not in (0, None):
            cands.append({"sig": "rank_exit", "kind": "rank_exit", "role": "first_failure",
                          "severity": "high", "priority": 50 if ex["root_cause"] else 55,
                          "rank": ex["rank"], "host": ex["host"], "file": ex.get("file", ""),
                          "line": ex.get("line") or 0, "time": ex.get("time", ""), "ts": ex.get("ts"),
                          "text": _exit_text(ex), "fields": {"exitcode": ex["exitcode"], "signal": ex["signal"]},
                          "_fi": ex.get("_fi", 0)})
    first = _pick_first(cands)
    errors = [ev for ev in events if ev["severity"] in ("critical", "high") and not ev.get("survived")]
    first_error = _pick_first(errors) if errors else None

    waits = [w for sc in scans for w in sc["waits"]]
    nccl = _nccl_facts(scans, events)
    out: dict[str, Any] = {
        "files": len(scans),
        "lines": sum(sc["lines"] for sc in scans),
        "events": [_clean(e) for e in _cap_events(events)],
        "counts": counts, "sig_counts": sig_counts, "kinds": sorted(counts), "by_kind": by_kind,
        "tracebacks": tracebacks[:200],
        "exited_ranks": [{k: v for k, v in ex.items() if not k.startswith("_")} for ex in exits],
        "dead_ranks": dead, "failed_ranks": failed, "waiting_ranks": waiting,
        "launcher_failed": bool(counts.get("launcher_failed") or exits),
        "external_kill": external_kill,
        "waits": _dedupe_waits(waits), "wait_summary": _wait_summary(waits),
        "desync_lagging": sorted({e["rank"] for e in events if e["kind"] == "desync_lagging" and e["rank"] is not None}),
        "mismatch": _mismatches(events),
        "mismatch_culprits": _mismatch_culprits(events),
        "long_work": [{"rank": e["rank"], "what": str(e["fields"].get("what", "")), "text": e["text"]}
                      for e in events if e["kind"] == "long_work"][:50],
        "nccl": nccl,
        "duplicate_gpu": _duplicates(scans, events),
        "xids": [{"code": e["fields"].get("code"), "pci": e["fields"].get("pci", ""), "host": e["host"],
                  "rank": e["rank"], "text": e["text"]} for e in events if e["kind"] == "xid"][:100],
        "compile": _compile_facts(scans, counts, events),
        "amp": _amp_facts(scans, counts),
        "world_size": max([sc["world_size"] for sc in scans] + [0]),
        **survived_facts(scans),
        "prose_only_kinds": prose_only_kinds(events),
        "families": sorted(f for f, kinds in FAMILIES.items() if kinds & counts.keys()),
        "timeout_explained_by": sorted(TIMEOUT_EXPLAINERS & counts.keys()),
    }
    out["xid_codes"] = sorted({x["code"] for x in out["xids"] if isinstance(x["code"], int)})
    inits = [e for e in events if e["kind"] == "init_timeout"]
    out["init_timeouts"] = [{"rank": e["rank"], "world_size": e["fields"].get("world_size"),
                             "joined": e["fields"].get("joined"), "text": e["text"]} for e in inits][:50]
    out["init_missing_ranks"] = _init_missing(inits, out["world_size"])
    out.update(partial_facts(scans, waits, out["world_size"], set(failed),
                             {ex["rank"] for ex in exits if ex["rank"] is not None}, events))
    if first is not None:
        out["first_failure"] = _clean(first)
    if first_error is not None:
        out["first_error"] = _clean(first_error)
    out["by_rank"] = _by_rank(exits, own, waited, tracebacks, events, dead)
    return out


def survived_facts(scans: list[dict[str, Any]]) -> dict[str, Any]:
    """Error kinds the job went on after in every file that shows them (see survival.py): a
    kind survived in one rank's log and fatal in another's is not survived."""
    ok = {k for sc in scans for k in sc.get("survived_kinds", [])}
    fatal = {k for sc in scans for k in sc.get("unsurvived_kinds", [])}
    return {"survived_kinds": sorted(ok - fatal),
            "progress_lines": sum(sc.get("progress_lines", 0) for sc in scans)}


def prose_only_kinds(events: list[dict[str, Any]]) -> list[str]:
    """Kinds whose every hit is a reporter's own sentence in a ticket's prose ("it ran out of
    memory once"), with no machine message quoted in it: a paraphrase is a lead, not the
    machine's word, so rules that act at high severity on a kind stand back on these."""
    prose: dict[str, bool] = {}
    for e in events:
        said = str(e.get("file", "")).endswith(" prose") and not _MACHINE_SHAPE.search(str(e.get("text", "")))
        prose[e["kind"]] = prose.get(e["kind"], True) and said
    return sorted(k for k, only in prose.items() if only)


def _exit_text(ex: dict[str, Any]) -> str:
    who = f"rank {ex['rank']}" if ex["rank"] is not None else f"local rank {ex['local_rank']}"
    sig = f" ({ex['signal']})" if ex["signal"] else ""
    where = f" on {ex['host']}" if ex["host"] else ""
    return f"{who}{where} exited with code {ex['exitcode']}{sig}" + (" - first failure per launcher" if ex["root_cause"] else "")


def _merge_exits(scans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per process: the failure summary's entry and the agent's 'failed (exitcode'
    line describe the same pid; SLURM task lines are kept as they are."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    pid_rank: dict[int, int] = {}
    for sc in scans:
        pid_rank.update({int(k): v for k, v in sc["pid_rank"].items()})
    for fi, sc in enumerate(scans):
        for ex in sc["exits"]:
            rec = {**ex, "file": sc["path"], "_fi": fi}
            if rec["rank"] is None and rec.get("pid") in pid_rank:
                rec["rank"] = pid_rank[rec["pid"]]
            key = (rec["host"] if rec["host"] != "localhost" else "", rec["pid"]) if rec.get("pid") else \
                (rec["host"], rec["rank"], rec["source"])
            prev = merged.get(key)
            if prev is None:
                merged[key] = rec
                continue
            for k, v in rec.items():
                if prev.get(k) in (None, "") and v not in (None, ""):
                    prev[k] = v
            prev["root_cause"] = prev["root_cause"] or rec["root_cause"]
    out = list(merged.values())
    hosts = {e["host"] for e in out if e["host"] and e["host"] != "localhost"}
    for e in out:  # one host: the local rank is the rank
        if e["rank"] is None and e.get("local_rank") is not None and len(hosts) <= 1 and e["source"] == "launcher":
            e["rank"] = e["local_rank"]
        e.setdefault("time", "")
        e.setdefault("ts", None)
        e.setdefault("line", 0)
    out.sort(key=lambda e: (e["rank"] is None, e["rank"] if e["rank"] is not None else 0, e.get("pid") or 0))
    return out


def _cap_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if len(events) <= MAX_EVENTS:
        return events
    # Keep every non-context event first, then fill with context, in file order.
    important = [e for e in events if e["role"] != "context"]
    rest = [e for e in events if e["role"] == "context"]
    keep = important[:MAX_EVENTS] + rest[:max(0, MAX_EVENTS - len(important))]
    keep.sort(key=lambda e: (e["_fi"], e["line"]))
    return keep


def _dedupe_waits(waits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for w in waits:
        seen.setdefault((w["rank"], w["host"], w["seq"], w["op"], w["backend"], w.get("pg", "")), w)
    return list(seen.values())[:500]


def _wait_summary(waits: list[dict[str, Any]]) -> dict[str, Any]:
    if not waits:
        return {}
    ratios = [w["ran_ms"] / w["timeout_ms"] for w in waits
              if isinstance(w.get("ran_ms"), int) and isinstance(w.get("timeout_ms"), int) and w["timeout_ms"] > 0]
    by_seq: dict[int, set[str]] = {}
    numel: dict[tuple[int, str], set[int]] = {}
    for w in waits:
        if isinstance(w.get("seq"), int) and w.get("op"):
            by_seq.setdefault(w["seq"], set()).add(w["op"])
            if isinstance(w.get("numel_in"), int):
                numel.setdefault((w["seq"], w["op"]), set()).add(w["numel_in"])
    timeouts = [w["timeout_ms"] for w in waits if isinstance(w.get("timeout_ms"), int)]
    rans = [w["ran_ms"] for w in waits if isinstance(w.get("ran_ms"), int)]
    return {
        "n": len(waits),
        "ranks": sorted({w["rank"] for w in waits if w["rank"] is not None}),
        "seqs": sorted(by_seq),
        "ops": sorted({w["op"] for w in waits if w.get("op")}),
        "min_timeout_ms": min(timeouts) if timeouts else 0,
        "max_ran_ms": max(rans) if rans else 0,
        "max_ran_ratio": round(max(ratios), 3) if ratios else 0.0,
        "same_seq_ops_differ": any(len(ops) > 1 for ops in by_seq.values()),
        "numel_differs": any(len(n) > 1 for n in numel.values()),
    }


def _mismatches(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for e in events:
        if e["kind"] != "collective_mismatch":
            continue
        f = e["fields"]
        ranks = sorted({r for r in (f.get("rank"), f.get("rank2")) if isinstance(r, int)})
        out.append({"sig": e["sig"], "ranks": ranks, "reporter": e["rank"] if e["sig"] != "fingerprint_mismatch" else None,
                    "op": str(f.get("op", "")), "op2": str(f.get("op2", "")),
                    "shape": str(f.get("shape", "")), "shape2": str(f.get("shape2", "")), "text": e["text"]})
    return out[:50]


def _mismatch_culprits(events: list[dict[str, Any]]) -> list[int]:
    """From DETAIL fingerprint messages, the ranks whose (op, shape) few others share."""
    fp: dict[int, tuple[str, str]] = {}
    for e in events:
        if e["sig"] != "fingerprint_mismatch":
            continue
        f = e["fields"]
        if isinstance(f.get("rank"), int):
            fp.setdefault(f["rank"], (str(f.get("op", "")), str(f.get("shape", ""))))
        if isinstance(f.get("rank2"), int):
            fp.setdefault(f["rank2"], (str(f.get("op2", "")), str(f.get("shape2", ""))))
    if len(fp) < 3:
        return []  # two ranks that disagree: the logs cannot say which one is odd
    groups: dict[tuple[str, str], list[int]] = {}
    for r, key in fp.items():
        groups.setdefault(key, []).append(r)
    sizes = sorted(len(g) for g in groups.values())
    if len(groups) < 2 or sizes[0] == sizes[-1] or sizes.count(sizes[0]) > 1:
        return []
    return sorted(min(groups.values(), key=len))


def _init_missing(inits: list[dict[str, Any]], world: int) -> list[int]:
    """Ranks that never reached init: the world minus the ranks that reported waiting, when the
    counts agree (every rank that arrived reported the timeout)."""
    ws = max([i["fields"].get("world_size") or 0 for i in inits] + [0]) or world
    joined = max([i["fields"].get("joined") or 0 for i in inits] + [0])
    reporters = {i["rank"] for i in inits if i["rank"] is not None}
    if not ws or not reporters or len(reporters) != joined or ws > 100000:
        return []
    return sorted(set(range(ws)) - reporters)


def _nccl_facts(scans: list[dict[str, Any]], events: list[dict[str, Any]]) -> dict[str, Any]:
    versions: dict[str, set[str]] = {}
    for sc in scans:
        for h, vs in sc["nccl_versions"].items():
            versions.setdefault(h, set()).update(vs)
    return {
        "versions": {h: sorted(v) for h, v in versions.items()},
        "distinct_versions": sorted({v for vs in versions.values() for v in vs}),
        "version_hosts": len([h for h in versions if h]),
        "version_lines": [f"{h or 'host unknown'}: NCCL {', '.join(sorted(v))}" for h, v in sorted(versions.items())],
        "transports": sorted({t for sc in scans for t in sc["transports"]}),
        "nets": sorted({n for sc in scans for n in sc["nets"]}),
        "ifaces": sorted({i for sc in scans for i in sc.get("ifaces", [])}),
        "hosts": sorted({h for sc in scans for h in sc["nccl_hosts"]}),
        "init_complete": sum(sc["init_complete"] for sc in scans),
        "warns": [e["text"] for e in events if e["kind"] == "nccl_warn"][:20],
    }


def _duplicates(scans: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for e in events:
        if e["kind"] == "duplicate_gpu":
            f = e["fields"]
            out.append({"host": e["host"], "bus_id": str(f.get("bus_id", "")),
                        "ranks": sorted({r for r in (f.get("rank"), f.get("rank2")) if isinstance(r, int)}),
                        "source": "NCCL warning"})
    # Init COMPLETE lines of one communicator naming the same busId on one host twice.
    rows: dict[str, list[list[Any]]] = {}
    for sc in scans:
        for comm, rs in sc["comm_devices"].items():
            rows.setdefault(comm, []).extend(rs)
    for rs in rows.values():
        by_dev: dict[tuple[str, str], set[Any]] = {}
        for host, pid, crank, bus in rs:
            by_dev.setdefault((host, bus), set()).add((pid, crank))
        for (host, bus), procs in by_dev.items():
            if len({p for p, _ in procs}) > 1:
                out.append({"host": host, "bus_id": bus, "ranks": sorted({r for _, r in procs if isinstance(r, int)}),
                            "source": "NCCL init lines"})
    out.sort(key=lambda d: not d["host"])  # named hosts first, so the dedupe keeps them
    seen = set()
    uniq = []
    for d in out:
        key = (d["bus_id"], tuple(d["ranks"]))
        if key not in seen:
            seen.add(key)
            uniq.append(d)
    for d in uniq:
        d["text"] = (f"ranks {', '.join(map(str, d['ranks']))} on GPU busId {d['bus_id']}"
                     + (f" of {d['host']}" if d["host"] else "") + f" ({d['source']})")
    return uniq[:50]


def _compile_facts(scans: list[dict[str, Any]], counts: dict[str, int],
                   events: list[dict[str, Any]]) -> dict[str, Any]:
    funcs: dict[str, int] = {}
    for sc in scans:
        for k, v in sc["recompile_functions"].items():
            funcs[k] = funcs.get(k, 0) + v
    return {
        "recompiles": counts.get("recompile", 0),
        "limit_hits": counts.get("recompile_limit", 0),
        "functions": funcs,
        "reasons": [str(e["fields"].get("reason", "")) for e in events if e["kind"] == "recompile_reason"][:10],
    }


def _amp_facts(scans: list[dict[str, Any]], counts: dict[str, int]) -> dict[str, Any]:
    scales = [s for sc in scans for s in sc["loss_scales"]]
    return {
        "skips": counts.get("fp16_skip", 0),
        "min_scale": min(scales) if scales else None,
        "at_minimum": counts.get("fp16_scale_min", 0) > 0,
    }


def _by_rank(exits: list[dict[str, Any]], own: dict[int, set[str]], waited: dict[int, set[str]],
             tracebacks: list[dict[str, Any]], events: list[dict[str, Any]], dead: list[int]) -> dict[str, Any]:
    ranks = {ex["rank"] for ex in exits if ex["rank"] is not None} | set(own) | set(waited)
    out: dict[str, Any] = {}
    for r in sorted(ranks):
        ex = next((e for e in exits if e["rank"] == r), None)
        tb = next((t for t in tracebacks if t["rank"] == r and t["role"] == "first_failure"), None) or \
            next((t for t in tracebacks if t["rank"] == r), None)
        ev = next((e for e in events if e["rank"] == r and e["severity"] in ("critical", "high")
                   and not e.get("survived")), None)
        state = ("dead" if r in dead else "failed" if r in own else "waiting" if r in waited
                 else "exited_cascade" if ex and ex.get("cascade") else "seen")
        out[str(r)] = {
            "state": state,
            "exitcode": ex["exitcode"] if ex else None,
            "signal": ex["signal"] if ex else "",
            "exception": f"{tb['exc_type']}: {tb['message']}"[:200] if tb else "",
            "first_error": ev["text"] if ev else "",
            "kinds": sorted(own.get(r, set()) | waited.get(r, set())),
        }
    return out
