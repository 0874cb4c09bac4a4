"""Fault-injection scenarios: small real distributed PyTorch jobs with a known fault.

Plain data and a command builder only: this module is imported by the CLI (``mldoctor demo``)
and must not import torch. The job itself is ``train_job.py`` beside this file, run by torchrun
(``python -m torch.distributed.run``) with the gloo backend on CPU.

    argv, env = job_command("extra_collective")
    proc = subprocess.Popen(argv, env=env, start_new_session=True, stdout=PIPE, stderr=STDOUT)

Each rank prints ``[mldoctor-scenario] rank R step S`` after every step and
``[mldoctor-scenario] rank R fault=NAME injected at step S`` when its fault starts (see
``FAULT_LINE_RE`` / ``STEP_LINE_RE``), so callers can poll the launcher's output.
What each fault really does on torch 2.13 + gloo is recorded in
``tests/fixtures/evidence/README.md`` (captured by ``tests/fixtures/capture.py``).
"""

from __future__ import annotations

import os
import re
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

TRAIN_JOB = Path(__file__).resolve().with_name("train_job.py")

#: ``[mldoctor-scenario] rank 1 fault=extra_collective injected at step 3``
FAULT_LINE_RE = re.compile(r"\[mldoctor-scenario\] rank (\d+) fault=(\w+) injected at step (\d+)")
#: ``[mldoctor-scenario] rank 0 step 12``
STEP_LINE_RE = re.compile(r"\[mldoctor-scenario\] rank (\d+) step (\d+)[ \t]*$", re.MULTILINE)
#: ``[mldoctor-scenario] rank 2 flight-recorder dump written to /x/fr_rank2.pkl (reason)``
FR_LINE_RE = re.compile(r"\[mldoctor-scenario\] rank (\d+) flight-recorder dump written to (\S+)")

STATES = ("hung", "crashed", "slow", "healthy")


@dataclass(frozen=True)
class Scenario:
    """One injectable fault and the diagnosis mldoctor should reach for it."""

    name: str
    description: str  # one line: what the fault is
    state: str  # expected job state: hung | crashed | slow | healthy
    cause: str | None  # expected cause id from taxonomy.yaml (None: nothing wrong)
    culprit_ranks: list[int] = field(default_factory=list)
    nproc: int = 4
    fault_rank: int | None = None  # rank the fault is injected into (None: no single rank)
    fault_step: int = 3
    job_args: tuple[str, ...] = ()  # extra train_job.py arguments
    env: tuple[tuple[str, str], ...] = ()  # extra environment for the ranks
    also_acceptable: tuple[str, ...] = ()  # other cause ids that are a correct diagnosis too
    notes: str = ""  # what really happens (torch 2.13, gloo, CPU)

    def fault_argv(self) -> list[str]:
        argv = ["--fault", self.name, "--fault-step", str(self.fault_step)]
        if self.fault_rank is not None:
            argv += ["--fault-rank", str(self.fault_rank)]
        return argv + list(self.job_args)


