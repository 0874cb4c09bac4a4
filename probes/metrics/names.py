"""Metric names: the one place that decides which column, key or tag is which training metric.

Every reader (CSV headers, JSON keys, TensorBoard tags, ``name: value`` pairs in log lines) goes
through :func:`canonical`, so a metric spelled ``train/lm loss`` in one format and ``loss`` in
another is one metric everywhere, and evaluation losses or min/max aggregates are dropped the
same way in all of them.
"""

from __future__ import annotations

import re
from functools import lru_cache

_ALIASES: dict[str, set[str]] = {
    "loss": {"loss", "lm_loss", "total_loss", "loss_total", "ce_loss", "reduced_loss", "loss_lm",
             "nll_loss", "avg_loss", "mean_loss", "loss_avg", "loss_mean", "loss_step", "lm"},
    "grad_norm": {"grad_norm", "gradient_norm", "grad_norm_total", "total_grad_norm", "grad_l2_norm",
                  "grad_norm_l2", "norm", "gnorm", "grads_norm", "grad_norm_step", "grad_norm_before_clip"},
    "loss_scale": {"loss_scale", "scale", "grad_scale", "scaler_scale", "amp_scale", "loss_scaler",
                   "current_loss_scale", "cur_scale", "loss_scale_step"},
    "step": {"step", "iteration", "iter", "steps", "it", "num_steps", "update", "num_updates", "updates"},
    "step_time": {"step_time", "iteration_time", "iter_time", "time_per_iteration", "elapsed_time_per_iteration",
                  "batch_time", "time_per_step", "step_duration", "sec_per_step", "elapsed", "time", "dt",
                  "elapsed_time", "s_per_step", "step_time_s", "iteration_elapsed"},
    "data_time": {"data_time", "data_loading_time", "dataloader_time", "data_wait", "batch_wait_time",
                  "data_load_time", "data_wait_time", "time_data", "data_loading", "dataload_time",
                  "dataloader", "dataloader_wait", "data_wait_s", "data_s"},
    # Items per second (samples, tokens, words): a rate per step is a step time, not this.
    "throughput": {"throughput", "wps", "tps", "tokens_per_sec", "tokens_per_second", "tok_per_sec",
                   "tokens_s", "tok_s", "samples_per_sec", "samples_per_second", "samples_s", "sps",
                   "words_per_sec", "wps_avg", "images_per_sec", "imgs_per_sec", "examples_per_sec",
                   "seq_per_sec", "seqs_per_sec", "throughput_tokens", "throughput_samples"},
    "skipped": {"skipped", "skipped_iterations", "number_of_skipped_iterations", "skipped_steps", "skip",
                "found_inf", "overflow", "num_skipped", "skipped_iters"},
    "nan_iters": {"number_of_nan_iterations", "nan_iterations", "nan_iters"},
    "epoch": {"epoch", "epochs"},
    "consumed": {"consumed_samples", "samples_seen", "consumed_tokens", "tokens_seen", "num_samples",
                 "samples"},
    "wall": {"timestamp", "wall_time", "walltime", "wallclock", "runtime"},
    "rank": {"rank", "global_rank", "proc_rank"},
    "run": {"run", "run_id", "run_name", "experiment", "exp_name"},
}
_BY_ALIAS = {a: canon for canon, names in _ALIASES.items() for a in names}
_DROP = {"train", "training", "trainer", "optim", "optimizer", "perf", "timing", "metrics", "stats",
         "global", "batch"}
_EXCLUDE = {"eval", "val", "valid", "validation", "test", "min", "max", "std", "params", "param"}
_LR = re.compile(r"^(?:lr|learning_rate)(?:_[a-z0-9]+)*$")
_MS = re.compile(r"\(ms\)|\bms\b|milliseconds?|_ms$|_ms_")
_SEC = re.compile(r"\(s\)|_sec$|_secs$|_seconds$|_s$")
#: Metrics logged on every step: where one is missing and the others are there, the empty cell
#: was a logged NaN (``logged_nan``), not a row without it.
TRAINING = ("loss", "grad_norm", "lr", "loss_scale", "step_time", "data_time")  # logged every step


@lru_cache(maxsize=4096)
def canonical(raw: str) -> tuple[str, float] | None:
    """``'train/lm loss'`` -> ``('loss', 1.0)``; ``'elapsed time per iteration (ms)'`` ->
    ``('step_time', 0.001)``; None for anything that is not a training metric we read
    (evaluation losses, min/max aggregates, parameter norms)."""
    n = raw.strip().lower()
    if not n or "__" in n.strip("_"):
        return None  # W&B export aggregates: "loss__MIN"
    factor = 1.0
    if _MS.search(n):
        factor = 1e-3
        n = _MS.sub(" ", n)
    elif _SEC.search(n):
        n = _SEC.sub(" ", n)
    toks = [t for t in re.split(r"[^a-z0-9]+", n) if t]
    if not toks or any(t in _EXCLUDE for t in toks):
        return None
    if "epoch" in toks and len(toks) > 1:
        return None  # per-epoch aggregates such as Lightning's train_loss_epoch
    kept = [t for t in toks if t not in _DROP] or toks
    name = "_".join(kept)
    canon = _BY_ALIAS.get(name)
    if canon is None and _LR.match(name):
        canon = "lr"
    if canon is None and name in ("global_step", "trainer_global_step") or (canon is None and toks == ["global", "step"]):
        canon = "step"
    if canon is None:
        return None
    return canon, factor

