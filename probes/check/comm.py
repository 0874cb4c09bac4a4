"""Communication check: N local processes form a torch.distributed group, every rank reaches
every other (point-to-point), then an all_reduce sweep measures bus bandwidth per message size.

NCCL on GPUs (one process a GPU, when there are at least two), gloo on CPU otherwise. The ranks
run ``comm_worker.py`` in their own process sessions, so torch is never imported here and a rank
stuck in a collective is ended by its process group id when the time limit comes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from doctor.probes.check.result import FAILED, PASSED, MiB, result, skipped

WORKER = Path(__file__).with_name("comm_worker.py")

#: The largest message's bus bandwidth must reach this for the transport the node has. The
#: floors are deliberately far below what healthy hardware gives (H100/H200 NVLink all_reduce
#: reaches 300-480 GB/s busbw, PCIe Gen4/5 10-40 GB/s, gloo over loopback about 1 GB/s): they
#: catch a path that fell back to something much slower, not a few percent.
FLOOR_BPS = {"nvlink": 100e9, "pcie": 5e9, "loopback": 0.05e9}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_ranks(world: int, backend: str, sizes: list[int], iters: int, timeout: float) -> tuple[dict[str, Any] | None, str]:
    """Start the ranks, wait up to ``timeout``; rank 0's JSON, or None and why not."""
    port = _free_port()
    env = dict(os.environ)
    env.setdefault("NCCL_NVLS_ENABLE", "0")  # never multicast on shared hosts
    env.setdefault("OMP_NUM_THREADS", "1")
    procs = []
    for rank in range(world):
        cmd = [sys.executable, str(WORKER), str(rank), str(world), str(port), backend,
               ",".join(map(str, sizes)), str(iters)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                      start_new_session=True, text=True))
    deadline = time.monotonic() + timeout
    outs: list[tuple[str, str]] = [("", "")] * world
    timed_out = False
    for i, p in enumerate(procs):
        try:
            outs[i] = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            break
    if timed_out:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)  # the session we started for this rank
                except ProcessLookupError:
                    pass
        for p in procs:
            p.wait()
        return None, f"the {world} ranks did not finish within {timeout:.0f} s (a rank waits for a peer it cannot reach)"
    failed = [(i, p.returncode, outs[i][1]) for i, p in enumerate(procs) if p.returncode]
    if failed:
        i, code, err = failed[0]
        last = next((ln for ln in reversed(err.strip().splitlines()) if ln.strip()), "no error output")
        return None, f"rank {i} exited with {code}: {last[:300]}"
    for line in outs[0][0].splitlines():
        if line.startswith("{"):
            try:
                return json.loads(line), ""
            except json.JSONDecodeError:
                break
    return None, "rank 0 printed no result"


def run(n_gpus: int, nvlink: bool, quick: bool, nprocs: int | None = None) -> list[dict[str, Any]]:
    """Connectivity, then the bandwidth sweep; two records (``comm.connect``, ``comm.busbw``)."""
    t_conn, t_bw = "rank-to-rank connectivity", "all_reduce bus bandwidth"
    if importlib.util.find_spec("torch") is None:
        why = "torch is not installed in this Python (the check starts torch.distributed ranks)"
        return [skipped("comm.connect", "comm", t_conn, why), skipped("comm.busbw", "comm", t_bw, why)]
    if n_gpus >= 2:
        backend, world = "nccl", nprocs or n_gpus
        transport = "nvlink" if nvlink else "pcie"
    else:
        backend, world = "gloo", nprocs or (2 if quick else max(2, min(4, os.cpu_count() or 2)))
        transport = "loopback"
    sizes = [1 * MiB, 8 * MiB, 32 * MiB] if quick else [1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]
    if backend == "nccl":
        sizes = [s * 8 for s in sizes]  # GPUs need bigger messages to reach their plateau
    iters = 5 if quick else 20
    t0 = time.perf_counter()
    doc, why = _run_ranks(world, backend, sizes, iters, timeout=60.0 if quick else 240.0)
    took = time.perf_counter() - t0
    base = {"backend": backend, "world": world, "transport": transport}
    if doc is None:
        return [result("comm.connect", "comm", t_conn, FAILED, f"{backend} group of {world} local ranks failed: {why}",
                       cause="nccl_network_misconfig", value=base, seconds=took),
                skipped("comm.busbw", "comm", t_bw, "the ranks could not form a group")]
    missing = doc.get("missing_pairs") or []
    if missing:
        pairs = ", ".join(f"{a}->{b}" for a, b in missing[:8])
        conn = result("comm.connect", "comm", t_conn, FAILED, f"{len(missing)} rank pair(s) could not exchange data: {pairs}",
                      cause="nccl_network_misconfig", value={**base, "missing_pairs": missing}, seconds=took)
    else:
        conn = result("comm.connect", "comm", t_conn, PASSED,
                      f"all {world} {backend} ranks reached each other ({world * (world - 1)} directed pairs)",
                      value=base, seconds=took / 2)
    sweep = doc.get("sweep") or []
    if not sweep:
        return [conn, skipped("comm.busbw", "comm", t_bw, "no bandwidth measured")]
    top = sweep[-1]
    floor = FLOOR_BPS[transport]
    value = {**base, "sweep": sweep, "floor_busbw_Bps": floor, "busbw_Bps": top["busbw_Bps"]}
    curve = " / ".join(f"{s['busbw_Bps'] / 1e9:.2f}" for s in sweep)
    text = (f"{backend}, {world} ranks: busbw {top['busbw_Bps'] / 1e9:.2f} GB/s at {top['bytes'] / MiB:.0f} MiB "
            f"({curve} GB/s over the sweep)")
    if top["busbw_Bps"] < floor:
        bw = result("comm.busbw", "comm", t_bw, FAILED, f"{text}: below {floor / 1e9:g} GB/s expected over {transport}",
                    cause="nccl_slow_transport", value=value, seconds=took / 2)
    else:
        bw = result("comm.busbw", "comm", t_bw, PASSED, f"{text}; {transport} floor {floor / 1e9:g} GB/s", value=value,
                    seconds=took / 2)
    return [conn, bw]
