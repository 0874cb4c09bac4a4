"""Round 6 hang work on pasted logs and stacks: a collective timeout reached from a checkpoint-save
or evaluation frame reads as a timeout too short for that work, a headless pasted traceback is
still read as a stack, a main thread stuck joining its DataLoader workers is the workers' hang,
and a reported hang whose NCCL output stops during set-up without any warning is an init hang.

Why these tests: each guards one of the confusions hang reports suffer (a late rank doing
legitimate work vs a rank outside the collective; a lone DataLoader wait vs a worker that never
exits), end to end through the real readers and rules, on fixtures written from upstream templates
by tests/fixtures/hang_r6_logs/make_fixtures.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from probes.stacks.formats.traceback import interrupted

from .conftest import FIXTURES, diagnose_json

HERE = FIXTURES / "hang_r6_logs"
LIB = Path(__file__).resolve().parents[1] / "probes" / "logs" / "patterns" / "hang_r6_logs.yaml"


def _causes(path: Path) -> list[str]:
    return [f["cause"] for f in diagnose_json(path)["findings"]]


def test_barrier_timeout_under_a_save_frame_is_a_timeout_too_short() -> None:
    assert _causes(HERE / "save_barrier_timeout.log")[0] == "timeout_too_short"


def test_same_timeout_under_a_plain_frame_is_not_read_as_long_work() -> None:
    assert "timeout_too_short" not in _causes(HERE / "plain_barrier_timeout.log")[:1]


def test_save_frame_signature_takes_whole_function_names_only() -> None:
    sig = yaml.safe_load(LIB.read_text())["patterns"][0]
    rx = re.compile(sig["pattern"])
    assert rx.search('  File "/x/trainer.py", line 3184, in evaluate')
    assert not rx.search('  File "/x/trainer.py", line 3184, in evaluate_and_log_everything')
    assert not rx.search('  File "/x/pydantic/main.py", line 12, in validate')


def test_headless_traceback_fragment_ending_in_ctrl_c_is_a_stack() -> None:
    lines = ['  File "/w/a.py", line 3, in f', "    g()", '  File "/w/b.py", line 9, in g',
             "    time.sleep(1)", "KeyboardInterrupt"]
    assert interrupted(lines) == lines
    # a fragment ending in a real exception stays a crash report
    assert interrupted(lines[:-1] + ["ValueError: x"]) == []


def test_main_thread_joining_dataloader_workers_is_the_workers_hang() -> None:
    assert _causes(HERE / "tickets" / "shutdown_join.md")[0] == "dataloader_worker_deadlock"


def test_reported_hang_with_nccl_output_stopping_at_bootstrap_is_an_init_hang() -> None:
    assert _causes(HERE / "tickets" / "init_stops_at_bootstrap.md")[0] == "init_hang"
