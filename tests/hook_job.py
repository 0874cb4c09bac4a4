"""A tiny torchrun job (gloo, CPU) that installs mldoctor's hang hook, for tests/test_torch_hook.py.

Every rank all-reduces a tensor per step and calls ``mldoctor_hook.step()``; at ``--fault-step``
rank ``--fault-rank`` calls one extra ``dist.barrier()`` the others never call, so all ranks
block (the culprit in the barrier, the rest in the next all_reduce) and each rank's own watchdog
writes its dumps. Run as a script by torchrun; the test kills it when it has what it needs.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from doctor import torch as mldoctor_hook  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump-dir", required=True)
    ap.add_argument("--watchdog-s", type=float, default=3.0)
    ap.add_argument("--fault-rank", type=int, default=2)
    ap.add_argument("--fault-step", type=int, default=3)
    args = ap.parse_args()
    # harness safety: die with torchrun, so a killed launcher leaves no blocked rank behind
    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    mldoctor_hook.install(dump_dir=args.dump_dir, watchdog_s=args.watchdog_s, signal="SIGUSR2")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    x = torch.ones(64)
    for step in range(10_000):
        if rank == args.fault_rank and step == args.fault_step:
            print(f"[hook-job] rank {rank} extra barrier at step {step}", flush=True)
            dist.barrier()
        dist.all_reduce(x)
        x /= dist.get_world_size()
        mldoctor_hook.step()
        print(f"[hook-job] rank {rank} step {step}", flush=True)
        time.sleep(0.05)


if __name__ == "__main__":
    main()
