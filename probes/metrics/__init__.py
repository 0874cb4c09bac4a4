"""Training metrics: loss, grad norm, learning rate, fp16 loss scale, step and data time.

Reads what training jobs already write, with any reasonable column names (``loss``,
``train/loss``, ``lm loss``, ``grad_norm``, ``learning_rate``, ``loss_scale``, ``step`` /
``iteration`` / ``global_step``, ``step_time`` / ``elapsed``, ``data_time``):

- CSV (any delimiter; W&B exports with ``<run> - <metric>`` columns become one series per run),
- JSONL (one record per line, nested one level: ``{"metrics": {"loss": ..}}``), and HF
  ``trainer_state.json`` (its ``log_history``),
- TensorBoard event files (TFRecord framing and the few protobuf fields of Event/Summary,
  decoded here: no TensorFlow, no protobuf package),
- partial evidence (:mod:`~doctor.probes.metrics.partial`): one NaN/Inf loss line, a jump in a
  few points, a stated before/after slowdown, kept apart in ``metrics.partial`` for the rules
  that say what a longer series would add;
- trainer log lines: HF Trainer dicts, Megatron ``iteration N/M | lm loss: ...`` lines,
  DeepSpeed overflow messages, Lightning progress bars, and ``step N ... loss X`` lines
  (nanoGPT, llm.c and most hand-written loops); any other line of ``key: value`` / ``key=value``
  / ``| key value |`` cells, tqdm postfixes, Keras bars, epoch summaries, Markdown tables and
  pasted before/after timings through one fallback grammar (``readers/kvline.py``).

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
from doctor.evidence.errors import EvidenceError
from doctor.evidence.sections import Section, SectionContext

__all__ = [
    "PROBE", "MetricsProbe", "Rows", "analyze", "canonical", "load_series", "load_table",
    "masked_crc32c", "merge_tensorboard", "pb_fields", "read_csv", "read_json", "read_jsonl",
    "read_text", "read_tfevents", "summarize", "table_series", "tfrecords", "to_table",
]


class MetricsProbe(Probe):
    name: ClassVar[str] = "metrics"
    title: ClassVar[str] = "Training metrics"
    collects: ClassVar[str] = (
        "Loss, grad norm, learning rate, fp16 loss scale, skipped steps, step and data time, throughput "
        "from CSV/JSONL/JSON, TensorBoard event files and log lines or pastes of any key-value shape "
        "(HF, Megatron, DeepSpeed, Lightning, fairseq, Keras, tables); only numbers and metric names are kept."
    )
    priority: ClassVar[int] = 70  # specific shapes; ahead of generic text-log readers
    also_reads: ClassVar[frozenset[str] | None] = frozenset({"logs"})  # trainer text logs only
    #: A ticket's sentences state timings too ("1.2 s/it before, 3.4 s/it after"); only stated
    #: changes and NaN/Inf losses are read from prose (``read_text(prose=True)``).
    reads_prose: ClassVar[bool] = True
    joins_pieces: ClassVar[bool] = True  # one log or table pasted over two fences is one file
    build_order: ClassVar[int] = 60
    follow_ups: ClassVar[dict[str, dict[str, Any]]] = {"metrics": {}}
    shows_state: ClassVar[bool] = True
    max_bytes: ClassVar[int] = 2 * 2**30  # a 10M-row CSV is ~400 MiB; line formats cap lower
    fixtures: ClassVar[tuple[str, ...]] = (
        "tests/fixtures/metrics/*/metrics.*",
        "tests/fixtures/metrics/*/events.out.tfevents.*",
        "tests/fixtures/slow/steps/*/metrics.jsonl",
    )
    facts_schema: ClassVar[dict[str, str]] = {
        "metrics.n_series": "int: metric series read (one per file, run and rank)",
        "metrics.series": "list<map>: up to 32 series, worst first: name, file, format, rank, run, rows, "
                          "first_step, last_step, metrics, state (ok|nan|diverged|spiky|overflow), step_from",
        "metrics.series[].name": "string: series key (file, then run and rank when the file holds several)",
        "metrics.series[].state": "string: ok | nan | diverged | spiky | overflow",
        "metrics.series[].rank": "int|null: rank of the series when known",
        "metrics.series[].step_from": "string: column | line_order | epoch | row: where step numbers come from",
        "metrics.series[].file": "string: the file it was read from",
        "metrics.series[].format": "string: the reader that understood it (csv, jsonl, tensorboard, a trainer log format, ...)",
        "metrics.series[].run": "string: run name when the file holds several runs, else null",
        "metrics.series[].rows": "int: rows (logged steps) read",
        "metrics.series[].first_step": "int: first step logged",
        "metrics.series[].last_step": "int: last step logged",
        "metrics.series[].metrics": "list<string>: canonical metric names it carries (loss, grad_norm, lr, loss_scale, ...)",
        "metrics.events": "list<map>: up to 50 detected events, most severe first: kind (nan | spike | "
                          "divergence | grad_explosion | loss_scale_collapse | skipped_steps | lr_jump | resume | "
                          "data_restart | plateau), step, value, zscore (float|null), series, detail",
        "metrics.events[].kind": "string: event kind (see metrics.events)",
        "metrics.events[].step": "int: step where it starts",
        "metrics.events[].detail": "string: one readable line",
        "metrics.events[].value": "float|string: the metric's value there; 'nan', 'inf' or '-inf' for a non-finite loss",
        "metrics.events[].zscore": "float: robust z-score of a spike, null for other kinds",
        "metrics.events[].series": "string: series it was found in",
        "metrics.first_nan_step": "int: first step whose loss is NaN or Inf (earliest over series), -1 when none",
        "metrics.nan": "map: the first non-finite loss: step, value (nan|inf|-inf), series, count, recovered "
                       "(finite again later), last_finite_step, last_finite_value, context, detail",
        "metrics.nan.step": "int: first non-finite step",
        "metrics.nan.detail": "string: one readable line",
        "metrics.nan.summary": "string: the detail and what changed shortly before, one sentence",
        "metrics.nan.context": "list<string>: what changed in the steps before (LR jumps, resumes, grad-norm explosion, loss-scale collapse)",
        "metrics.nan.recovered": "bool: the loss was finite again later (skipped batch)",
        "metrics.nan.value": "string: nan | inf | -inf",
        "metrics.nan.series": "string: series it was found in",
        "metrics.nan.count": "int: non-finite loss values in that series",
        "metrics.nan.last_finite_step": "int: last step with a finite loss before it, null when none",
        "metrics.nan.last_finite_value": "float: the loss at that step",
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
        "metrics.spikes[].value": "float: loss at the peak",
        "metrics.spikes[].baseline": "float: median loss of the window before the spike",
        "metrics.spikes[].ratio": "float: peak divided by the baseline",
        "metrics.spikes[].points": "int: points above the threshold",
        "metrics.spikes[].recovery_steps": "int: steps from the start to recovery, -1 when it did not recover",
        "metrics.spikes[].series": "string: series it was found in",
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
        "metrics.divergence.from_value": "float: the best window median before the rise",
        "metrics.divergence.to_value": "float: median of the last window",
        "metrics.divergence.ratio": "float: to_value / from_value, null when the best level is not positive",
        "metrics.divergence.after_spike": "bool: a spike started near the rise",
        "metrics.divergence.points": "int: points from the start of the rise to the end of the run",
        "metrics.divergence.best": "float: best level of the loss: the median of the 3 lowest window medians before the last window",
        "metrics.divergence.best_step": "int: where that best window starts",
        "metrics.divergence.tail": "float: median of the last window",
        "metrics.divergence.noise": "float: pooled robust scale of one point: the median scale of the windows from the best level up to the last window",
        "metrics.divergence.zscore": "float: rise of the last window's median over the best level, in standard errors of a window median (noise pooled)",
        "metrics.divergence.series": "string: series it was found in",
        "metrics.loss": "map: main loss series summary: series, rows, first, last, min, min_step, median, max, window",
        "metrics.loss.series": "string: which series the summary is for",
        "metrics.loss.rows": "int: finite loss points",
        "metrics.loss.first": "float: first loss value",
        "metrics.loss.last": "float: last loss value",
        "metrics.loss.min": "float: lowest loss",
        "metrics.loss.min_step": "int: step of the lowest loss",
        "metrics.loss.median": "float: median loss",
        "metrics.loss.max": "float: highest loss",
        "metrics.loss.window": "int: points per window used by the detectors",
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
        "metrics.loss_scale.series": "string: series it was read from",
        "metrics.loss_scale.rows": "int: finite loss-scale points (0 when only skip flags were logged)",
        "metrics.loss_scale.initial": "float: first scale",
        "metrics.loss_scale.final": "float: last scale",
        "metrics.loss_scale.min": "float: lowest scale",
        "metrics.loss_scale.min_step": "int: step of the lowest scale",
        "metrics.loss_scale.max": "float: highest scale",
        "metrics.loss_scale.peak": "float: highest scale after the initial calibration (the reference for a collapse)",
        "metrics.loss_scale.drop_pow2": "float: halvings from that peak down to the lowest scale",
        "metrics.loss_scale.decreases": "int: points where the scale went down",
        "metrics.loss_scale.increases": "int: points where the scale went up",
        "metrics.loss_scale.calibration_decreases": "int: decreases in the initial calibration run",
        "metrics.loss_scale.skipped_share": "float: skipped steps / steps",
        "metrics.loss_scale.skipped_share_after_calibration": "float: skipped steps after calibration / steps",
        "metrics.loss_scale.skipped_source": "string: logged (the trainer logs skips) | scale_decreases (one per decrease)",
        "metrics.loss_scale.first_skip_step": "int: first skipped step, -1 when none",
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
        "metrics.grad_norm.series": "string: series it was read from",
        "metrics.grad_norm.rows": "int: grad-norm points",
        "metrics.grad_norm.median": "float: median grad norm",
        "metrics.grad_norm.p90": "float: 90th percentile grad norm",
        "metrics.grad_norm.max": "float: highest grad norm",
        "metrics.grad_norm.max_step": "int: step of the highest grad norm",
        "metrics.grad_norm.first_nonfinite_step": "int: first step with a NaN/Inf grad norm, -1 when none",
        "metrics.grad_norm.explosion_ratio": "float: grad norm over its trailing median at the first explosion",
        "metrics.lr_jumps": "list<map>: abrupt learning-rate changes: step, from, to, ratio, series",
        "metrics.lr_jumps[].step": "int: step of the change",
        "metrics.lr_jumps[].from": "float: learning rate before",
        "metrics.lr_jumps[].to": "float: learning rate after",
        "metrics.lr_jumps[].ratio": "float: to / from",
        "metrics.lr_jumps[].series": "string: series it was found in",
        "metrics.restarts": "list<map>: kind (resume: step went back | data_restart: epoch/samples went back), step, from_step, series",
        "metrics.restarts[].kind": "string: resume (the step went back) | data_restart (epoch or sample count went back)",
        "metrics.restarts[].step": "int: step logged after the jump back",
        "metrics.restarts[].from_step": "int: step logged before it (-1 when a resume marker does not say)",
        "metrics.restarts[].series": "string: series it was found in",
        "metrics.plateau": "map: detected, since_step, improvement (share over the last quarter), level, series (information only)",
        "metrics.plateau.detected": "bool: the loss barely improved over the last quarter of the run",
        "metrics.plateau.since_step": "int: start of that last quarter",
        "metrics.plateau.improvement": "float: relative improvement over the last quarter",
        "metrics.plateau.level": "float: best window median in the last quarter",
        "metrics.plateau.series": "string: series it was found in",
        "metrics.step_time": "map: step time in seconds of the series with the most rows: median, p90, mean, max, n, unit, series",
        "metrics.step_time.median": "float: median seconds per step",
        "metrics.step_time.p90": "float: 90th percentile seconds per step",
        "metrics.step_time.mean": "float: mean seconds per step",
        "metrics.step_time.max": "float: longest step in seconds",
        "metrics.step_time.n": "int: step times read",
        "metrics.step_time.unit": "string: always s (converted from the logged unit)",
        "metrics.step_time.series": "string: series it was read from",
        "metrics.data_time": "map: data-loading time in seconds: median, p90, mean, max, n, unit, series",
        "metrics.data_time.median": "float: median data-loading seconds per step",
        "metrics.data_time.p90": "float: 90th percentile",
        "metrics.data_time.mean": "float: mean",
        "metrics.data_time.max": "float: longest",
        "metrics.data_time.n": "int: data times read",
        "metrics.data_time.unit": "string: always s",
        "metrics.data_time.series": "string: series it was read from",
        "metrics.step_time.first": "float: first step time read (seconds)",
        "metrics.step_time.last": "float: last step time read (seconds); with first, a pasted before/after",
        "metrics.data_time.first": "float: first data-loading time read (seconds)",
        "metrics.data_time.last": "float: last data-loading time read (seconds)",
        "metrics.throughput": "map: items (samples, tokens, words) per second of the series with the most such rows: "
                              "median, p90, mean, min, max, n, first, last, last_over_first, unit, series",
        "metrics.throughput.median": "float: median items per second",
        "metrics.throughput.p90": "float: 90th percentile items per second",
        "metrics.throughput.mean": "float: mean items per second",
        "metrics.throughput.min": "float: lowest items per second",
        "metrics.throughput.max": "float: highest items per second",
        "metrics.throughput.n": "int: throughput values read",
        "metrics.throughput.first": "float: first throughput read",
        "metrics.throughput.last": "float: last throughput read",
        "metrics.throughput.last_over_first": "float: last / first (0.25: a fall to a quarter)",
        "metrics.throughput.unit": "string: always 'per s' (items as logged: samples, tokens or words)",
        "metrics.throughput.series": "string: series it was read from",
        "metrics.data_time_share": "float: sum(data_time) / sum(step_time) (assumes step time includes data loading), 0-1",
        "metrics.curves": "map<string,map>: downsampled curves for charts per metric (loss, grad_norm, lr, loss_scale): series, steps, values",
        "metrics.curves[].series": "string: series the curve comes from",
        "metrics.curves[].steps": "list<int>: steps of the kept points (min and max of each bucket)",
        "metrics.curves[].values": "list<float|string>: their values; 'nan', 'inf', '-inf' mark non-finite points",
        "metrics.params": "map<string,float>: detector thresholds in effect (MLDOCTOR_METRICS_<NAME> overrides)",
        "metrics.partial": "map: partial evidence (a line or a few points, too little for the series detectors): "
                           "nan, jump, slowdown, rise, grad_growth; only the keys something was found for",
        "metrics.partial.nan": "map: a NaN/Inf loss in a series of one logged value: value, series, count, finite_elsewhere, detail",
        "metrics.partial.nan.value": "string: nan | inf | -inf",
        "metrics.partial.nan.series": "string: the piece it was read from",
        "metrics.partial.nan.count": "int: such one-value pieces",
        "metrics.partial.nan.finite_elsewhere": "bool: another piece logs a finite loss",
        "metrics.partial.nan.detail": "string: one readable line",
        "metrics.partial.jump": "map: in a loss series too short for the spike detector, the largest jump to >= 2x the "
                                "highest value before it: step, from_value, to_value, ratio, points, later_points, "
                                "stays_up, recovered, series, detail",
        "metrics.partial.jump.step": "int: step (or log entry) of the jump",
        "metrics.partial.jump.from_value": "float: highest loss before it",
        "metrics.partial.jump.to_value": "float: loss at the jump",
        "metrics.partial.jump.ratio": "float: to_value / from_value",
        "metrics.partial.jump.points": "int: loss points in the series",
        "metrics.partial.jump.later_points": "int: points logged after the jump",
        "metrics.partial.jump.stays_up": "int: later points still at least 1.5x the earlier highest value",
        "metrics.partial.jump.recovered": "bool: the last point is back below 1.5x the earlier highest value",
        "metrics.partial.jump.series": "string: series it was found in",
        "metrics.partial.jump.detail": "string: one readable line",
        "metrics.partial.slowdown": "map: a stated before/after change of step time or throughput at least 1.25x slower: "
                                    "metric, before, after, factor, series, data_before, data_after, data_added_share, detail",
        "metrics.partial.slowdown.metric": "string: step_time | throughput",
        "metrics.partial.slowdown.before": "float: the value before (seconds per step, or items per second)",
        "metrics.partial.slowdown.after": "float: the value after",
        "metrics.partial.slowdown.factor": "float: how many times slower (>= 1.25)",
        "metrics.partial.slowdown.series": "string: the paste it was read from",
        "metrics.partial.slowdown.data_before": "float: data-loading seconds stated before, when stated",
        "metrics.partial.slowdown.data_after": "float: data-loading seconds stated after",
        "metrics.partial.slowdown.data_added_share": "float: share of the added step time that the added data time "
                                                     "accounts for (0-1), when both are stated",
        "metrics.partial.slowdown.detail": "string: one readable line",
        "metrics.partial.rise": "map: in a finite loss series too short for the divergence detector, the last two values "
                                "at least 1.5x the lowest before them and above the first: low_step, low_value, "
                                "first_value, last_value, ratio, points, series, detail",
        "metrics.partial.rise.low_step": "int: step (or log entry) of the lowest value",
        "metrics.partial.rise.low_value": "float: lowest loss before the rise",
        "metrics.partial.rise.first_value": "float: first loss of the series",
        "metrics.partial.rise.last_value": "float: last loss of the series",
        "metrics.partial.rise.ratio": "float: last_value / low_value",
        "metrics.partial.rise.points": "int: loss points in the series",
        "metrics.partial.rise.series": "string: series it was found in",
        "metrics.partial.rise.detail": "string: one readable line",
        "metrics.partial.grad_growth": "map: in a grad-norm series too short for the explosion detector, a norm rising on "
                                       "each of its last points to >= 10x the lowest before it (and NaN/Inf after, or "
                                       ">= 100x, or >= 1e4): from_step, from_value, to_step, to_value, ratio, points, "
                                       "then_nonfinite, nonfinite_step, series, detail",
        "metrics.partial.grad_growth.from_step": "int: step of the lowest norm before the growth",
        "metrics.partial.grad_growth.from_value": "float: that norm",
        "metrics.partial.grad_growth.to_step": "int: step of the last finite norm",
        "metrics.partial.grad_growth.to_value": "float: that norm",
        "metrics.partial.grad_growth.ratio": "float: to_value / the lowest norm before it",
        "metrics.partial.grad_growth.points": "int: grad-norm points in the series",
        "metrics.partial.grad_growth.then_nonfinite": "bool: the norm turned NaN/Inf after the growth",
        "metrics.partial.grad_growth.nonfinite_step": "int: step of the first NaN/Inf norm, -1 when none",
        "metrics.partial.grad_growth.series": "string: series it was found in",
        "metrics.partial.grad_growth.detail": "string: one readable line",
        "metrics.by_rank": "map<string,map>: per rank: first_nan_step, n_spikes, diverged, loss_last",
        "metrics.by_rank[].first_nan_step": "int: first non-finite loss step of the rank's series, -1 when none",
        "metrics.by_rank[].n_spikes": "int: loss spikes in it",
        "metrics.by_rank[].diverged": "bool: its loss diverged",
        "metrics.by_rank[].loss_last": "float: its last loss value",
    }

    def sniff(self, sample: Sample) -> bool:
        """Own the structured formats; trainer text logs are read through ``also_sniff``."""
        return owns(sample)

    def also_sniff(self, sample: Sample) -> bool:
        """Text logs are the logs probe's; metrics reads those that carry metric lines too."""
        return carries_metric_lines(sample)

    def parse(self, path: Path, rel: str, hints: Hints) -> list[Parsed] | None:  # type: ignore[override]
        if rel.endswith(" prose"):  # a ticket's sentences (doctor.evidence.ticket): most state no number
            try:
                series = read_text(path, rel, hints, prose=True)
            except EvidenceError:
                # None, not []: the dispatcher counts a kind as present for any list, and prose
                # without numbers must not make "metrics" a kind of the evidence (nor an error).
                return None
        else:
            series = read_series(path, rel, hints)
        return [Parsed(self.name, rel, s, s.rank, hints.host) for s in series]

    def unexplained_state(self, facts: dict[str, Any]) -> dict[str, str] | None:
        """A stated slowdown that no rule explains is still a slow job, not a healthy one; the
        verdict says so and names no cause (the evidence does not show one)."""
        slow = ((facts.get(self.name) or {}).get("partial") or {}).get("slowdown")
        if not slow:
            return None
        detail = str(slow.get("detail") or "a stated slowdown")
        return {"state": "slow", "what": detail,
                "summary": f"The job is slow: {detail}. The evidence does not show why (slow, cause not "
                           "determined); a step-time breakdown (data time next to step time in the job's metrics) "
                           "or a sampling profile (mldoctor diagnose --symptom slow on the running job) would."}

    def build(self, parsed: list[Parsed], facts: dict[str, Any]) -> None:
        from doctor.probes.metrics.detect import Params
        from doctor.probes.metrics.summary import summarize

        options = ((facts.get("meta") or {}).get("options") or {}).get("metrics")
        params = Params.from_env(options if isinstance(options, dict) else None)
        facts[self.name] = summarize(merge_tensorboard([p.data for p in parsed]), params)

    def report_sections(self, facts: dict[str, Any], context: SectionContext) -> list[Section]:
        from doctor.probes.metrics.report import sections

        return sections(facts, context)


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
