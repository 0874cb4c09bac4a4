"""Partial hang evidence: the watchdog lines, queue positions and NCCL init lines of some ranks,
and a Ctrl-C traceback, read into facts that name a likely cause (probes/logs/partial.py,
probes/stacks/formats/traceback.interrupted). Fixtures: tests/fixtures/hang_partial (the
Ctrl-C logs captured from real torchrun jobs, the NCCL lines assembled from upstream templates:
see make_logs.py)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from doctor.probes.logs.partial import comm_init_facts, progress_groups, silent_ranks, wait_groups
from doctor.probes.logs.scan import pg_of
from doctor.probes.stacks.formats import has_interrupted, interrupted

from doctor.engine.facts import build, items_from_folder

FIX = Path(__file__).parent / "fixtures" / "hang_partial"


def _facts(name: str) -> dict:
    return build(items_from_folder(FIX / name), str(FIX / name))[0]


def _wait(rank: int, seq: int, op: str = "ALLREDUCE", numel: int | None = 1024, pg: str = "0") -> dict:
    return {"rank": rank, "host": "", "backend": "nccl", "seq": seq, "op": op, "numel_in": numel,
            "timeout_ms": 600000, "ran_ms": 600010, "pg": pg}


def _pos(rank: int, enq: int, done: int, pg: str = "0") -> dict:
    return {"rank": rank, "host": "", "pg": pg, "seq": None, "last_enqueued": enq, "last_completed": done, "own": False}


# -- watchdog timeouts of some ranks ---------------------------------------------------------

@pytest.mark.parametrize("behind", [0, 2, 5])
def test_lower_sequence_number_names_the_ranks_behind(behind: int) -> None:
    ws = [_wait(r, 100 if r == behind else 101) for r in range(6)]
    (g,) = wait_groups(ws)
    assert g["seq_differs"] and g["behind_ranks"] == [behind]
    assert sorted(g["ahead_ranks"]) == [r for r in range(6) if r != behind]


def test_sequence_numbers_of_different_groups_are_not_compared() -> None:
    ws = [_wait(0, 10, pg="0"), _wait(1, 10, pg="0"), _wait(0, 77, pg="3"), _wait(1, 77, pg="3")]
    assert not any(g["seq_differs"] for g in wait_groups(ws))


def test_lines_without_a_group_count_only_the_same_collective() -> None:
    # torch < 2.2 names no group: two groups' own numbering must not read as a mismatch
    ws = [_wait(0, 10, "ALLREDUCE", 8, pg=""), _wait(1, 55, "ALLGATHER", 64, pg="")]
    assert not wait_groups(ws)[0]["seq_differs"]
    ws = [_wait(0, 10, pg=""), _wait(1, 11, pg="")]
    assert wait_groups(ws)[0]["behind_ranks"] == [0]


def test_barrier_like_is_a_one_element_allreduce_only() -> None:
    assert wait_groups([_wait(0, 3, numel=1), _wait(1, 3, numel=1)])[0]["barrier_like"]
    assert not wait_groups([_wait(0, 3, numel=4096), _wait(1, 3, numel=4096)])[0]["barrier_like"]


def test_quiet_rank_needs_peers_at_one_collective() -> None:
    ws = [_wait(r, 812) for r in range(3)]
    assert silent_ranks(ws, {0, 1, 2, 3}, 4, set(), set())["quiet"] == [3]
    # a rank with an error or exit of its own is explained elsewhere
    assert silent_ranks(ws, {0, 1, 2, 3}, 4, {3}, set())["quiet"] == []
    # timeouts at different collectives: no common collective to be absent from
    ws2 = [_wait(0, 812), _wait(1, 813), _wait(2, 812)]
    assert silent_ranks(ws2, {0, 1, 2, 3}, 4, set(), set())["quiet"] == []
    # more silent ranks than waiters: a partial log, not one straggler
    assert silent_ranks(ws[:2], set(range(8)), 8, set(), set())["quiet"] == []


def test_unseen_ranks_only_when_few_are_absent() -> None:
    ws = [_wait(r, 5) for r in range(8) if r != 6]
    assert silent_ranks(ws, set(range(8)) - {6}, 8, set(), set())["unseen"] == [6]
    half = [_wait(r, 5) for r in range(4)]
    assert silent_ranks(half, set(range(4)), 8, set(), set())["unseen"] == []


# -- queue positions -------------------------------------------------------------------------

@pytest.mark.parametrize("odd", [0, 3, 7])
def test_pending_work_peers_completed_is_a_stalled_gpu(odd: int) -> None:
    reps = [_pos(r, 4412, 4409 if r == odd else 4412) for r in range(8)]
    (g,) = progress_groups(reps)
    assert g["stalled_ranks"] == [odd] and g["behind_ranks"] == [] and g["extra_ranks"] == []


@pytest.mark.parametrize("odd", [0, 2])
def test_minority_that_never_enqueued_is_behind(odd: int) -> None:
    reps = [_pos(r, 96 if r == odd else 97, 96) for r in range(4)]
    (g,) = progress_groups(reps)
    assert g["behind_ranks"] == [odd] and g["stalled_ranks"] == [] and g["extra_ranks"] == []


def test_minority_waiting_beyond_every_idle_peer_called_an_extra_collective() -> None:
    reps = [_pos(1, 51, 50)] + [_pos(r, 50, 50) for r in (0, 2, 3)]
    (g,) = progress_groups(reps)
    assert g["extra_ranks"] == [1] and g["behind_ranks"] == [] and g["stalled_ranks"] == []


def test_order_of_reports_does_not_change_the_reading() -> None:
    reps = [_pos(r, 97, 96) for r in range(3)] + [_pos(3, 96, 96)]
    want = progress_groups(reps)
    for perm in itertools.permutations(reps):
        assert progress_groups(list(perm)) == want


def test_everyone_waiting_in_one_collective_names_nobody() -> None:
    (g,) = progress_groups([_pos(r, 5521, 5520) for r in range(4)])
    assert not (g["stalled_ranks"] or g["behind_ranks"] or g["extra_ranks"])


# -- line formats ----------------------------------------------------------------------------

@pytest.mark.parametrize(("line", "pg"), [
    ("[PG ID 0 PG GUID 0(default_pg) Rank 3] Timeout at NCCL work: 5", "0(default_pg)"),
    ("[PG ID 2 PG GUID 5 Rank 1] Watchdog caught", "2"),
    ("[PG 0 Rank 3] Watchdog caught collective operation timeout", "0"),
    ("[Rank 3] Watchdog caught collective operation timeout", ""),
])
def test_process_group_of_a_watchdog_line(line: str, pg: str) -> None:
    assert pg_of(line) == pg


def test_comm_init_started_never_completed_and_sizes() -> None:
    scans = [{"comm_inits": {"a:1:0x1": [0, 4, "0xc", True], "b:2:0x2": [2, 4, "0xc", False]}},
             {"comm_inits": {"a:1:0x1": [0, 4, "0xc", False], "c:3:0x3": [3, 8, "0xc", False]}}]
    f = comm_init_facts(scans)
    assert f["completed"] == 1 and f["incomplete_ranks"] == [2, 3]
    assert f["nranks_differ"] == ["0xc"]


# -- Ctrl-C tracebacks -----------------------------------------------------------------------

_TB = ["Traceback (most recent call last):", '  File "train.py", line 9, in <module>', "    main()",
       '  File "train.py", line 5, in main', "    batch = next(it)"]


def test_interrupted_takes_the_traceback_that_ends_in_keyboardinterrupt() -> None:
    assert interrupted(_TB + ["KeyboardInterrupt"]) == _TB + ["KeyboardInterrupt"]
    assert interrupted(_TB + ["RuntimeError: boom"]) == []
    # a KeyboardInterrupt raised while handling another exception is the handler's stack
    chained = _TB + ["RuntimeError: Connection closed by peer", "",
                     "During handling of the above exception, another exception occurred:", ""] + _TB + ["KeyboardInterrupt"]
    assert interrupted(chained) == []
    hook = ["Error in sys.excepthook:"] + _TB + ["KeyboardInterrupt"]
    assert interrupted(hook) == []


def test_a_plain_crash_traceback_is_not_a_stack() -> None:
    assert not has_interrupted("\n".join(_TB + ["RuntimeError: CUDA error: out of memory"]))
    assert has_interrupted("\n".join("[rank1]: " + ln for ln in _TB + ["KeyboardInterrupt"]))


def test_real_ctrl_c_on_a_dataloader_hang_reads_as_that_ranks_stack() -> None:
    facts = _facts("ctrl_c_dataloader")
    st = facts["stacks"]
    assert st["formats"] == ["keyboard_interrupt"]
    assert st["state_ranks"] == {"dataloader_wait": [0]}  # rank 1's traceback is chained to a peer error


def test_real_ctrl_c_without_a_wait_traceback_adds_no_stack_and_no_error() -> None:
    facts = _facts("ctrl_c_save")
    assert "stacks" not in facts["evidence"]["kinds"]
    assert not facts["evidence"]["errors"]


@pytest.mark.parametrize(("name", "key", "want"), [
    ("seq_behind", "wait_groups", [2]),
    ("stalled_gpu", "progress_groups", [5]),
    ("behind_progress", "progress_groups", [3]),
    ("extra_collective", "progress_groups", [1]),
])
def test_fixture_logs_name_the_odd_rank(name: str, key: str, want: list[int]) -> None:
    logs = _facts(name)["logs"]
    (g,) = logs[key]
    odd = g.get("behind_ranks") or g.get("stalled_ranks") or g.get("extra_ranks")
    assert odd == want


# -- ranks torch names itself ----------------------------------------------------------------

def test_real_monitored_barrier_names_the_absent_rank_not_the_reporter() -> None:
    logs = _facts("monitored_barrier")["logs"]
    assert logs["named_by_torch"]["missed_barrier"] == [1]
    # rank 0 raised the barrier's verdict and exited: it waited, it did not fail on its own
    assert 0 not in logs["dead_ranks"] and 0 not in logs["failed_ranks"]


@pytest.mark.parametrize(("name", "key", "want"), [
    ("desync_lagging", "lagging", [1]),
    ("desync_unfinished", "unfinished", [6]),
])
def test_desync_report_ranks(name: str, key: str, want: list[int]) -> None:
    named = _facts(name)["logs"]["named_by_torch"]
    assert named[key] == want
    assert all(v == [] for k, v in named.items() if k != key)


def test_keepalive_failure_is_not_a_failed_start() -> None:
    logs = _facts("keepalive_lost")["logs"]
    assert logs["counts"].get("rendezvous_keepalive_failed") == 3
    assert "init_connect_failed" not in logs["counts"] and "init_timeout" not in logs["counts"]
