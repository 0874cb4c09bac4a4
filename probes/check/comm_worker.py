"""One rank of the communication check, started by ``doctor.probes.check.comm`` as a plain
script (``python comm_worker.py RANK WORLD PORT BACKEND SIZES ITERS``). It imports torch, so the
core never imports this module; rank 0 prints one JSON line with what every rank saw.

1. Connectivity: every rank sends a small tensor to every other rank and receives one from each
   (point-to-point, so a rank that can reach the store but not one peer is named by the pair).
2. Bandwidth: all_reduce over each message size; time the slowest rank (the collective is only
   as fast as it), then algbw = bytes / time and busbw = algbw * 2(n-1)/n, the ring-equivalent
   figure nccl-tests reports, comparable across world sizes.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta


def main(argv: list[str]) -> int:
    import torch
    import torch.distributed as dist

    rank, world, port, backend = int(argv[0]), int(argv[1]), int(argv[2]), argv[3]
    sizes = [int(s) for s in argv[4].split(",") if s]
    iters = int(argv[5])
    device = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    # -- connectivity: every ordered pair, both directions
    reached = []
    send = [torch.full((4,), float(rank), device=device) for _ in range(world)]
    recv = [torch.zeros(4, device=device) for _ in range(world)]
    ops = []
    for peer in range(world):
        if peer != rank:
            ops.append(dist.P2POp(dist.isend, send[peer], peer))
            ops.append(dist.P2POp(dist.irecv, recv[peer], peer))
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()
    if backend == "nccl":
        torch.cuda.synchronize()
    for peer in range(world):
        if peer != rank and float(recv[peer][0]) == float(peer):
            reached.append(peer)
    # -- bandwidth sweep
    sweep = []
    for size in sizes:
        n = max(1, size // 4)
        buf = torch.ones(n, dtype=torch.float32, device=device)
        for _ in range(2):
            dist.all_reduce(buf)
        if backend == "nccl":
            torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        if backend == "nccl":
            torch.cuda.synchronize()
        took = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        t = float(took[0])
        algbw = n * 4 / t
        sweep.append({"bytes": n * 4, "time_s": t, "algbw_Bps": algbw, "busbw_Bps": algbw * 2 * (world - 1) / world})
    # -- gather what each rank reached on rank 0
    counts = torch.zeros(world * world, dtype=torch.int32, device=device)
    for peer in reached:
        counts[rank * world + peer] = 1
    dist.all_reduce(counts)
    if rank == 0:
        matrix = counts.view(world, world).tolist()
        missing = [[a, b] for a in range(world) for b in range(world) if a != b and not matrix[a][b]]
        print(json.dumps({"world": world, "backend": backend, "missing_pairs": missing, "sweep": sweep,
                          "torch": torch.__version__}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