_ALL = [
    Scenario(
        name="healthy",
        description="No fault: 4 ranks train the MLP until killed (or --steps N).",
        state="healthy",
        cause=None,
        notes="Stacks are a mix of forward/backward, DataLoader and all_reduce; steps advance.",
    ),
    Scenario(
        name="extra_collective",
        description="Rank 1 calls one extra dist.barrier() (a logging-only sync) that the other ranks never call.",
        state="hung",
        cause="collective_mismatch",
        culprit_ranks=[1],
        fault_rank=1,
        notes="Hangs until the collective timeout (30 min): rank 1's main thread in barrier <- "
        "sync_before_logging, ranks 0,2,3 in all_reduce <- allreduce_bucket. Flight recorder: "
        "collective_seq_id 7 is gloo:barrier on rank 1 and gloo:all_reduce [[1032]] on 0,2,3; "
        "every rank last_enqueued 7, last_completed 6. (An extra all_reduce of another size would "
        "crash instead, like order_mismatch.)",
    ),
    Scenario(
        name="order_mismatch",
        description="Rank 2 all_reduces its two gradient buckets (1032 and 20736 floats) in reverse order.",
        state="crashed",
        cause="collective_mismatch",
        culprit_ranks=[2],
        fault_rank=2,
        notes="Crashes at once, and the process that dies is a victim: rank 1 (receiving rank 2's "
        'bigger chunk) aborts with "terminate called after throwing an instance of '
        "'gloo::EnforceNotMet' ... op.preamble.length <= op.nbytes. 10368 vs 516. Received data "
        "size doesn't match expected size. Is there a distributed collective mismatch in your "
        "code?\" (SIGABRT, exitcode -6), so torchrun's 'Root Cause (first observed failure)' names "
        "rank 1, not 2. Ranks 0 and 2 raise 'Connection reset by peer' and write flight-recorder "
        "dumps, which show the mismatch: seq 7 is all_reduce [[20736]] on rank 2 and [[1032]] on "
        "rank 0. Rank 3 is SIGTERMed by torchrun before it logs anything. Same result in 3 runs.",
    ),
    Scenario(
        name="checkpoint_io",
        description="Every rank saves a checkpoint at step 3; rank 2's target is a FIFO nobody drains, so its torch.save write blocks in the kernel.",
        state="hung",
        cause="rank_stuck_in_io",
        culprit_ranks=[2],
        fault_rank=2,
        notes="Rank 2's main thread: _save (torch/serialization.py, the zip_file.write_record line) "
        "<- save <- save_checkpoint, blocked in write(2) on a full pipe (GIL released: its "
        "flight-recorder thread still dumps). Ranks 0,1,3 wrote their checkpoint and wait in the "
        "next step's all_reduce; rank 2's flight recorder has one collective fewer (8 vs 9).",
    ),
    Scenario(
        name="dataloader_hang",
        description="Rank 3 forks its DataLoader workers while a background thread holds the dataset's cache lock; the workers inherit a locked lock and block forever.",
        state="hung",
        cause="dataloader_worker_deadlock",
        culprit_ranks=[3],
        fault_rank=3,
        job_args=("--num-workers", "2", "--steps-per-epoch", "3"),
        also_acceptable=("rank_stuck_in_dataloader",),
        notes="Rank 3's main thread waits on the worker result queue: select <- "
        "multiprocessing wait/poll <- Queue.get <- _try_get_data <- _get_data <- _next_data <- "
        "__next__ <- main. Its 2 worker processes block in SyntheticDataset.__getitem__ on the "
        "'with self.cache_lock' line (a lock copied locked by fork; their stacks also show the "
        "parent's frames down to the fork). Ranks 0,1,2 wait in all_reduce. From the rank stacks "
        "alone the answer is rank_stuck_in_dataloader; the worker stacks show the deadlock.",
    ),
    Scenario(
        name="lock_self",
        description="Rank 1's main thread blocks on a threading.Lock held by its own metrics-pusher thread, which waits forever for a server reply.",
        state="hung",
        cause="rank_stuck_in_lock",
        culprit_ranks=[1],
        fault_rank=1,
        notes="Rank 1's main thread idle in MetricsReporter.record (the 'with self.lock' line) "
        "<- main; --native shows PyThread_acquire_lock_timed under it. Its thread "
        "'metrics-pusher' holds the lock, idle in MetricsReporter._push (native: recv in libc). "
        "Ranks 0,2,3 in all_reduce <- allreduce_bucket.",
    ),
    Scenario(
        name="rank_exit",
        description="Rank 2 exits with status 1 (os._exit) at step 3 while the others go on to the all_reduce.",
        state="crashed",
        cause="rank_process_dead",
        culprit_ranks=[2],
        fault_rank=2,
        notes="Rank 2 prints 'fatal error, exiting with status 1' and is gone. Survivors raise "
        "at once from gloo ('Connection reset by peer' or 'Connection closed by peer ... This is "
        "typically caused by a remote worker crashing'; in the runs seen, ranks 3 and sometimes 1) "
        "and write flight-recorder dumps; torchrun's Root Cause names rank 2 (exitcode 1, "
        "error_file <N/A>) and SIGTERMs the rest (-15) within ~0.1 s, often before they log. "
        "Nothing stays hung, so there are no stacks: the evidence is torchrun.log and the FR dumps.",
    ),
    Scenario(
        name="rank0_exclusive",
        description="Rank 0 runs a long evaluation pass alone while ranks 1-3 wait in the dist.barrier() after it.",
        state="hung",
        cause="rank_outside_collective",
        culprit_ranks=[0],
        fault_rank=0,
        notes="Rank 0's main thread is active (owns the GIL) in evaluate <- decorate_context <- "
        "main (a forward pass and a pure-Python confusion matrix); ranks 1,2,3 idle in barrier "
        "<- main. Flight recorder: ranks 1-3 have seq 9 gloo:barrier pending, rank 0 stops at 8. "
        "It is 'hung' only from the others' view: with --eval-seconds N it recovers.",
    ),
    Scenario(
        name="slow_rank",
        description="From step 3, rank 3's dataset does heavy pure-Python work per item (num_workers=0), so every step waits for rank 3.",
        state="slow",
        cause="straggler_rank",
        culprit_ranks=[3],
        fault_rank=3,
        also_acceptable=("dataloader_starvation",),
        notes="The job progresses at about 5 steps/s instead of about 45: rank 3's main thread is "
        "active in SyntheticDataset._augment <- __getitem__ <- fetch <- _next_data <- __next__ <- "
        "main; ranks 0,1,2 idle in all_reduce. The timing lines show it ('rank 3 | ... | data "
        "0.147s | ... | allreduce 0.013s' vs the others' 'data 0.001s ... allreduce 0.157s'). One "
        "snapshot looks like a dataloader hang; progress (step lines) tells slow from hung.",
    ),
    Scenario(
        name="init_hang",
        description="Rank 3 waits for a dataset-ready marker file that never appears, before init_process_group.",
        state="hung",
        cause="init_hang",
        culprit_ranks=[3],
        fault_rank=3,
        fault_step=0,
        notes="Rank 3's main thread idle in wait_for_dataset_ready <- main (time.sleep polling a "
        "marker file); ranks 0,1,2 idle in _new_process_group_helper <- init_process_group <- "
        "main (constructing ProcessGroupGloo, which waits in the store for rank 3). No step line, "
        "no 'process group ready' line; the flight-recorder dumps are empty (no process group).",
    ),
    Scenario(
        name="cpu_oversubscription",
        description="Every rank runs with OMP_NUM_THREADS=8 on this host and adds a 512x512 matmul per step.",
        state="slow",
        cause="cpu_oversubscription",
        culprit_ranks=[0, 1, 2, 3],
        fault_rank=None,
        fault_step=0,
        job_args=("--matmul-size", "512"),
        env=(("OMP_NUM_THREADS", "8"),),
        notes="4 ranks x 8 OpenMP threads on a 2-core host; no single culprit rank (the host). "
        "fwd/bwd takes about 0.2 s per step; stacks show ranks active in forward/loss or idle in "
        "all_reduce. Evidence: OMP_NUM_THREADS=8 in env-rank*.txt and this host's core count.",
    ),
    Scenario(
        name="dataloader_heavy",
        description="A 1-rank job whose DataLoader (num_workers=0) does heavy pure-Python work per item in the main process.",
        state="slow",
        cause="dataloader_starvation",
        culprit_ranks=[0],
        nproc=1,
        fault_step=0,
        job_args=("--augment-cost", "20000"),
        notes="Single-process loading: the main thread spends most of each step in "
        "SyntheticDataset._augment <- __getitem__ <- fetch <- _next_data <- __next__ <- main.",
    ),
    Scenario(
        name="host_sync",
        description="A 1-rank job that reads per-sample predictions back with .item() every step (one host-device sync per value on a GPU).",
        state="slow",
        cause="host_sync_in_loop",
        culprit_ranks=[0],
        nproc=1,
        fault_step=0,
        notes="per_sample_log calls .item() 11 times per sample (352 per step). On the CPU there is "
        "no device to wait for, so each call costs only dispatch overhead; the samples show the "
        "main thread on the .item() line. On a GPU each call also waits for the queued kernels.",
    ),
    Scenario(
        name="compile_recompile",
        description="A 1-rank job passes the step number (a Python int) to a torch.compile'd function with dynamic=False, so it recompiles every step (recompile limit raised).",
        state="slow",
        cause="torch_compile_recompiles",
        culprit_ranks=[0],
        nproc=1,
        fault_step=0,
        env=(("TORCH_LOGS", "recompiles"),),
        notes="First compile about 8 s on 2 cores (inductor C++), then 0.3-1 s per step, almost all "
        "in torch/_dynamo and torch/_inductor frames. With the default recompile_limit (8) Dynamo "
        "would fall back to eager after 8 steps; TORCH_LOGS=recompiles prints every guard failure.",
    ),
    Scenario(
        name="checkpoint_sync",
        description="A 1-rank job saves a ~100 MB checkpoint synchronously (torch.save + fsync) every 10 steps.",
        state="slow",
        cause="checkpoint_stall",
        culprit_ranks=[0],
        nproc=1,
        fault_step=0,
        job_args=("--ckpt-every", "10", "--ckpt-mb", "96"),
        notes="Every 10th step is much longer: the main thread is in torch.save "
        "(torch/serialization.py) <- save_checkpoint_sync <- main, then in fsync.",
    ),
]

