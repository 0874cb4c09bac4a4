"""Discovery that degrades instead of giving up: a job whose environments cannot be read (another
user's, a ptrace-restricted host) is still found from its process tree, and says what was denied."""

from __future__ import annotations

import pytest

from doctor.evidence.errors import UserError
from doctor.live import targets
from doctor.live.targets import ProcInfo


def _table(rank_args: tuple[list[str], ...]) -> dict[int, ProcInfo]:
    """A launcher and its ranks as another user's processes look: environ unreadable (None)."""
    procs = {1: ProcInfo(1, 0, "S", ["/sbin/init"], None),
             100: ProcInfo(100, 1, "S", ["/usr/bin/python3", "/usr/bin/torchrun", "--nproc-per-node", "2", "train.py"], None)}
    for i, extra in enumerate(rank_args):
        pid = 101 + i
        procs[pid] = ProcInfo(pid, 100, "S", ["/usr/bin/python3", "-u", "train.py", *extra], None)
    procs[200] = ProcInfo(200, 1, "S", ["bash"], None)
    return procs


def test_unreadable_job_is_found_from_its_launcher_in_start_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(targets, "all_procs", lambda: _table(([], [])))
    (job,) = targets.discover()
    assert job.key == "100" and job.launcher.pid == 100
    assert [(r.pid, r.rank) for r in job.ranks] == [(101, 0), (102, 1)]
    assert "not readable" in job.notes[0] and "start order" in job.notes[0]
    assert targets.pick_job([job], None) is job


def test_local_rank_arguments_win_over_start_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(targets, "all_procs", lambda: _table((["--local-rank=1"], ["--local_rank", "0"])))
    (job,) = targets.discover()
    assert [(r.pid, r.rank) for r in job.ranks] == [(101, 1), (102, 0)]
    assert "--local-rank arguments" in job.notes[0]


def test_nothing_found_names_what_limits_this_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(targets, "all_procs", lambda: {1: ProcInfo(1, 0, "S", ["/sbin/init"], None)})
    monkeypatch.setattr(targets, "access_limits", lambda owner_uid=None: "kernel.yama.ptrace_scope=2: only root")
    with pytest.raises(UserError, match="no PyTorch job found.*ptrace_scope=2"):
        targets.pick_job(targets.discover(), None)


def test_access_limits_reads_this_host() -> None:
    text = targets.access_limits(owner_uid=4242)
    if targets.os.geteuid() == 0 and targets._has_cap_ptrace():
        assert text == ""  # root with CAP_SYS_PTRACE reads every process
    else:
        assert text  # some reason is always given to a non-root user
