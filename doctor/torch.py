"""In-job helpers for mldoctor: a step timer, and a hang hook that leaves stacks behind.

Both are opt-in and cost two lines in a training script; neither imports torch at import time
(so ``mldoctor --help`` never pays for it) and nothing here changes what the job computes.

**Hang hook** (``install`` / ``step``): mldoctor's live mode needs ptrace (py-spy); many clusters
grant none. A job that installs the hook writes its own evidence instead::

    from doctor import torch as mldoctor_hook
    mldoctor_hook.install(dump_dir="/tmp/mldoctor-dumps", watchdog_s=300)
    ...
    mldoctor_hook.step()                     # once per training step

Each rank then writes faulthandler dumps of all its threads to
``<dump_dir>/faulthandler-rank<RANK>.txt`` when it receives the signal (SIGUSR2 by default) and
when ``step()`` has not been called for ``watchdog_s`` seconds (again every ``watchdog_s`` while
the stall lasts, up to ``max_dumps`` times). ``mldoctor diagnose --from <dump_dir>`` reads the
folder: the stacks kind takes the rank from the file name, and repeated dumps of one stall are
its snapshots (frozen stacks: hung). ``debug_server=True`` also starts torch's distributed debug
server (``torch.distributed.debug.start_debug_server``) when torch and its packages are there.
Trade-offs are in the README ("In-job hook"); the implementation is ``_HangHook`` below.

**Step timer** (``StepTimer``): per-step data wait, step time and GC time, written as JSONL.

A sampling window (``mldoctor diagnose --symptom slow``) needs no change to the job; this helper
is for jobs that can take two lines of code and want exact numbers every step, for the whole
run, at a cost of a few microseconds per step::

    from doctor.torch import StepTimer

    timer = StepTimer()                      # $MLDOCTOR_STEPS_DIR/steps-rank<RANK>.jsonl
    timer.attach(optimizer)                  # a step ends after every optimizer.step()
    for batch in timer.wrap(loader):         # time inside next(loader) is data wait
        loss = model(batch).mean()
        loss.backward()
        optimizer.step()
        if step % 1000 == 0:
            with timer.phase("checkpoint"):  # optional: name the phases you care about
                torch.save(state, path)

Without ``attach`` call ``timer.step()`` at the end of each step. The file starts with a header
line (``"schema": "mldoctor.steps/1"``, rank, world size, host, pid) followed by one record per
step: ``step``, ``t`` (wall clock), ``step_time``, ``data_time``, ``gc_time``, ``gc_collections``,
``phases`` (seconds per named phase) and ``compiles`` (graphs torch.compile built so far). Give
the folder to ``mldoctor diagnose --from`` (or ``--logs``) and the samples evidence kind reads it.

The timer never imports torch itself (it reads ``torch._dynamo``'s counters only when the job
already imported it).
"""

from __future__ import annotations