SCENARIOS: dict[str, Scenario] = {s.name: s for s in _ALL}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0 and let the kernel pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def job_command(
    name: str, nproc: int | None = None, extra_env: dict[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """The torchrun command line and environment for scenario ``name``.

    The environment is a full copy of ``os.environ`` with the scenario's settings on top:
    ``OMP_NUM_THREADS=1`` (unless the scenario sets its own), ``TORCH_FR_BUFFER_SIZE=2000``
    (flight recorder on), ``PYTHONUNBUFFERED=1``, then the scenario's env, then ``extra_env``
    (e.g. ``MLDOCTOR_FR_DIR`` for flight-recorder dumps, ``MLDOCTOR_SCRATCH_DIR``).
    torchrun starts every rank in its own session, so killing torchrun's process group alone
    does not reach the ranks; train_job.py therefore sets PR_SET_PDEATHSIG on each rank and
    DataLoader worker: once torchrun is gone (even by SIGKILL), the ranks and workers are killed
    too. Set ``MLDOCTOR_KEEP_ORPHANS=1`` to turn that off.
    """
    try:
        sc = SCENARIOS[name]
    except KeyError:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}") from None
    n = int(nproc if nproc is not None else sc.nproc)
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(n),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(TRAIN_JOB),
        *sc.fault_argv(),
    ]
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "TORCH_FR_BUFFER_SIZE": "2000", "PYTHONUNBUFFERED": "1"})
    env.update(dict(sc.env))
    if extra_env:
        env.update(extra_env)
    if env.get("MLDOCTOR_SCRATCH_DIR") and "TORCHINDUCTOR_CACHE_DIR" not in (extra_env or {}):
        # A job killed while Inductor writes a compiled module can leave a truncated .so in the
        # shared cache that crashes the next run ("file too short"): each run gets its own.
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(env["MLDOCTOR_SCRATCH_DIR"], "inductor-cache")
    return argv, env


__all__ = [
    "SCENARIOS",
    "Scenario",
    "job_command",
    "free_port",
    "TRAIN_JOB",
    "FAULT_LINE_RE",
    "STEP_LINE_RE",
    "FR_LINE_RE",
    "STATES",
]
