"""In-job step timer: per-step data wait, step time and GC time, written as JSONL for mldoctor.

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

The module never imports torch itself (it reads ``torch._dynamo``'s counters only when the job
already imported it) and nothing here changes what the job computes.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import socket
import sys
import time
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


__all__ = ["StepTimer", "SCHEMA"]
