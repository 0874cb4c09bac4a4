"""Checks of the hang readers added in round 3: a DataLoader worker spinning in an OpenMP
barrier counts as blocked, and the fixtures of the HANG031-035 / SYM140-141 rules give the
expected first cause through the whole pipeline (the rule fixtures test each rule alone)."""

from __future__ import annotations

from pathlib import Path

import pytest
from doctor.probes.stacks import classify

from doctor.engine.diagnose import diagnose_path

FIX = Path(__file__).parent / "fixtures" / "hang_more"

_LOOP = ("_worker_loop", "torch/utils/data/_utils/worker.py", 300, False)
_FETCH = ("fetch", "torch/utils/data/_utils/fetch.py", 50, False)
_USER = ("__getitem__", "/app/dataset.py", 42, False)


def test_worker_spinning_in_an_openmp_barrier_is_blocked() -> None:
    frames = [("gomp_team_barrier_wait_end", "libgomp.so.1", 0, True), ("GOMP_parallel", "libgomp.so.1", 0, True),
              _USER, _FETCH, _LOOP]
    assert classify.worker_activity(frames, True) == "blocked"


def test_worker_running_dataset_code_is_busy() -> None:
    assert classify.worker_activity([_USER, _FETCH, _LOOP], True) == "busy"


def test_worker_in_its_loop_is_waiting() -> None:
    frames = [("wait", "/usr/lib/python3.10/threading.py", 320, False), _LOOP]
    assert classify.worker_activity(frames, False) == "waiting"


@pytest.mark.parametrize("name,cause", [
    ("store_timeout_tokenizing", "timeout_too_short"),
    ("tickets/dl_stack_workers0.md", "dataloader_worker_deadlock"),
    ("tickets/dl_watchdog_workers0.md", "dataloader_worker_deadlock"),
    ("tickets/quiet_rank_validation.md", "timeout_too_short"),
    ("tickets/ckpt_nfs.md", "rank_stuck_in_io"),
    ("store_barrier_waiting", "init_hang"),
    ("rdzv_waiting", "init_hang"),
])
def test_first_cause(name: str, cause: str) -> None:
    findings = diagnose_path(FIX / name).findings
    assert findings, name
    assert findings[0].cause == cause
