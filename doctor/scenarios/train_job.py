"""A small, real distributed training job with injectable faults.

Run it under torchrun (see ``doctor.scenarios.job_command``)::

    python -m torch.distributed.run --nproc-per-node 4 doctor/scenarios/train_job.py --fault healthy

It trains a small MLP on CPU with the gloo backend: a real DataLoader over a synthetic Dataset with
a DistributedSampler, a real forward/backward, the gradients averaged across ranks by two
``all_reduce`` calls per step (two "buckets" of different sizes, like DDP's), and an SGD step.
``--fault NAME`` injects a real fault into one rank (``--fault-rank``) after a few healthy steps
(``--fault-step``). Nothing is simulated by sleeping in the collective: every hang below is a real
blocked system call, lock or collective.

Markers for tests (each is one ``write`` of a whole line, flushed):

    [mldoctor-scenario] rank R step S                        after every completed step
    [mldoctor-scenario] rank R fault=NAME injected at step S  when the fault is injected
    [mldoctor-scenario] rank R flight-recorder dump written to PATH (reason)

Flight recorder: with ``TORCH_FR_BUFFER_SIZE`` set (``job_command`` sets it) and ``MLDOCTOR_FR_DIR``
set, a daemon thread writes ``torch._C._distributed_c10d._dump_fr_trace()`` to
``$MLDOCTOR_FR_DIR/fr_rank<R>.pkl`` once the rank has made no progress for
``MLDOCTOR_FR_STALL_S`` seconds (default 5), like the watchdog's dump-on-timeout but sooner. A
Python signal handler could not do this: it never runs while the main thread is blocked in gloo. A
rank that gets an exception out of the training loop also writes its dump before re-raising.

This file is run as a script by the rank processes; it must not import mldoctor.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import os
import signal
import socket
import sys
import tempfile
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler

FAULTS = (
    "healthy",
    "extra_collective",
    "order_mismatch",
    "checkpoint_io",
    "dataloader_hang",
    "lock_self",
    "rank_exit",
    "rank0_exclusive",
    "slow_rank",
    "init_hang",
    "cpu_oversubscription",
    "dataloader_heavy",
    "host_sync",
    "compile_recompile",
    "checkpoint_sync",
)

IN_DIM, HIDDEN, N_CLASSES = 32, 128, 8


def say(line: str) -> None:
    """One line, one write(2), flushed: lines of different ranks never interleave mid-line."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def marker(rank: int, text: str) -> None:
    say(f"[mldoctor-scenario] rank {rank} {text}")


