"""Metric numbers in any shape, and what a little of them already says (issue #17 items 3 and 4).

Each case writes a small file in a shape people paste (a bare ``loss: nan``, a tqdm bar, an
mmdet line, a Markdown table, a "1.2 s/it before, 3.4 s/it after" sentence in a ticket) and
checks both what the readers take from it and the diagnosis it leads to: partial evidence gives
a finding at the confidence it supports (STAB009, STAB010, PERF014) or an honest "slow, cause
not determined", and healthy pastes give no medium-or-higher finding.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from doctor.probes.metrics.readers import kvline
from doctor.probes.metrics.readers.text import _line_metrics

from doctor.engine.diagnose import diagnose_path

ACTIONABLE = ("critical", "high", "medium")


# -- the readers: one line, any shape ----------------------------------------------------------

@pytest.mark.parametrize(("line", "metric", "value"), [
    ("loss: nan", "loss", math.nan),
    ("Loss: inf", "loss", math.inf),
    ("loss=1.2e+00 lr=1.0e-04", "loss", 1.2),
    ("| epoch 001 | loss 3.21 | wps 10234 | lr 0.0005", "loss", 3.21),
    ("grad_norm: inf | loss: 2.1", "grad_norm", math.inf),
    ("Epoch 3: loss 0.41 val_loss nan", "loss", 0.41),
    ("Iter [100/1000] lr: 1.000e-04, eta: 0:15:00, time: 1.000, data_time: 0.800, loss: 2.3412", "data_time", 0.8),
    ("Iter [100/1000] lr: 1.000e-04, eta: 0:15:00, time: 1.000, data_time: 0.800, loss: 2.3412", "step_time", 1.0),
    ("data_time: 0.8 time: 1.0", "data_time", 0.8),
])
def test_generic_line_values(line: str, metric: str, value: float) -> None:
    got = _line_metrics(line)
    assert got is not None, line
    v = got[2][metric]
    assert (math.isnan(v) and math.isnan(value)) or v == pytest.approx(value)


def test_validation_loss_is_not_the_training_loss() -> None:
    got = _line_metrics("Epoch 3: loss 0.41 val_loss nan")
    assert got is not None and got[2]["loss"] == pytest.approx(0.41)


def test_hf_dict_and_tqdm_postfix() -> None:
    hf = _line_metrics("{'loss': 0.52, 'grad_norm': 1.83, 'learning_rate': 1.9e-05, 'epoch': 0.12}")
    assert hf is not None and hf[2]["loss"] == pytest.approx(0.52) and hf[2]["grad_norm"] == pytest.approx(1.83)
    bar = _line_metrics("100%|##########| 50/50 [00:10<00:00, 4.9it/s, loss=nan]")
    assert bar is not None and math.isnan(bar[2]["loss"])
    assert bar[2]["step_time"] == pytest.approx(1 / 4.9)


def test_metrics_before_the_step_counter() -> None:
    got = _line_metrics("train_loss 2.31 step 10 grad_norm: 1.12 lr=3.0e-04 3.1 it/s")
    assert got is not None
    kind, step, vals, _ = got
    assert step == 10 and vals["loss"] == pytest.approx(2.31) and vals["grad_norm"] == pytest.approx(1.12)


def test_loss_scale_arrow_reads_the_new_value_and_a_skip() -> None:
    got = _line_metrics("step 1200 | loss 1.873 | grad_norm: inf | loss scale: 65536 -> 32768")
    assert got is not None
    assert got[2]["loss_scale"] == 32768 and got[2]["skipped"] == 1.0
    g = kvline.parse("loss: 1.87, loss scale: 1024 -> 2048")
    assert g is not None and g.vals["loss_scale"] == 2048 and "skipped" not in g.vals


@pytest.mark.parametrize(("line", "metric", "before", "after"), [
    ("1.2 s/it before, 3.4 s/it after", "step_time", 1.2, 3.4),
    ("it/s dropped from 5 to 1 when I moved the dataset", "step_time", 0.2, 1.0),
    ("throughput went from 1200 samples/s to 300 samples/s", "throughput", 1200, 300),
    ("we went from 2 to 8 GPUs and it/s went from 4 to 2", "step_time", 0.25, 0.5),
    ("data time went from 0.1s to 0.8s", "data_time", 0.1, 0.8),
])
def test_stated_changes(line: str, metric: str, before: float, after: float) -> None:
    got = kvline.parse(line)
    assert got is not None and [list(p) for p in got.points] == [[metric], [metric]]
    assert got.points[0][metric] == pytest.approx(before) and got.points[1][metric] == pytest.approx(after)


@pytest.mark.parametrize("line", [
    "lr: 3e-4",                                   # a config value
    "lr: 3e-4 -> 1e-4",                           # a config change, no training metric
    "torch 2.3.1, transformers 4.41.0",           # versions
    "version 1.2 -> 1.3",
    "saved checkpoint (13.5 GB) at 2024-05-01 10:00:01",  # a size and a timestamp
    "the import took 5s before, 10s after",       # seconds of something that is not a step
    "batch size from 32 to 64",
    "use_amp: true, loss_scale: 0",               # a config dump
])
def test_false_positive_guards(line: str) -> None:
    got = kvline.parse(line)
    assert got is None or (not got.points and not (set(got.vals) - {"lr", "epoch"})), got


# -- the diagnosis -----------------------------------------------------------------------------

def _diagnose(tmp_path: Path, name: str, text: str):  # type: ignore[no-untyped-def]
    f = tmp_path / name
    f.write_text(text, encoding="utf-8")
    return diagnose_path(f)


def _actionable(report) -> list[tuple[str, str, str]]:  # type: ignore[no-untyped-def]
    return [(f.rule, f.cause, f.severity) for f in report.findings if f.severity in ACTIONABLE]


def test_one_nan_line_is_medium_loss_nan_with_what_is_missing(tmp_path: Path) -> None:
    r = _diagnose(tmp_path, "paste.txt", "Loss: inf\n")
    m = r.facts["metrics"]
    assert m["first_nan_step"] == -1  # one line is not a series' first NaN
    assert m["partial"]["nan"]["value"] == "inf"
    top = r.findings[0]
    assert (top.rule, top.cause, top.severity) == ("STAB009", "loss_nan", "medium")
    assert r.verdict["state"] == "diverging"
    assert "longer series" in m["partial"]["nan"]["detail"]
    assert "whole training log" in r.verdict.get("missing", "")


def test_ticket_with_a_nan_fence(tmp_path: Path) -> None:
    ticket = ("# Loss becomes NaN after a few hundred steps\n\nI'm finetuning a 7B model with bf16 and "
              "after a while training breaks. Here's the output:\n\n```\n"
              "{'loss': 2.1043, 'grad_norm': 1.83, 'learning_rate': 1.9e-05, 'epoch': 0.12}\n```\n\n"
              "and then a bit later:\n\n```\nloss: nan\n```\n\nAny idea what is going on?\n")
    r = _diagnose(tmp_path, "issue.md", ticket)
    assert r.verdict["cause"] == "loss_nan"
    assert ("STAB009", "loss_nan", "medium") in _actionable(r)


def test_two_points_ending_in_nan_stay_a_series(tmp_path: Path) -> None:
    log = ("Epoch 1/3\n100%|##########| 50/50 [00:10<00:00, 4.9it/s, loss=0.812]\n"
           "Epoch 2/3\n100%|##########| 50/50 [00:10<00:00, 4.9it/s, loss=nan]\n")
    r = _diagnose(tmp_path, "train.log", log)
    assert r.facts["metrics"]["first_nan_step"] == 150  # epoch 2 x 50 + 50
    assert r.findings[0].rule == "STAB001"


def test_short_table_with_a_jump_is_a_low_lead(tmp_path: Path) -> None:
    table = ("Here is what the loss looks like:\n\n| step | loss |\n|------|------|\n| 100  | 2.31 |\n"
             "| 200  | 2.05 |\n| 300  | 1.92 |\n| 400  | 9.87 |\n| 500  | 9.95 |\n")
    r = _diagnose(tmp_path, "table.md", table)
    jump = r.facts["metrics"]["partial"]["jump"]
    assert jump["step"] == 400 and jump["to_value"] == pytest.approx(9.87) and jump["stays_up"] == 1
    assert not _actionable(r)  # low: a lead, not a verdict
    assert r.findings[0].rule == "STAB010" and r.verdict["state"] == "unknown"
    assert r.verdict["summary"].startswith("Possible cause, not confirmed")


def test_stated_slowdown_without_a_cause_is_slow_and_says_so(tmp_path: Path) -> None:
    r = _diagnose(tmp_path, "issue.md", "# Training got much slower after upgrading to 2.3\n\n"
                  "After upgrading torch the training loop is a lot slower: 1.2 s/it before, 3.4 s/it after.\n"
                  "Nothing else changed in the config. GPU is an A100 80GB.\n")
    slow = r.facts["metrics"]["partial"]["slowdown"]
    assert slow["metric"] == "step_time" and slow["factor"] == pytest.approx(3.4 / 1.2, rel=1e-3)
    assert r.verdict["state"] == "slow"
    # Nothing read names a cause: only the differential's usual causes of "slow after an
    # upgrade", marked as guesses (exit 3), may follow.
    assert all(f.differential for f in r.findings) and r.exit_code == 3
    assert not r.findings or r.verdict["summary"].startswith("Possible cause, not confirmed")
    assert not _actionable(r)


def test_stated_slowdown_with_data_wait_names_the_input_pipeline(tmp_path: Path) -> None:
    r = _diagnose(tmp_path, "issue.md", "# Slower since the dataset moved to NFS\n\nEach step takes longer now.\n\n"
                  "```\nstep time went from 0.5 s to 1.6 s\ndata time went from 0.05 s to 1.1 s\n```\n")
    slow = r.facts["metrics"]["partial"]["slowdown"]
    assert slow["data_added_share"] == pytest.approx((1.1 - 0.05) / (1.6 - 0.5), rel=1e-3)
    assert (r.findings[0].rule, r.verdict["cause"], r.verdict["state"]) == ("PERF014", "dataloader_starvation", "slow")


def test_a_speedup_is_not_a_slowdown(tmp_path: Path) -> None:
    r = _diagnose(tmp_path, "note.md", "With the new kernels it is faster: 3.4 s/it before, 1.2 s/it after.\n")
    assert "partial" not in r.facts.get("metrics", {}) and r.verdict["state"] != "slow"


@pytest.mark.parametrize(("name", "text"), [
    ("steps.log", "".join(f"train_loss {v} step {s} grad_norm: {g} lr=3.0e-04 3.1 it/s\n" for s, v, g in
                          [(10, 2.31, 1.12), (20, 2.24, 1.08), (30, 2.26, 1.1), (40, 2.17, 1.03),
                           (50, 2.11, 1.01), (60, 2.13, 0.99), (70, 2.05, 0.98), (80, 2.01, 0.97)])),
    ("bars.log", "".join(f"Epoch {e}: 100%|##########| 200/200 [00:41<00:00, {r}it/s, loss={v}, v_num=0]\n"
                         for e, v, r in [(0, 2.31, 4.87), (1, 1.95, 4.86), (2, 1.71, 4.88), (3, 1.74, 4.9), (4, 1.52, 4.87)])),
    ("table.md", "Loss so far:\n\n| step | loss | lr |\n|---|---|---|\n| 0 | 10.8 | 0.0 |\n| 500 | 4.12 | 3e-4 |\n"
                 "| 1000 | 3.55 | 3e-4 |\n| 1500 | 3.61 | 3e-4 |\n| 2000 | 3.30 | 3e-4 |\n"),
    ("fairseq.log", "".join(f"| epoch 001 | loss {v} | wps {w} | ups 2.1 | lr 0.0005 | gnorm 1.2 | num_updates {u}\n"
                            for v, w, u in [(3.21, 10234, 100), (3.05, 10190, 200), (2.98, 10201, 300), (3.01, 10188, 400)])),
    ("epochs.txt", "Epoch 1: loss 0.93 val_loss 0.88\nEpoch 2: loss 0.61 val_loss 0.64\nEpoch 3: loss 0.41 val_loss nan\n"),
])
def test_healthy_pastes_give_no_medium_finding(tmp_path: Path, name: str, text: str) -> None:
    r = _diagnose(tmp_path, name, text)
    assert r.facts["metrics"]["loss"]["rows"] >= 3  # read, not ignored
    assert not _actionable(r) and not r.findings, [(f.rule, f.summary) for f in r.findings]
    assert "partial" not in r.facts["metrics"]


def test_config_dump_is_not_a_series(tmp_path: Path) -> None:
    r = _diagnose(tmp_path, "config.txt", "model: llama-7b\nlr: 3e-4\nloss: cross_entropy\nbatch_size: 32\n"
                  "torch 2.3.1, transformers 4.41.0\nsaved checkpoint (13.5 GB) at 2024-05-01 10:00:01\n")
    assert "metrics" not in r.facts.get("evidence", {}).get("kinds", [])


def test_scaler_at_minimum_message_alone_is_a_collapse(tmp_path: Path) -> None:
    r = _diagnose(tmp_path, "paste.txt", "Exception: Current loss scale already at minimum - cannot decrease scale "
                  "anymore. Exiting run.\n")
    ls = r.facts["metrics"]["loss_scale"]
    assert ls["collapsed"] and ls["rows"] == 0 and "nan" not in ls["detail"]
    assert (r.findings[0].rule, r.verdict["cause"]) == ("STAB005", "fp16_overflow")


def test_scale_halving_lines_are_read_as_skips(tmp_path: Path) -> None:
    r = _diagnose(tmp_path, "train.log", "".join(
        f"step {1200 + i} | loss 1.87 | grad_norm: inf | loss scale: {65536 >> i} -> {32768 >> i}\n" for i in range(3)))
    ls = r.facts["metrics"]["loss_scale"]
    assert (ls["initial"], ls["final"], ls["skipped_steps"], ls["skipped_source"]) == (32768, 8192, 3, "logged")