import atexit
import faulthandler
import gc
import importlib.util
import json
import os
import signal as _signal
import socket
import sys
import threading
import time
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SCHEMA = "mldoctor.steps/1"


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _compiled_graphs() -> int:
    """Graphs torch.compile has built in this process (0 when Dynamo is not loaded)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None) if utils is not None else None
    try:
        return int(counters["stats"]["unique_graphs"]) if counters is not None else 0
    except (KeyError, TypeError, ValueError):
        return 0


class StepTimer:
    """Times each training step and the parts of it the job can name.

    Data wait is the time spent inside ``next()`` of the wrapped iterable; GC time comes from
    ``gc.callbacks``; a step ends at ``step()`` (or after each ``optimizer.step()`` once
    ``attach``-ed). Records are buffered and flushed every ``flush_every_s`` seconds, at
    ``close()`` and at interpreter exit, so the hot loop never waits for the disk.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, rank: int | None = None,
                 flush_every_s: float = 2.0, track_gc: bool = True) -> None:
        self.rank = _env_int("RANK", 0) if rank is None else int(rank)
        if path is None:
            folder = Path(os.environ.get("MLDOCTOR_STEPS_DIR") or "mldoctor-steps")
            path = folder / f"steps-rank{self.rank}.jsonl"
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.flush_every_s = float(flush_every_s)
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        header = {"schema": SCHEMA, "rank": self.rank, "world_size": _env_int("WORLD_SIZE", 1),
                  "local_rank": _env_int("LOCAL_RANK", 0), "host": socket.gethostname(),
                  "pid": os.getpid(), "started": time.time()}
        self._fh.write(json.dumps(header) + "\n")
        self._fh.flush()
        self._buf: list[str] = []
        self._last_flush = time.monotonic()
        self._step_no = 0
        self._t_step = time.perf_counter()
        self._data = 0.0
        self._gc = 0.0
        self._gc_n = 0
        self._gc_t0 = 0.0
        self._phases: dict[str, float] = {}
        self._hooks: list[Any] = []
        self._closed = False
        self._track_gc = track_gc
        if track_gc:
            gc.callbacks.append(self._on_gc)
        atexit.register(self.close)

    # -- GC ---------------------------------------------------------------------------------
    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        elif phase == "stop" and self._gc_t0:
            self._gc += time.perf_counter() - self._gc_t0
            self._gc_n += 1
            self._gc_t0 = 0.0

    # -- what the job calls -----------------------------------------------------------------
    def wrap(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Yield from ``iterable`` (a DataLoader), counting the time inside ``next()`` as data
        wait. The first ``next()`` restarts the step clock, so set-up time is not a step."""
        it = iter(iterable)
        first = True
        while True:
            t0 = time.perf_counter()
            if first:
                self._t_step = t0
                first = False
            try:
                item = next(it)
            except StopIteration:
                return
            self._data += time.perf_counter() - t0
            yield item

    def attach(self, optimizer: Any) -> Any:
        """End a step after every ``optimizer.step()`` (torch's step post-hook); returns the
        hook handle (``handle.remove()`` detaches it)."""
        handle = optimizer.register_step_post_hook(lambda *_a, **_k: self.step())
        self._hooks.append(handle)
        return handle

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a named part of the step (``checkpoint``, ``eval``, ``logging``)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._phases[name] = self._phases.get(name, 0.0) + time.perf_counter() - t0

    def step(self) -> None:
        """End the current step: write its record (buffered) and start the next one."""
        if self._closed:
            return
        now = time.perf_counter()
        rec: dict[str, Any] = {"step": self._step_no, "t": round(time.time(), 3),
                               "step_time": round(now - self._t_step, 6), "data_time": round(self._data, 6)}
        if self._track_gc:
            rec["gc_time"] = round(self._gc, 6)
            rec["gc_collections"] = self._gc_n
        if self._phases:
            rec["phases"] = {k: round(v, 6) for k, v in self._phases.items()}
        graphs = _compiled_graphs()
        if graphs:
            rec["compiles"] = graphs
        self._buf.append(json.dumps(rec))
        self._step_no += 1
        self._t_step = now
        self._data = self._gc = 0.0
        self._gc_n = 0
        self._phases = {}
        if time.monotonic() - self._last_flush >= self.flush_every_s:
            self.flush()

    def flush(self) -> None:
        if self._buf and not self._closed:
            self._fh.write("\n".join(self._buf) + "\n")
            self._fh.flush()
            self._buf.clear()
        self._last_flush = time.monotonic()

    def close(self) -> None:
        """Flush and stop timing (idempotent; also runs at interpreter exit)."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        if self._track_gc and self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        for h in self._hooks:
            h.remove()
        self._fh.close()
        atexit.unregister(self.close)

    def __enter__(self) -> StepTimer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()




# -- hang hook ------------------------------------------------------------------------------------

#: Packages torch's debug server imports besides torch (its docstring names aiohttp and Jinja2;
#: its text tables need tabulate). Checked by spec, so a missing one is a warning, not a crash
#: half-way through starting the server.
DEBUG_SERVER_PACKAGES = ("torch", "aiohttp", "jinja2", "tabulate")


class _HangHook:
    """One process's hook: the open dump file, the signal registration and the watchdog thread.

    The file stays open for the life of the process because faulthandler writes to a file
    descriptor from a signal handler, where opening a file is not safe; the watchdog uses the
    same descriptor so that all of a rank's dumps land in one file, in order.
    """

    def __init__(self, dump_dir: str | os.PathLike[str] | None, *, watchdog_s: float | None,
                 signal: str | int | None, max_dumps: int, rank: int | None) -> None:
        self.rank = _env_int("RANK", 0) if rank is None else int(rank)
        folder = Path(dump_dir or os.environ.get("MLDOCTOR_DUMP_DIR") or "mldoctor-dumps")
        folder.mkdir(parents=True, exist_ok=True)
        self.dump_dir = folder
        # the rank in the file name is how the stacks kind assigns dumps to ranks (Hints.from_path)
        self.path = folder / f"faulthandler-rank{self.rank}.txt"
        self._fh = open(self.path, "w", encoding="utf-8", buffering=1)  # noqa: SIM115 - closed in close()
        self._lock = threading.Lock()
        self.watchdog_s = float(watchdog_s) if watchdog_s else None
        self.max_dumps = int(max_dumps)
        self.steps = 0
        self.dumps = 0
        self._last = time.monotonic()
        self._stop = threading.Event()
        self.signum: int | None = None
        self._thread: threading.Thread | None = None
        if signal is not None:
            self.signum = _signum(signal)
            # chain only onto a real previous handler: chaining onto SIG_DFL re-raises the signal
            # with its default action, which for SIGUSR1/SIGUSR2 terminates the process
            prev = _signal.getsignal(self.signum)
            faulthandler.register(self.signum, file=self._fh, all_threads=True,
                                  chain=prev not in (_signal.SIG_DFL, _signal.SIG_IGN))
        if self.watchdog_s:
            self._thread = threading.Thread(target=self._watch, name="mldoctor-watchdog", daemon=True)
            self._thread.start()
        atexit.register(self.close)

    def step(self) -> None:
        # the hot path: an increment and a clock read; the watchdog thread does everything else
        self.steps += 1
        self._last = time.monotonic()

    def _watch(self) -> None:
        """Dump once a stall reaches ``watchdog_s``, then every ``watchdog_s`` while it lasts (two
        or more dumps of one stall are what tells hung from slow), at most ``max_dumps`` per
        stall. It only reads and writes; it never signals or stops anything."""
        assert self.watchdog_s is not None
        poll = min(max(self.watchdog_s / 10.0, 0.05), 5.0)
        stall_step = -1
        in_stall = 0
        last_dump = 0.0
        while not self._stop.wait(poll):
            now = time.monotonic()
            idle = now - self._last
            if idle < self.watchdog_s:
                continue
            if self.steps != stall_step:
                stall_step, in_stall, last_dump = self.steps, 0, 0.0
            if in_stall >= self.max_dumps or (in_stall and now - last_dump < self.watchdog_s):
                continue
            self.dump(f"watchdog: no step() for {idle:.1f} s (steps so far: {self.steps})")
            in_stall += 1
            last_dump = now

    def dump(self, reason: str) -> None:
        """Write a one-line header (rank, pid, host, why) and a faulthandler dump of all threads."""
        with self._lock:
            if self._fh.closed:
                return
            self._fh.write(f"mldoctor-hook: rank {self.rank} pid {os.getpid()} host {socket.gethostname()} "
                           f"at {time.strftime('%Y-%m-%dT%H:%M:%S')}: {reason}\n")
            self._fh.flush()
            faulthandler.dump_traceback(file=self._fh, all_threads=True)
            self.dumps += 1

    def close(self) -> None:
        """Stop the watchdog, unregister the signal and close the file (idempotent)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        if self.signum is not None:
            faulthandler.unregister(self.signum)
            self.signum = None
        with self._lock:
            if not self._fh.closed:
                self._fh.close()
        atexit.unregister(self.close)


_HOOK: _HangHook | None = None


def _signum(sig: str | int) -> int:
    if isinstance(sig, int):
        return sig
    name = sig.upper() if sig.upper().startswith("SIG") else "SIG" + sig.upper()
    try:
        return int(getattr(_signal, name))
    except AttributeError:
        raise ValueError(f"unknown signal {sig!r}") from None


def install(dump_dir: str | os.PathLike[str] | None = None, *, watchdog_s: float | None = 300.0,
            signal: str | int | None = "SIGUSR2", debug_server: bool = False, max_dumps: int = 3,
            rank: int | None = None, debug_server_port: int = 25999) -> _HangHook:
    """Install the hang hook in this process (once; a second call returns the first hook).

    ``dump_dir`` (default ``$MLDOCTOR_DUMP_DIR`` or ``./mldoctor-dumps``) receives
    ``faulthandler-rank<RANK>.txt``, truncated at install: one file describes one process.
    ``watchdog_s=None`` turns the watchdog off, ``signal=None`` the signal handler. The watchdog's
    clock starts at ``install``, so set-up (process group, first compile) counts as the first
    step: give ``watchdog_s`` room for it. ``debug_server=True`` starts torch's distributed debug
    server (all ranks; the HTTP frontend on rank 0 at ``debug_server_port``) with periodic
    dumps under ``<dump_dir>/debug_server``; it needs torch.distributed's rendezvous environment
    (torchrun sets it), and when a package it needs is missing the hook warns and goes on without.
    """
    global _HOOK
    if _HOOK is not None:
        return _HOOK
    _HOOK = _HangHook(dump_dir, watchdog_s=watchdog_s, signal=signal, max_dumps=max_dumps, rank=rank)
    if debug_server:
        start_debug_server(_HOOK.dump_dir / "debug_server", port=debug_server_port)
    return _HOOK


def step() -> None:
    """Tell the watchdog a training step finished (a no-op when the hook is not installed)."""
    hook = _HOOK
    if hook is not None:
        hook.step()


def dump_now(reason: str = "requested by the job") -> None:
    """Write a dump right away (the job's own code decided something looks wrong)."""
    if _HOOK is not None:
        _HOOK.dump(reason)


def uninstall() -> None:
    """Undo ``install``: stop the watchdog, unregister the signal, close the file."""
    global _HOOK
    if _HOOK is not None:
        _HOOK.close()
        _HOOK = None


def start_debug_server(dump_dir: str | os.PathLike[str] | None = None, *, port: int = 25999) -> bool:
    """Start torch's distributed debug server if torch and its packages are importable; return
    whether it started. Missing packages give a warning naming them, never an exception: the
    hook is a diagnostic aid and must not be the reason a training job fails to start."""
    missing = [m for m in DEBUG_SERVER_PACKAGES if importlib.util.find_spec(m) is None]
    if not missing and importlib.util.find_spec("torch.distributed.debug") is None:
        missing = ["torch.distributed.debug (this torch version has no debug server)"]
    if missing:
        warnings.warn("mldoctor hook: torch's debug server not started; missing: " + ", ".join(missing),
                      RuntimeWarning, stacklevel=2)
        return False
    from torch.distributed.debug import start_debug_server as _start  # lazy: torch only here

    kwargs: dict[str, Any] = {"port": port}
    if dump_dir is not None:
        Path(dump_dir).mkdir(parents=True, exist_ok=True)
        kwargs["dump_dir"] = str(dump_dir)
    try:
        _start(**kwargs)
    except Exception as e:  # noqa: BLE001 - any failure is reported, never raised into the job
        warnings.warn(f"mldoctor hook: torch's debug server did not start: {e}", RuntimeWarning, stacklevel=2)
        return False
    return True


__all__ = ["StepTimer", "SCHEMA", "install", "step", "dump_now", "uninstall", "start_debug_server",
           "DEBUG_SERVER_PACKAGES"]