def die_with_parent(*_args) -> None:
    """Harness safety, not part of any fault: ask the kernel to SIGKILL this process when its
    parent dies (PR_SET_PDEATHSIG), so a launcher killed without cleanup (torchrun starts every
    rank in its own session) leaves no orphaned hung ranks or DataLoader workers behind.
    Also used as the DataLoader ``worker_init_fn`` (forked children do not inherit it)."""
    if os.environ.get("MLDOCTOR_KEEP_ORPHANS"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent is already gone
        os._exit(1)


# --------------------------------------------------------------------------------------------
# data


class SyntheticDataset(Dataset):
    """Deterministic synthetic classification data; item ``i`` is generated from seed ``i``.

    ``augment_cost`` > 0 adds real pure-Python CPU work per item (a slow input pipeline).
    ``cache_lock`` guards a small shared "feature cache" that a background thread refreshes; items
    read it under the lock (this is what the dataloader_hang fault turns into a deadlock).
    """

    def __init__(self, size: int, seed: int = 0):
        self.size = size
        self.seed = seed
        g = torch.Generator().manual_seed(1234)
        self.w_true = torch.randn(IN_DIM, N_CLASSES, generator=g)
        self.augment_cost = 0
        self.cache_lock = threading.Lock()
        self.feature_scale = {"scale": 1.0}

    def __len__(self) -> int:
        return self.size

    def _augment(self, x: torch.Tensor, idx: int) -> torch.Tensor:
        # Deliberately slow pure-Python "augmentation" (a hash chain), standing for a heavy
        # per-sample decode/tokenize step in an input pipeline.
        h = idx + 1
        for _ in range(self.augment_cost):
            h = (h * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        return x + (h % 7) * 1e-6

    def __getitem__(self, idx: int):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + idx)
        x = torch.randn(IN_DIM, generator=g)
        with self.cache_lock:
            scale = self.feature_scale["scale"]
        x = x * scale
        if self.augment_cost:
            x = self._augment(x, idx)
        y = int((x @ self.w_true).argmax())
        return x, y


class CacheRefresher(threading.Thread):
    """Background thread refreshing the dataset's feature cache under its lock.

    ``hold_once(seconds)`` makes the next refresh keep the lock for a long time (a slow refresh).
    """

    def __init__(self, dataset: SyntheticDataset):
        super().__init__(name="feature-cache-refresher", daemon=True)
        self.dataset = dataset
        self.hold_request = threading.Event()
        self.holding = threading.Event()
        self.hold_seconds = 0.0

    def hold_once(self, seconds: float) -> None:
        self.hold_seconds = seconds
        self.hold_request.set()

    def run(self) -> None:
        while True:
            self.hold_request.wait(timeout=0.5)
            with self.dataset.cache_lock:
                self.dataset.feature_scale = {"scale": 1.0}
                if self.hold_request.is_set():
                    self.hold_request.clear()
                    self.holding.set()
                    time.sleep(self.hold_seconds)  # slow refresh, lock held
                    self.holding.clear()


# --------------------------------------------------------------------------------------------
# metrics reporter (lock_self)


class MetricsReporter(threading.Thread):
    """Buffers metrics and pushes them to a "metrics server" in the background.

    The main thread calls ``record`` every step under ``lock``; the pusher thread takes the same
    lock to swap the buffer out and push it. ``stall_push()`` makes the next push wait for a reply
    from a server that never answers (a real blocking ``recv`` on a socket) while holding the lock.
    """

    def __init__(self):
        super().__init__(name="metrics-pusher", daemon=True)
        self.lock = threading.Lock()
        self.buffer: list[tuple[int, float]] = []
        self._stall = threading.Event()
        self.holding = threading.Event()
        # the "server" end is kept open and never written to
        self._client, self._server = socket.socketpair()

    def record(self, step: int, loss: float) -> None:
        with self.lock:
            self.buffer.append((step, loss))

    def stall_push(self) -> None:
        self._stall.set()

    def _push(self, batch: list[tuple[int, float]]) -> None:
        payload = repr(batch[-1:]).encode()
        if self._stall.is_set():
            self._client.sendall(payload)
            self.holding.set()
            self._client.recv(1)  # waits for an acknowledgement that never comes

    def run(self) -> None:
        while True:
            self._stall.wait(timeout=1.0)
            with self.lock:
                batch, self.buffer = self.buffer, []
                if batch or self._stall.is_set():
                    self._push(batch or [(-1, 0.0)])


# --------------------------------------------------------------------------------------------
# flight recorder dumps


class FlightRecorderDumper(threading.Thread):
    """Writes the flight-recorder dump once the rank has made no progress for ``stall_s``."""

    def __init__(self, rank: int, out_dir: str, stall_s: float):
        super().__init__(name="fr-dumper", daemon=True)
        self.rank = rank
        self.out_dir = out_dir
        self.stall_s = stall_s
        self.last_progress = time.monotonic()
        self.dumped_since_progress = False
        self.paused = False
        self._lock = threading.Lock()

    def progress(self, paused: bool = False) -> None:
        """Mark progress; ``paused=True`` stops the stall clock until the next ``progress()``
        (for known-local setup work, which on a loaded host can take longer than ``stall_s``)."""
        self.last_progress = time.monotonic()
        self.dumped_since_progress = False
        self.paused = paused

    def dump(self, reason: str) -> str | None:
        with self._lock:
            try:
                data = torch._C._distributed_c10d._dump_fr_trace()
            except Exception as e:  # noqa: BLE001 - report and go on, never kill the job
                marker(self.rank, f"flight-recorder dump failed ({reason}): {e!r}")
                return None
            os.makedirs(self.out_dir, exist_ok=True)
            path = os.path.join(self.out_dir, f"fr_rank{self.rank}.pkl")
            tmp = path + f".tmp{os.getpid()}"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
            marker(self.rank, f"flight-recorder dump written to {path} ({reason})")
            return path

    def run(self) -> None:
        while True:
            time.sleep(0.5)
            idle = time.monotonic() - self.last_progress
            if idle >= self.stall_s and not self.dumped_since_progress and not self.paused:
                self.dumped_since_progress = True
                self.dump(f"no progress for {idle:.1f}s")


# --------------------------------------------------------------------------------------------
# model and the step


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(IN_DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU()
        )
        self.head = nn.Linear(HIDDEN, N_CLASSES)

    def forward(self, x):
        return self.head(self.body(x))


def grad_buckets(model: MLP) -> list[list[torch.nn.Parameter]]:
    # Two buckets of different sizes, last layers first like DDP: head (1032) and body (20736).
    return [list(model.head.parameters()), list(model.body.parameters())]


def allreduce_bucket(params: list[torch.nn.Parameter], world: int) -> None:
    grads = [p.grad for p in params]
    flat = torch._utils._flatten_dense_tensors(grads)
    dist.all_reduce(flat)
    flat.div_(world)
    for g, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
        g.copy_(synced)


def allreduce_gradients(model: MLP, world: int, reverse: bool = False) -> None:
    buckets = grad_buckets(model)
    if reverse:
        buckets = buckets[::-1]
    for bucket in buckets:
        allreduce_bucket(bucket, world)


def sync_before_logging() -> None:
    # The bug of the extra_collective scenario: a barrier reached only by the logging rank.
    dist.barrier()


def save_checkpoint(path: str, model: MLP, opt: torch.optim.Optimizer, step: int) -> None:
    with open(path, "wb") as f:
        torch.save({"step": step, "model": model.state_dict(), "optim": opt.state_dict()}, f)


@torch.no_grad()
def evaluate(model: MLP, eval_x: torch.Tensor, eval_y: torch.Tensor, seconds: float) -> float:
    """A long evaluation pass (rank-0-only work in the rank0_exclusive scenario): forward passes
    over a held-out set and a per-sample confusion matrix computed in pure Python."""
    deadline = time.monotonic() + seconds if seconds > 0 else float("inf")
    confusion = [[0] * N_CLASSES for _ in range(N_CLASSES)]
    while time.monotonic() < deadline:
        for i in range(0, len(eval_x), 256):
            pred = model(eval_x[i : i + 256]).argmax(1)
            for p, t in zip(pred.tolist(), eval_y[i : i + 256].tolist(), strict=True):
                confusion[t][p] += 1
            if time.monotonic() >= deadline:
                break
    total = sum(map(sum, confusion))
    return sum(confusion[k][k] for k in range(N_CLASSES)) / max(total, 1)


def wait_for_dataset_ready(marker_path: str) -> None:
    """init_hang: this rank waits for a dataset-ready marker that never appears."""
    while not os.path.exists(marker_path):
        time.sleep(0.5)


# --------------------------------------------------------------------------------------------
# main


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fault", choices=FAULTS, default="healthy")
    p.add_argument("--fault-rank", type=int, default=None, help="rank that gets the fault")
    p.add_argument("--fault-step", type=int, default=3, help="step at which the fault starts")
    p.add_argument("--steps", type=int, default=0, help="stop after N steps (0: run until killed)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps-per-epoch", type=int, default=1000)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--log-every", type=int, default=10, help="human-readable log line interval")
    p.add_argument("--pg-timeout", type=float, default=1800.0, help="collective timeout (s)")
    p.add_argument(
        "--augment-cost", type=int, default=40000, help="slow_rank: hash rounds per item"
    )
    p.add_argument("--eval-seconds", type=float, default=0.0, help="rank0_exclusive: 0 = forever")
    p.add_argument(
        "--matmul-size",
        type=int,
        default=0,
        help="extra dense matmul per step (cpu_oversubscription)",
    )
    p.add_argument("--ckpt-every", type=int, default=10, help="checkpoint_sync: steps between saves")
    p.add_argument("--ckpt-mb", type=int, default=96, help="checkpoint_sync: extra state saved (MiB)")
    return p.parse_args(argv)


def per_sample_log(out: torch.Tensor, y: torch.Tensor, losses: torch.Tensor) -> list:
    """host_sync: per-sample predictions read back one value at a time with ``.item()`` (on a
    GPU every call waits for the device; ``.tolist()`` once per batch would be one transfer)."""
    pred = out.argmax(1)
    rows = []
    for i in range(len(y)):
        logits = [v.item() for v in out[i]]
        rows.append((pred[i].item(), y[i].item(), losses[i].item(), logits))
    return rows


def save_checkpoint_sync(path: str, model: MLP, opt: torch.optim.Optimizer, step: int,
                         extra: torch.Tensor) -> None:
    """checkpoint_sync: a blocking save (model, optimizer, a large extra state) with fsync."""
    with open(path, "wb") as f:
        torch.save({"step": step, "model": model.state_dict(), "optim": opt.state_dict(),
                    "ema_state": extra}, f)
        f.flush()
        os.fsync(f.fileno())


def main(argv=None) -> int:
    args = parse_args(argv)
    die_with_parent()
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    fault = args.fault
    fault_rank = args.fault_rank if args.fault_rank is not None else 0
    culprit = fault != "healthy" and rank == fault_rank
    scratch = os.environ.get("MLDOCTOR_SCRATCH_DIR") or os.path.join(
        tempfile.gettempdir(), f"mldoctor-scenario-{os.environ.get('MASTER_PORT', 'x')}"
    )
    if fault in ("checkpoint_io", "init_hang"):  # the only faults that touch the file system
        os.makedirs(scratch, exist_ok=True)
    torch.manual_seed(0)

    dumper = None
    if os.environ.get("MLDOCTOR_FR_DIR"):
        dumper = FlightRecorderDumper(
            rank, os.environ["MLDOCTOR_FR_DIR"], float(os.environ.get("MLDOCTOR_FR_STALL_S", "5"))
        )
        dumper.start()

    if fault == "init_hang" and culprit:
        marker(rank, f"fault={fault} injected at step 0")
        wait_for_dataset_ready(os.path.join(scratch, "dataset.ready"))

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.pg_timeout))
    if dumper:
        dumper.progress(paused=True)  # local setup follows; the clock restarts at the loop
    say(
        f"rank {rank}/{world}: process group ready (gloo), pid {os.getpid()}, "
        f"threads={torch.get_num_threads()}, fault={fault} on rank {fault_rank}"
    )

    dataset = SyntheticDataset(args.steps_per_epoch * args.batch_size * world)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader_kw = {}
    if args.num_workers > 0:
        loader_kw = {
            "num_workers": args.num_workers,
            "multiprocessing_context": "fork",
            "worker_init_fn": die_with_parent,
        }
    loader = DataLoader(
        dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True, **loader_kw
    )
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    refresher = CacheRefresher(dataset)
    refresher.start()
    metrics = MetricsReporter()
    metrics.start()
    ckpt_path = os.path.join(scratch, f"ckpt-rank{rank}.pt")
    big = torch.randn(args.matmul_size, args.matmul_size) if args.matmul_size else None
    forward = model
    if fault == "compile_recompile":
        # A Python int (the step) reaches a compiled function with dynamic=False: every new value
        # fails a guard and recompiles. The recompile limit (default 8, after which Dynamo falls
        # back to eager) is raised, as people do to silence the warning.
        import torch._dynamo as dynamo

        dynamo.config.recompile_limit = 1_000_000

        def scaled_forward(x, step_no):
            return model(x) * (1.0 + 1e-6 * step_no)

        compiled = torch.compile(scaled_forward, dynamic=False)
    ckpt_extra = None
    if fault == "checkpoint_sync":
        os.makedirs(scratch, exist_ok=True)
        ckpt_extra = torch.randn(args.ckpt_mb * 2**20 // 4)

    step = 0
    epoch = 0
    t_last = time.monotonic()
    if dumper:
        dumper.progress()  # setup done; the stall clock restarts here
    try:
        while True:
            sampler.set_epoch(epoch)
            at_fault = step == args.fault_step
            if culprit and fault == "dataloader_hang" and at_fault:
                # The refresher holds the cache lock while the new epoch's workers are forked: each
                # worker inherits a locked copy that no thread of the worker will ever release.
                refresher.hold_once(10.0)
                refresher.holding.wait()
                marker(rank, f"fault={fault} injected at step {step}")
            it = iter(loader)
            while True:
                t0 = time.monotonic()
                if fault == "cpu_oversubscription" and step == 0:
                    # every rank: OMP_NUM_THREADS well above this host's cores, big matmuls
                    marker(rank, f"fault={fault} injected at step {step}")
                if culprit and fault == "slow_rank" and step == args.fault_step:
                    dataset.augment_cost = args.augment_cost
                    marker(rank, f"fault={fault} injected at step {step}")
                if fault in ("dataloader_heavy", "host_sync", "compile_recompile",
                             "checkpoint_sync") and step == args.fault_step:
                    # every rank: the whole job has the problem (these run as 1-rank jobs)
                    if fault == "dataloader_heavy":
                        dataset.augment_cost = args.augment_cost
                    marker(rank, f"fault={fault} injected at step {step}")
                try:
                    x, y = next(it)
                except StopIteration:
                    break
                t1 = time.monotonic()
                if fault == "compile_recompile" and step >= args.fault_step:
                    out = compiled(x, step)
                else:
                    out = forward(x)
                loss = F.cross_entropy(out, y)
                if fault == "host_sync" and step >= args.fault_step:
                    per_sample_log(out, y, F.cross_entropy(out.detach(), y, reduction="none"))
                if big is not None:
                    loss = loss + 0.0 * (big @ big).mean()
                opt.zero_grad(set_to_none=False)
                loss.backward()
                t2 = time.monotonic()

                at_fault = step == args.fault_step
                if culprit and at_fault and fault == "extra_collective":
                    marker(rank, f"fault={fault} injected at step {step}")
                    sync_before_logging()
                if culprit and at_fault and fault == "rank_exit":
                    marker(rank, f"fault={fault} injected at step {step}")
                    say(f"rank {rank}: fatal error, exiting with status 1")
                    os._exit(1)
                reverse = culprit and at_fault and fault == "order_mismatch"
                if reverse:
                    marker(rank, f"fault={fault} injected at step {step}")
                if world > 1:  # a 1-rank job has nothing to average (gloo would still take ms)
                    allreduce_gradients(model, world, reverse=reverse)
                t3 = time.monotonic()
                opt.step()

                if culprit and at_fault and fault == "lock_self":
                    metrics.stall_push()
                    metrics.holding.wait()
                    marker(rank, f"fault={fault} injected at step {step}")
                metrics.record(step, loss.item())

                if at_fault and fault == "checkpoint_io":
                    # Every rank writes its checkpoint shard; the culprit's storage never drains.
                    if culprit:
                        if os.path.exists(ckpt_path):
                            os.unlink(ckpt_path)
                        os.mkfifo(ckpt_path)
                        # A reader that never reads: the write blocks once the pipe buffer is full.
                        _stuck_reader = os.open(ckpt_path, os.O_RDONLY | os.O_NONBLOCK)  # noqa: F841
                        marker(rank, f"fault={fault} injected at step {step}")
                    save_checkpoint(ckpt_path, model, opt, step)

                if fault == "checkpoint_sync" and step >= args.fault_step and step % args.ckpt_every == 0:
                    save_checkpoint_sync(ckpt_path, model, opt, step, ckpt_extra)

                if at_fault and fault == "rank0_exclusive":
                    if culprit:
                        marker(rank, f"fault={fault} injected at step {step}")
                        eval_set = SyntheticDataset(4096, seed=1)
                        eval_x = torch.stack([eval_set[i][0] for i in range(len(eval_set))])
                        eval_y = torch.tensor([eval_set[i][1] for i in range(len(eval_set))])
                        acc = evaluate(model, eval_x, eval_y, args.eval_seconds)
                        say(f"rank {rank}: eval accuracy {acc:.3f}")
                    dist.barrier()

                if dumper:
                    dumper.progress()
                marker(rank, f"step {step}")
                if args.log_every and step % args.log_every == 0:
                    now = time.monotonic()
                    say(
                        f"rank {rank} | step {step} | loss {loss.item():.4f} | data {t1 - t0:.3f}s "
                        f"| fwd/bwd {t2 - t1:.3f}s | allreduce {t3 - t2:.3f}s "
                        f"| wall {now - t_last:.3f}s/{args.log_every if step else 1} steps"
                    )
                    t_last = now
                step += 1
                if args.steps and step >= args.steps:
                    dist.barrier()
                    say(f"rank {rank}: finished {step} steps")
                    dist.destroy_process_group()
                    return 0
            epoch += 1
    except BaseException as e:
        say(
            f"rank {rank}: training loop failed at step {step}: {type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}"
        )
        if dumper:
            dumper.dump(f"exception at step {step}")
        raise


if __name__ == "__main__":
    sys.exit(main())
