"""Training metrics: loss, grad norm, learning rate, fp16 loss scale, step and data time.

Reads what training jobs already write, with any reasonable column names (``loss``,
``train/loss``, ``lm loss``, ``grad_norm``, ``learning_rate``, ``loss_scale``, ``step`` /
``iteration`` / ``global_step``, ``step_time`` / ``elapsed``, ``data_time``):

- CSV (any delimiter; W&B exports with ``<run> - <metric>`` columns become one series per run),
- JSONL (one record per line, nested one level: ``{"metrics": {"loss": ..}}``), and HF
  ``trainer_state.json`` (its ``log_history``),
- TensorBoard event files (TFRecord framing and the few protobuf fields of Event/Summary,
  decoded here: no TensorFlow, no protobuf package),
- trainer log lines: HF Trainer dicts, Megatron ``iteration N/M | lm loss: ...`` lines,
  DeepSpeed overflow messages, Lightning progress bars, and ``step N ... loss X`` lines
  (nanoGPT, llm.c and most hand-written loops).

Each file becomes one or more :class:`~doctor.probes.metrics.detect.Series` (per run, per rank),
kept apart; ``build`` runs the detectors of :mod:`~doctor.probes.metrics.detect` and folds them
into ``metrics.*`` (:mod:`~doctor.probes.metrics.summary`). Nothing here is secret-bearing
(numbers and metric names); free text is never copied to facts.

One module per format under ``readers/``; :mod:`~doctor.probes.metrics.formats` picks the reader,
:mod:`~doctor.probes.metrics.names` the metric a name stands for, and
:mod:`~doctor.probes.metrics.table` is the pandas library API (``load_table``, ``analyze``),
re-exported here. pandas and numpy are imported only where they are needed, never when the
probe is loaded.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, ClassVar

from doctor.probes.metrics.formats import carries_metric_lines, owns, read_series
from doctor.probes.metrics.names import canonical
from doctor.probes.metrics.readers.csv import read_csv
from doctor.probes.metrics.readers.jsonl import read_json, read_jsonl
from doctor.probes.metrics.readers.text import read_text
from doctor.probes.metrics.readers.tfevents import (
    masked_crc32c,
    merge_tensorboard,
    pb_fields,
    read_tfevents,
    tfrecords,
)
from doctor.probes.metrics.rows import Rows

from doctor.evidence.contract import Hints, Parsed, Probe, Sample

__all__ = [
    "PROBE", "MetricsProbe", "Rows", "analyze", "canonical", "load_series", "load_table",
    "masked_crc32c", "merge_tensorboard", "pb_fields", "read_csv", "read_json", "read_jsonl",
    "read_text", "read_tfevents", "summarize", "table_series", "tfrecords", "to_table",
]


class MetricsProbe(Probe):
    name: ClassVar[str] = "metrics"
    title: ClassVar[str] = "Training metrics"
    collects: ClassVar[str] = (
        "Loss, grad norm, learning rate, fp16 loss scale, skipped steps, step and data time from "
        "CSV/JSONL/JSON, TensorBoard event files and trainer log lines (HF, Megatron, DeepSpeed, "
        "Lightning); only numbers and metric names are kept."
    )
    priority: ClassVar[int] = 70  # specific shapes; ahead of generic text-log readers
    build_order: ClassVar[int] = 60
    follow_ups: ClassVar[dict[str, dict[str, Any]]] = {"metrics": {}}
    shows_state: ClassVar[bool] = True
    max_bytes: ClassVar[int] = 2 * 2**30  # a 10M-row CSV is ~400 MiB; line formats cap lower
    facts_schema: ClassVar[dict[str, str]] = {
        "metrics.n_series": "int: metric series read (one per file, run and rank)",
        "metrics.series": "list<map>: up to 32 series, worst first: name, file, format, rank, run, rows, "
                          "first_step, last_step, metrics, state (ok|nan|diverged|spiky|overflow), step_from",
        "metrics.series[].name": "string: series key (file, then run and rank when the file holds several)",
        "metrics.series[].state": "string: ok | nan | diverged | spiky | overflow",
        "metrics.series[].rank": "int|null: rank of the series when known",
        "metrics.series[].step_from": "string: column | line_order | epoch | row: where step numbers come from",
        "metrics.events": "list<map>: up to 50 detected events, most severe first: kind (nan | spike | "
                          "divergence | grad_explosion | loss_scale_collapse | skipped_steps | lr_jump | resume | "
                          "data_restart | plateau), step, value, zscore (float|null), series, detail",
        "metrics.events[].kind": "string: event kind (see metrics.events)",
        "metrics.events[].step": "int: step where it starts",
        "metrics.events[].detail": "string: one readable line",
        "metrics.first_nan_step": "int: first step whose loss is NaN or Inf (earliest over series), -1 when none",
        "metrics.nan": "map: the first non-finite loss: step, value (nan|inf|-inf), series, count, recovered "
                       "(finite again later), last_finite_step, last_finite_value, context, detail",
        "metrics.nan.step": "int: first non-finite step",
        "metrics.nan.detail": "string: one readable line",
        "metrics.nan.summary": "string: the detail and what changed shortly before, one sentence",
        "metrics.nan.context": "list<string>: what changed in the steps before (LR jumps, resumes, grad-norm explosion, loss-scale collapse)",
        "metrics.nan.recovered": "bool: the loss was finite again later (skipped batch)",
        "metrics.spikes": "list<map>: up to 20 loss spikes, largest first: step, peak_step, value, baseline, "
                          "zscore, ratio, points, recovered, recovery_steps (-1 if not), ongoing, series, context, detail",
        "metrics.spikes[].step": "int: first step above the threshold",
        "metrics.spikes[].recovered": "bool: the loss came back near its pre-spike level within 5 windows",
        "metrics.spikes[].ongoing": "bool: the run ends before recovery could be judged",
        "metrics.spikes[].zscore": "float: robust z-score (median/MAD of the previous window) at the peak",
        "metrics.spikes[].detail": "string: one readable line",
        "metrics.spikes[].summary": "string: the detail and what changed shortly before",
        "metrics.spikes[].peak_step": "int: step of the highest point",
        "metrics.spikes[].context": "list<string>: what changed shortly before",
        "metrics.n_spikes": "int: spike events found over all series (before capping)",
        "metrics.n_spikes_recovered": "int: spikes (in metrics.spikes) that recovered",
        "metrics.divergence": "map: sustained rise of the loss: detected, step, from_value, to_value, ratio, "
                              "after_spike, points (how long the rise lasts), best, best_step (best window median and "
                              "where), tail (median of the last window), series, context, detail",
        "metrics.divergence.detected": "bool: the last window sits well above the best level reached",
        "metrics.divergence.step": "int: where the sustained rise starts",
        "metrics.divergence.detail": "string: one readable line",
        "metrics.divergence.summary": "string: the detail and what changed shortly before",
        "metrics.divergence.context": "list<string>: what changed shortly before",
        "metrics.loss": "map: main loss series summary: series, rows, first, last, min, min_step, median, max, window",
        "metrics.loss.series": "string: which series the summary is for",
        "metrics.loss_scale": "map: dynamic loss scale (fp16): series, rows, initial, final, min, min_step, max, "
                              "peak (post-calibration reference), drop_pow2 (halvings from peak to min), decreases, "
                              "increases, calibration_decreases, skipped_steps, skipped_share, skipped_after_calibration, "
                              "skipped_share_after_calibration, skipped_source (logged | scale_decreases), first_skip_step, "
                              "collapsed, collapse_step, many_skipped, context, detail",
        "metrics.loss_scale.collapsed": "bool: the scale fell to the minimum (1) or 2**10 below its post-calibration peak",
        "metrics.loss_scale.collapse_step": "int: step where the final fall began",
        "metrics.loss_scale.many_skipped": "bool: skipped steps after calibration >= 10 and >= 5% of steps",
        "metrics.loss_scale.skipped_steps": "int: steps skipped for overflow (logged, or one per scale decrease)",
        "metrics.loss_scale.skipped_after_calibration": "int: skipped steps after the initial calibration",
        "metrics.loss_scale.first_skip_after_calibration": "int: first skipped step after calibration, -1 when none",
        "metrics.loss_scale.skips_before_nan": "int: skipped steps after calibration and before the first non-finite loss (all of them when the loss never went NaN)",
        "metrics.loss_scale.floor_step": "int: first step with the scale at or below the floor (1)",
        "metrics.loss_scale.detail": "string: one readable line",
        "metrics.loss_scale.summary": "string: the detail and what changed shortly before",
        "metrics.loss_scale.context": "list<string>: what changed shortly before the collapse",
        "metrics.grad_norm": "map: grad-norm summary: series, rows, median, p90, max, max_step, nonfinite, "
                             "first_nonfinite_step, explosion, explosion_step, explosion_ratio, leads_loss_by, context, detail",
        "metrics.grad_norm.explosion": "bool: >= 10x its trailing median for >= 2 points (or followed by NaN/divergence), or 100x growth",
        "metrics.grad_norm.nonfinite": "int: logged grad norms that are NaN or Inf",
        "metrics.grad_norm.nonfinite_tail": "int: consecutive NaN/Inf grad norms at the end of the series (0: the last one is finite)",
        "metrics.grad_norm.nonfinite_tail_step": "int: first step of that non-finite tail, -1 when none",
        "metrics.grad_norm.explosion_step": "int: first explosion step, -1 when none",
        "metrics.grad_norm.leads_loss_by": "int: steps from the explosion to the first loss NaN/divergence/unrecovered spike, -1 when none follows",
        "metrics.grad_norm.detail": "string: one readable line",
        "metrics.grad_norm.summary": "string: the detail and what changed shortly before",
        "metrics.grad_norm.context": "list<string>: what changed shortly before the explosion",
        "metrics.lr_jumps": "list<map>: abrupt learning-rate changes: step, from, to, ratio, series",
        "metrics.restarts": "list<map>: kind (resume: step went back | data_restart: epoch/samples went back), step, from_step, series",
        "metrics.plateau": "map: detected, since_step, improvement (share over the last quarter), level, series (information only)",
        "metrics.step_time": "map: step time in seconds of the series with the most rows: median, p90, mean, max, n, unit, series",
        "metrics.step_time.median": "float: median seconds per step",
        "metrics.step_time.p90": "float: 90th percentile seconds per step",
        "metrics.data_time": "map: data-loading time in seconds: median, p90, mean, max, n, unit, series",
        "metrics.data_time_share": "float: sum(data_time) / sum(step_time) (assumes step time includes data loading), 0-1",
        "metrics.curves": "map<string,map>: downsampled curves for charts per metric (loss, grad_norm, lr, loss_scale): series, steps, values",
        "metrics.params": "map<string,float>: detector thresholds in effect (MLDOCTOR_METRICS_<NAME> overrides)",
        "metrics.by_rank": "map<string,map>: per rank: first_nan_step, n_spikes, diverged, loss_last",
    }

    def sniff(self, sample: Sample) -> bool:
        """Own the structured formats; trainer text logs are read through ``also_sniff``."""
        return owns(sample)

    def also_sniff(self, sample: Sample) -> bool:
        """Text logs are the logs probe's; metrics reads those that carry metric lines too."""
        return carries_metric_lines(sample)

    def parse(self, path: Path, rel: str, hints: Hints) -> list[Parsed]:
        return [Parsed(self.name, rel, s, s.rank, hints.host) for s in read_series(path, rel, hints)]

    def build(self, parsed: list[Parsed], facts: dict[str, Any]) -> None:
        from doctor.probes.metrics.detect import Params
        from doctor.probes.metrics.summary import summarize

        options = ((facts.get("meta") or {}).get("options") or {}).get("metrics")
        params = Params.from_env(options if isinstance(options, dict) else None)
        facts[self.name] = summarize(merge_tensorboard([p.data for p in parsed]), params)


PROBE = MetricsProbe()

#: The library API (pandas tables, facts from paths) and ``summarize``, loaded on first use:
#: they import numpy at the top, which loading the probe for every ``mldoctor`` run must not pay.
_LAZY = {
    "summarize": "summary",
    "load_series": "table", "to_table": "table", "load_table": "table", "table_series": "table",
    "analyze": "table",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
