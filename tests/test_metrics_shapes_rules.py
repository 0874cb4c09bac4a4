"""Numbers in any shape reach the stability rules, and a healthy curve in any shape alarms nobody.

The numbers are from real CPU runs: the diverging run of tests/fixtures/metrics/lr_jump (its
learning rate jumps x100, the loss goes Inf then NaN), the fp16 run of
tests/fixtures/metrics/fp16_overflow (its dynamic loss scale collapses) and the healthy run of
tests/fixtures/tickets_forms/healthy_run.py (noisy but falling). Each is printed again in the
line shapes trainers print and people paste (HF Trainer dicts, Lightning/tqdm postfixes,
fairseq ``| loss x |`` cells, Megatron ``lm loss: 3.2E+00``, Keras ``- loss: x - acc:``, epoch
summaries, Markdown tables; DeepSpeed, apex and fairseq overflow messages); the same stability
rule (STAB001 NaN, STAB005 loss-scale collapse) must fire whatever the shape, alone and fenced
in a ticket.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
from doctor.probes.metrics.readers.text import read_text

from doctor.engine.diagnose import diagnose_path
from doctor.evidence.contract import Hints

FIX = Path(__file__).parent / "fixtures"
HEALTHY = sorted((FIX / "tickets_forms").glob("healthy-*.log"))
ACTIONABLE = ("critical", "high", "medium")


def _series(path: Path) -> dict[str, list[float]]:
    s = read_text(path, path.name, Hints())[0]
    return {k: [float(x) for x in v] for k, v in s.cols.items()} | {"step": [float(x) for x in s.step]}


@pytest.fixture(scope="module")
def diverging() -> list[tuple[int, float, float, float]]:
    """(step, loss, grad norm, lr) of the real lr_jump run, from its HF Trainer log."""
    cols = _series(FIX / "metrics" / "lr_jump" / "train.log")
    rows = list(zip(cols["step"], cols["loss"], cols["grad_norm"], cols["lr"], strict=True))
    assert any(not math.isfinite(r[1]) for r in rows)  # the run really went non-finite
    return [(int(s), loss, g, lr) for s, loss, g, lr in rows]


@pytest.fixture(scope="module")
def scales() -> list[float]:
    """The loss scale of the real fp16_overflow run at every iteration where it was cut."""
    cols = _series(FIX / "metrics" / "fp16_overflow" / "megatron.log")
    out = [b for a, b in zip(cols["loss_scale"], cols["loss_scale"][1:], strict=False) if b < a]
    assert len(out) >= 5
    return out


def _num(x: float, spec: str = ".4f") -> str:
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf") if math.isinf(x) else format(x, spec)


LOSS_SHAPES: dict[str, Callable[[int, float, float, float], str]] = {
    "hf_dict": lambda s, loss, g, lr: f"{{'loss': {_num(loss)}, 'grad_norm': {_num(g)}, 'learning_rate': {lr}, "
                                      f"'epoch': {s / 400:.4f}}}",
    "lightning_postfix": lambda s, loss, g, lr: f"Epoch 0: {s * 100 // 400:3d}%|####  | {s}/400 [00:04<00:01, 9.1it/s, "
                                                f"loss={_num(loss, '.3g')}, v_num=1]",
    "fairseq_cells": lambda s, loss, g, lr: f"| epoch 001 | loss {_num(loss, '.3f')} | lr {lr} | gnorm {_num(g, '.3f')} "
                                            f"| num_updates {s}",
    "megatron_lm_loss": lambda s, loss, g, lr: f" iteration {s:8d}/     400 | learning rate: {lr:.6E} | lm loss: "
                                               f"{_num(loss, '.6E')} | grad norm: {_num(g, '.3f')} |",
    "keras": lambda s, loss, g, lr: f"{s}/400 [=========>......] - ETA: 1s - loss: {_num(loss)} - acc: 0.3100",
    "epoch_summary": lambda s, loss, g, lr: f"Epoch {s}: train_loss={_num(loss)} val_loss=2.3010 time 0.21s",
    "plain_eq": lambda s, loss, g, lr: f"step={s} loss={_num(loss, '.4e')} grad_norm={_num(g, '.4e')} lr={lr:.1e}",
}

SCALE_SHAPES: dict[str, Callable[[int, float], str]] = {
    # DeepSpeed fused_optimizer.py / loss_scaler.py, apex amp handle.py, fairseq trainer.py
    "deepspeed_fused": lambda i, s: f"[2024-06-01 10:00:{i % 60:02d},000] [INFO] [fused_optimizer.py:344:_update_scale] "
                                    f"Overflow detected. Skipping step. Attempted loss scale: {s * 2:g}, reducing to {s:g}",
    "deepspeed_overflow": lambda i, s: f"[2024-06-01 10:00:{i % 60:02d},000] [INFO] [loss_scaler.py:183:update_scale] "
                                       f"[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {s * 2:g}, "
                                       f"reducing to {s:g}",
    "apex": lambda i, s: f"Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {s:.1f}",
    "fairseq": lambda i, s: f"2024-06-01 10:00:{i % 60:02d} | INFO | fairseq.trainer | NOTE: gradient overflow detected, "
                            f"ignoring gradient, setting loss scale to: {s:.1f}",
}


def _rules(path: Path) -> set[str]:
    return {f.rule for f in diagnose_path(path).findings}


def _ticket(tmp_path: Path, body: str) -> Path:
    doc = tmp_path / "issue.md"
    doc.write_text(f"Our run goes bad after a while, log below.\n\n```\n{body}```\n\nAny idea why?\n")
    return doc


@pytest.mark.parametrize("shape", sorted(LOSS_SHAPES))
def test_a_nan_loss_in_any_shape_fires_stab001(tmp_path: Path, shape: str,
                                               diverging: list[tuple[int, float, float, float]]) -> None:
    body = "".join(LOSS_SHAPES[shape](*r) + "\n" for r in diverging)
    log = tmp_path / "train.log"
    log.write_text(body)
    cols = _series(log)
    assert len(cols["loss"]) == len(diverging) and any(math.isnan(v) for v in cols["loss"]), shape
    assert "STAB001" in _rules(log), shape
    assert "STAB001" in _rules(_ticket(tmp_path, body)), shape


@pytest.mark.parametrize("shape", sorted(SCALE_SHAPES))
def test_overflow_messages_in_any_shape_fire_stab005(tmp_path: Path, shape: str, scales: list[float]) -> None:
    body = "".join(SCALE_SHAPES[shape](i, s) + "\n" for i, s in enumerate(scales))
    log = tmp_path / "train.log"
    log.write_text(body)
    cols = _series(log)
    assert cols["loss_scale"] == pytest.approx(scales if shape in ("apex", "fairseq") else [2 * s for s in scales])
    assert set(cols["skipped"]) == {1.0}
    assert "STAB005" in _rules(log), shape
    assert "STAB005" in _rules(_ticket(tmp_path, body)), shape


def test_markdown_table_with_a_loss_column(tmp_path: Path, diverging: list[tuple[int, float, float, float]]) -> None:
    body = "| step | loss | grad norm |\n|---:|---:|---:|\n" + "".join(
        f"| {s} | {_num(loss)} | {_num(g)} |\n" for s, loss, g, _ in diverging)
    log = tmp_path / "table.md"
    log.write_text("The loss goes to nan around step 300, here is the table:\n\n" + body)
    assert "STAB001" in _rules(log)


def test_the_healthy_run_was_captured() -> None:
    assert {p.stem for p in HEALTHY} == {f"healthy-{s}" for s in ("fairseq", "hf", "keras", "lightning", "megatron", "table")}


@pytest.mark.parametrize("path", HEALTHY, ids=lambda p: p.stem)
def test_a_healthy_curve_in_any_shape_alarms_nobody(path: Path, tmp_path: Path) -> None:
    """Noisy but falling (batch-to-batch jumps of 10x at the end): read whole, no medium or worse."""
    cols = _series(path)
    loss = cols["loss"]
    assert len(loss) == 60 and all(math.isfinite(v) for v in loss)
    assert sum(loss[-10:]) < sum(loss[:10]) / 3  # it learned
    assert max(loss[-30:]) > 5 * min(loss[-30:])  # and it is noisy: the test can fail on a naive detector
    for target in (path, _ticket(tmp_path, path.read_text())):
        bad = [(f.rule, f.severity) for f in diagnose_path(target).findings
               if f.severity in ACTIONABLE and not f.rule.startswith("SYM")]
        assert bad == [], (path.name, bad)


@pytest.mark.parametrize("shape", ["hf_dict", "fairseq_cells", "megatron_lm_loss", "plain_eq"])
def test_a_grad_norm_that_stays_nan_fires_stab008(tmp_path: Path, shape: str,
                                                   diverging: list[tuple[int, float, float, float]]) -> None:
    """The finite part of the real run, its grad norm logged as NaN from some step on while the
    loss stays finite (HF Trainer's "'grad_norm': nan" with fp16 or a bad batch): STAB008, in any shape."""
    finite = [r for r in diverging if math.isfinite(r[1])]
    cut = len(finite) * 2 // 3
    rows = [(s, loss, g if i < cut else math.nan, lr) for i, (s, loss, g, lr) in enumerate(finite)]
    log = tmp_path / "train.log"
    log.write_text("".join(LOSS_SHAPES[shape](*r) + "\n" for r in rows))
    assert sum(math.isnan(v) for v in _series(log)["grad_norm"]) == len(rows) - cut
    assert "STAB008" in _rules(log), shape
