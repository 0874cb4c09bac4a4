"""Metric numbers in any line shape (issue 17, item 3): each shape people log or paste becomes
the right series with the right values, and prose, config dumps, code and progress bars of
other work do not.

The lines are written here in the shapes the trainers print (HF Trainer, Lightning/tqdm,
fairseq, Megatron, DeepSpeed, Keras, mmengine) and the shapes people paste into tickets; each is
repeated with varying numbers, as a log would.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from doctor.probes.metrics.formats import carries_metric_lines
from doctor.probes.metrics.readers import kvline
from doctor.probes.metrics.readers.text import read_text

from doctor.evidence.contract import Hints, Sample
from doctor.evidence.errors import EvidenceError


def _log(tmp_path: Path, text: str, name: str = "train.log") -> tuple[bool, dict[str, list[float]], list[int]]:
    """(sniffed, values per metric, steps) of one file, as the probe reads it."""
    p = tmp_path / name
    p.write_text(text)
    sniffed = carries_metric_lines(Sample.read(p))
    try:
        series = read_text(p, name, Hints())
    except EvidenceError:
        return sniffed, {}, []
    assert len(series) == 1
    s = series[0]
    vals = {m: [float(x) for x in v] for m, v in s.cols.items()}
    return sniffed, vals, [int(x) for x in s.step]


def _lines(fmt: Callable[[int], str], n: int = 6) -> str:
    return "".join(fmt(i) + "\n" for i in range(1, n + 1))


LOSS = [2.5, 2.31, 2.4, 2.12, 2.2, 1.98]  # not monotonic, as a real curve


SHAPES: list[tuple[str, Callable[[int], str], dict[str, float], list[int] | None]] = [
    ("hf_dict", lambda i: f"{{'loss': {LOSS[i - 1]}, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': {i / 10}}}",
     {"loss": 2.5, "grad_norm": 1.2, "lr": 5e-05}, None),
    ("lightning_bar", lambda i: f"Epoch 3: {i * 10}%|████▌| {i * 100}/1000 [02:10<02:39, 4.0it/s, loss={LOSS[i - 1]}, v_num=3]",
     {"loss": 2.5, "step_time": 0.25}, [3100, 3200]),
    ("fairseq_inner", lambda i: f"2023-01-01 10:00:0{i} | INFO | train_inner | epoch 001:    {i * 100} / 2000 "
     f"loss={LOSS[i - 1]}, nll_loss=2.1, ppl=4.3, wps=12345, ups=2.5, wpb=5000, num_updates={i * 100}, "
     f"lr=0.0005, gnorm=1.23, loss_scale=128, train_wall=30",
     {"loss": 2.5, "throughput": 12345.0, "step_time": 0.4, "lr": 0.0005, "grad_norm": 1.23, "loss_scale": 128.0},
     [100, 200]),
    ("fairseq_pipes", lambda i: f"| epoch {i:03d} | loss {LOSS[i - 1]} | nll_loss 2.1 | ppl 4.3 | wps 12345 | ups 2.5 "
     "| lr 0.0005 | gnorm 1.23 | loss_scale 128",
     {"loss": 2.5, "throughput": 12345.0, "step_time": 0.4, "grad_norm": 1.23, "loss_scale": 128.0, "epoch": 1.0},
     [1, 2]),
    ("megatron", lambda i: f" iteration {i * 100}/ 1000 | elapsed time per iteration (ms): 512.3 | learning rate: 1.0E-04 "
     f"| lm loss: {LOSS[i - 1]:.5E} | loss scale: 65536.0 | grad norm: 2.345 | number of nan iterations: 0 |",
     {"loss": 2.5, "step_time": 0.5123, "lr": 1e-4, "loss_scale": 65536.0, "grad_norm": 2.345}, [100, 200]),
    ("deepspeed_step", lambda i: f"[2024-01-01 10:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] step={i * 10}, "
     f"skipped={i // 3}, lr=[0.0001], mom=[(0.9, 0.999)]\n[2024-01-01 10:00:00,000] [INFO] [loss_scaler.py:183:"
     f"update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {2 ** (17 - i)}, reducing to "
     f"{2 ** (16 - i)}", {"lr": 1e-4, "skipped": 1.0, "loss_scale": 65536.0}, [10, 20]),
    ("plain_nan", lambda i: f"step {i * 10} loss: {'nan' if i > 4 else LOSS[i - 1]}", {"loss": 2.5}, [10, 20]),
    ("plain_sci", lambda i: f"Step {i * 200}/1000, Loss={LOSS[i - 1]:.1e}, LR=3e-4", {"loss": 2.5, "lr": 3e-4}, [200, 400]),
    ("keras_bar", lambda i: f"{i * 10}/60 [=====>........] - ETA: 3s - loss: {LOSS[i - 1]} - accuracy: 0.91",
     {"loss": 2.5}, [10, 20]),
    ("epoch_summary", lambda i: f"Epoch {i} | train_loss {LOSS[i - 1]} | val_loss 9.9 | time {120 + i % 2}.5s",
     {"loss": 2.5, "step_time": 121.5}, [1, 2]),
    ("rank_prefix", lambda i: f"[rank3]: step {i} loss={LOSS[i - 1]} grad_norm=1.0", {"loss": 2.5, "grad_norm": 1.0}, [1, 2]),
    ("logging_prefix", lambda i: f"2024-05-01 12:00:0{i},123 - INFO - __main__ - it {i * 10} | loss: {LOSS[i - 1]} "
     "| grad_norm: 0.9 | lr: 2.0e-05 | 2.0 it/s", {"loss": 2.5, "grad_norm": 0.9, "lr": 2e-5, "step_time": 0.5}, [10, 20]),
    ("tensor_repr", lambda i: f"step {i} loss tensor({LOSS[i - 1]}, device='cuda:0', grad_fn=<NllLossBackward0>) "
     "grad norm tensor(1.23, device='cuda:0')", {"loss": 2.5, "grad_norm": 1.23}, [1, 2]),
    ("mmengine", lambda i: f"2024/01/01 10:00:00 - mmengine - INFO - Epoch(train)  [1][ {i * 50}/1000]  lr: 1.0000e-04  "
     f"eta: 1:00:00  time: 0.5{i % 2}  data_time: 0.0{i % 3}  memory: 5000  loss: {LOSS[i - 1]}  grad_norm: 3.4",
     {"loss": 2.5, "lr": 1e-4, "step_time": 0.51, "data_time": 0.01, "grad_norm": 3.4}, [50, 100]),
    ("data_time_cells", lambda i: f"step {i} | loss {LOSS[i - 1]} | data time 0.{i % 3 + 1}s | step time 1.{i % 2}s",
     {"loss": 2.5, "data_time": 0.2, "step_time": 1.1}, [1, 2]),
]


@pytest.mark.parametrize("shape,fmt,first,steps", SHAPES, ids=[s[0] for s in SHAPES])
def test_each_shape_parses_to_the_right_series(tmp_path: Path, shape: str, fmt: Callable[[int], str],
                                               first: dict[str, float], steps: list[int] | None) -> None:
    sniffed, vals, got_steps = _log(tmp_path, _lines(fmt))
    assert sniffed, shape
    for metric, want in first.items():
        assert metric in vals, (shape, metric, sorted(vals))
        assert vals[metric][0] == pytest.approx(want, rel=1e-3), (shape, metric, vals[metric][:3])
    if steps is not None:
        assert got_steps[:2] == steps, (shape, got_steps)


def test_nan_and_inf_spellings_stay_non_finite(tmp_path: Path) -> None:
    text = "step 1 loss: 2.5\nstep 2 loss: 2.4\nstep 3 loss: nan\nstep 4 loss=-inf\nstep 5 | loss inf |\n"
    _, vals, _ = _log(tmp_path, text)
    loss = vals["loss"]
    assert math.isnan(loss[2]) and loss[3] == -math.inf and loss[4] == math.inf


def test_keras_bars_count_steps_across_epochs(tmp_path: Path) -> None:
    text = "".join(f"Epoch {e}/3\n50/50 [==============================] - 5s {90 + e}ms/step - loss: {LOSS[e]} "
                   "- accuracy: 0.9 - val_loss: 9.0\n" for e in (1, 2, 3))
    _, vals, steps = _log(tmp_path, text)
    assert steps == sorted(steps) and len(set(steps)) == 3
    assert vals["loss"] == pytest.approx(LOSS[1:4]) and vals["step_time"][0] == pytest.approx(0.091)


def test_markdown_table(tmp_path: Path) -> None:
    text = ("Here is what we see:\n\n| step | loss | grad norm | lr |\n|---:|---|---|---|\n"
            + "".join(f"| {i * 100} | {LOSS[i - 1]} | {i}.5 | 1e-4 |\n" for i in range(1, 5)) + "\nthanks\n")
    sniffed, vals, steps = _log(tmp_path, text)
    assert sniffed and steps == [100, 200, 300, 400]
    assert vals["loss"] == pytest.approx(LOSS[:4]) and vals["grad_norm"][1] == 2.5


@pytest.mark.parametrize("line,metric,values", [
    ("before: 1.2 s/it, after: 3.4 s/it", "step_time", [1.2, 3.4]),
    ("throughput dropped from 1200 samples/s to 300 samples/s", "throughput", [1200.0, 300.0]),
    ("it was 4.0 it/s and now 1.0 it/s", "step_time", [0.25, 1.0]),
    ("data time went from 0.1s to 0.8s per step", "data_time", [0.1, 0.8]),
])
def test_before_after_pastes(tmp_path: Path, line: str, metric: str, values: list[float]) -> None:
    sniffed, vals, _ = _log(tmp_path, line + "\n")
    assert sniffed and vals[metric] == pytest.approx(values)


def test_overflow_messages_alone_give_the_loss_scale(tmp_path: Path) -> None:
    text = _lines(lambda i: f"[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {2 ** (18 - i)}, "
                            f"reducing to {2 ** (17 - i)}")
    _, vals, _ = _log(tmp_path, text)
    assert vals["loss_scale"][:2] == [2.0 ** 17, 2.0 ** 16]


NOT_METRICS = {
    "prose": "The loss goes to nan after a while and I don't know why.\n"
             "We tried lowering the learning rate to 1e-5 but the loss still spikes at step 300.\n"
             "Any idea why the loss scale keeps dropping to 1?\n",
    "yaml_config": "loss_type: cross_entropy\nlabel_smoothing: 0.1\nlr: 0.0003\nweight_decay: 0.01\n"
                   "loss_scale: 128\ninitial_scale_power: 16\nwarmup_steps: 2000\n",
    "argparse_dump": "Namespace(lr=0.0001, loss_scale=0, fp16=True, clip_grad=1.0, max_steps=1000)\n"
                     "  lr ........................ 0.0001\n  loss_scale ................ None\n",
    "hf_arguments": "TrainingArguments(\n_n_gpu=1,\nlearning_rate=5e-05,\nlogging_steps=10,\nmax_grad_norm=1.0,\n)\n",
    "download_bars": "100%|██████████| 1.2G/1.2G [00:10<00:00, 120MB/s]\n"
                     "Downloading: 100%|██████████| 50/50 [00:01<00:00, 45.2it/s]\n"
                     "Map: 100%|██████████| 1000/1000 [00:02<00:00, 480.1 examples/s]\n",
    "python_code": "opt = torch.optim.AdamW(model.parameters(), lr=1e-3)\nscale = 1.0\n"
                   "lr = 2e-3 if step < 300 else 5e-2\nloss = criterion(out, y)\n",
    "torchelastic_summary": "  time      : 2026-12-02_13:32:38\n  host      : node1\n  rank      : 1 (local_rank: 1)\n"
                            "  exitcode  : 1 (pid: 1234)\n",
    "eval_only": "{'eval_loss': 0.52, 'eval_runtime': 3.1, 'epoch': 1.0}\n| val_loss 0.5 | val_acc 0.9 |\n",
}


@pytest.mark.parametrize("name", sorted(NOT_METRICS))
def test_prose_config_and_code_are_not_series(tmp_path: Path, name: str) -> None:
    text = NOT_METRICS[name] * 3  # repeated, as each rank prints it
    sniffed, vals, _ = _log(tmp_path, text)
    assert not sniffed and not vals, (name, sorted(vals))


@pytest.mark.parametrize("line", [
    "the loss is 3.2 and it was 2.1 yesterday at the same step, then everything broke down badly",
    "Is loss: nan expected?",
    "I set lr=1e-4",
    "Version 1.2.3 released on 2024-01-02 with a fix for the loss",
])
def test_sentences_are_not_records(line: str) -> None:
    assert kvline.parse(line) is None


@pytest.mark.parametrize("junk", ["a" * 200_000, "1" * 200_000, "a_" * 100_000, "loss " * 40_000, "| " * 100_000,
                                  "1." * 100_000, "from 1 s " * 20_000, "loss: 1 " * 25_000, "x=[" * 60_000,
                                  "tensor(" * 30_000, "a-" * 100_000, "1/2 [" * 40_000])
def test_the_grammar_is_linear_on_long_lines(tmp_path: Path, junk: str) -> None:
    t0 = time.perf_counter()
    kvline.parse(junk)
    kvline.table_header("|" + junk + "|")
    assert time.perf_counter() - t0 < 2.0
    (tmp_path / "x.log").write_text(junk + "\n")
    t0 = time.perf_counter()
    carries_metric_lines(Sample.read(tmp_path / "x.log"))
    assert time.perf_counter() - t0 < 2.0


def test_a_pasted_log_of_a_new_shape_reaches_the_detectors(tmp_path: Path) -> None:
    """A ticket with fairseq-style pipe cells: the loss scale collapses, then the loss goes NaN;
    the same facts the trainer formats give (and so the same rules) come out of it."""
    from doctor.engine import facts as F

    rows, scale = [], 128
    for i in range(1, 61):
        scale = max(1, scale // 2) if i > 40 else scale
        loss = f"{3.2 - i * 0.01:.3f}" if i < 50 else "nan"
        rows.append(f"| epoch 001 | loss {loss} | nll_loss 2.1 | wps {12000 + i * 7} | lr 0.0005 | gnorm 1.2 "
                    f"| loss_scale {scale} | num_updates {i * 10}")
    doc = tmp_path / "issue.md"
    doc.write_text("## NaN with fp16\n\nOur run goes to NaN after about 500 updates. Log:\n\n```\n"
                   + "\n".join(rows) + "\n```\n\nIt works in fp32. Any idea why?\n")
    facts, _ = F.build(F.items_from_folder(doc), str(doc))
    m = facts["metrics"]
    assert m["first_nan_step"] == 500
    assert m["loss_scale"]["collapsed"]
    assert m["throughput"]["first"] == 12007 and m["throughput"]["n"] == 60
