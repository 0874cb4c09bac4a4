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

Each file becomes one or more :class:`~doctor.probes.metrics_detect.Series` (per run, per rank), kept
apart; ``build`` runs the detectors of :mod:`doctor.probes.metrics_detect` and writes ``metrics.*``.
Nothing here is secret-bearing (numbers and metric names); free text is never copied to facts.

pandas and numpy are imported inside the functions that need them.
"""

from __future__ import annotations

import json
import math
import re
import struct
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

from doctor.evidence.contract import Hints, Parsed, Probe, Sample
from doctor.evidence.errors import EvidenceError
from doctor.evidence.redact import scrub

LINE_FORMAT_MAX = 256 * 2**20  # line-by-line readers (JSONL, text, TensorBoard) stop here
CSV_RANGE_BYTES = 32 * 2**20  # one parse task: small enough to spread over cores
CSV_FLOAT32_ROWS = 1_000_000  # longer CSV files keep loss-like values as float32
_COMPACT = frozenset({"loss", "grad_norm", "lr", "loss_scale"})  # never clocks or counters

# -- metric names ------------------------------------------------------------------------------

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
                  "data_load_time", "data_wait_time", "time_data", "data_loading", "dataload_time"},
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
_TRAINING = ("loss", "grad_norm", "lr", "loss_scale", "step_time", "data_time")  # logged every step


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


# -- assembling rows from line-oriented formats ------------------------------------------------

class Rows:
    """Rows keyed by step in arrival order; a repeated step merges, a step going back starts a row.

    A NaN kept as a value is a logged NaN (a gap is a row without the metric); that is read off
    the values at the end, so adding a value is two dictionary operations (a million-line JSONL
    file goes through here once per line).
    """

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.vals: dict[str, dict[int, float]] = {}
        self.marks: list[dict[str, Any]] = []

    def row_for(self, step: int) -> int:
        if not self.steps or self.steps[-1] != step:
            self.steps.append(step)
        return len(self.steps) - 1

    def put(self, row: int, metric: str, value: float) -> None:
        d = self.vals.get(metric)
        if d is None:
            d = self.vals[metric] = {}
        d[row] = value

    def add(self, step: int, values: dict[str, float]) -> None:
        steps = self.steps
        if not steps or steps[-1] != step:
            steps.append(step)
        row = len(steps) - 1
        vals = self.vals
        for m, v in values.items():
            d = vals.get(m)
            if d is None:
                d = vals[m] = {}
            d[row] = v

    @property
    def last_step(self) -> int | None:
        return self.steps[-1] if self.steps else None

    def series(self, name: str, file: str, fmt: str, rank: int | None = None, run: str | None = None,
               step_from: str = "column") -> Any:
        import numpy as np
        from doctor.probes.metrics_detect import Series

        n = len(self.steps)
        cols, nl = {}, {}
        for m, d in self.vals.items():
            a = np.full(n, np.nan)
            if d:
                idx = np.fromiter(d.keys(), np.int64, len(d))
                v = np.fromiter(d.values(), np.float64, len(d))
                a[idx] = v
                bad = np.isnan(v)
                if bad.any():
                    mask = np.zeros(n, bool)
                    mask[idx[bad]] = True
                    nl[m] = mask
            cols[m] = a
        s = Series(name=name, file=file, fmt=fmt, step=np.asarray(self.steps, np.int64), cols=cols,
                   nan_logged=nl, rank=rank, run=run, step_from=step_from, marks=list(self.marks))
        _postprocess(s)
        return s


def _num(text: str) -> float:
    t = text.strip().lower().lstrip("[").rstrip("]")
    if t in ("nan", "-nan", "+nan", "nan(ind)", "-nan(ind)"):
        return math.nan
    if t in ("inf", "+inf", "infinity", "+infinity"):
        return math.inf
    if t in ("-inf", "-infinity"):
        return -math.inf
    return float(t)


def _postprocess(s: Any) -> None:
    """Running totals -> per-step values, wall clock -> step time, fractional epochs kept."""
    import numpy as np

    for m in ("step_time", "data_time"):
        v = s.cols.get(m)
        if v is None:
            continue
        head = v[:100_000]  # the shape shows in the first rows; no pass over ten million
        fin = head[np.isfinite(head)]
        if len(fin) >= 5:
            d = np.diff(fin)
            # A cumulative clock ("elapsed" since start): increasing, and large against its steps.
            if (d > 0).mean() >= 0.95 and np.median(fin) > 10 * max(np.median(d), 1e-12):
                fin = v[np.isfinite(v)]
                d = np.diff(fin)
                out = np.full(len(v), np.nan)
                idx = np.flatnonzero(np.isfinite(v))
                out[idx[1:]] = d
                s.cols[m] = out
    wall = s.cols.pop("wall", None)
    if wall is not None and "step_time" not in s.cols:
        idx = np.flatnonzero(np.isfinite(wall))
        if len(idx) >= 5:
            out = np.full(len(wall), np.nan)
            dw = np.diff(wall[idx])
            ds = np.diff(s.step[idx]).astype(float)
            ok = ds > 0
            out[idx[1:][ok]] = dw[ok] / ds[ok]  # seconds per step between two logged points
            if np.nanmedian(out) > 0:
                s.cols["step_time"] = out


# -- text logs ---------------------------------------------------------------------------------

_NUMRE = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf(?:inity)?)"
_RANK_PREFIX = re.compile(r"^\s*(?:\[(?:rank|RANK)\s*(\d+)\]\s*:?|(?:rank|RANK)\s*(\d+)(?:/\d+)?\s*[:|]|(\d{1,5}):\s)")
_MEGATRON = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|")
_HF_DICT = re.compile(r"\{\s*['\"][A-Za-z_][\w/.\- ]*['\"]\s*:")
_HF_PAIR = re.compile(r"['\"]([A-Za-z_][\w/.\- ]*)['\"]\s*:\s*(" + _NUMRE + r")", re.I)
_STEP = re.compile(r"(?<![\w/])(?:global[_ ]step|step|iteration|iter|it)\s*[:=#]?\s*\[?\s*(\d+)(?:\s*/\s*(\d+))?(?![\w.])", re.I)
_PAIR = re.compile(r"([A-Za-z][A-Za-z0-9_/.\- ]{0,48}?)\s*(?:[:=]\s*|\s+)\[?\s*(" + _NUMRE + r")(\s*ms\b)?", re.I)
_TQDM = re.compile(r"Epoch\s+(\d+)\s*:.*?\|\s*(\d+)\s*/\s*(\d+)\s*\[[^\]]*?,\s*([^\]]*)\]")
_KV = re.compile(r"([A-Za-z_][\w/.\-]*)\s*=\s*(" + _NUMRE + r")", re.I)
_DS_OVERFLOW_ITER = re.compile(r"Grad overflow on iteration:?\s*(\d+)", re.I)
_DS_ATTEMPT = re.compile(r"(?:OVERFLOW!|overflow!|Overflow detected).*?Attempted loss scale:\s*(" + _NUMRE + r")(?:,\s*reducing to\s*(" + _NUMRE + r"))?", re.I)
_DS_REDUCE = re.compile(r"Reducing dynamic loss scale from\s*(" + _NUMRE + r")\s*to\s*(" + _NUMRE + r")", re.I)
_DS_MIN = re.compile(r"Current loss scale already at minimum", re.I)
_HF_TOTAL = re.compile(r"Total optimization steps\s*=\s*([\d,]+)")
_HF_EPOCHS = re.compile(r"Num Epochs\s*=\s*([\d,]+)")
_WORDS = ("loss", "norm", "lr", "learning", "scale", "overflow", "iteration", "step", "epoch")
_KEY_BYTES = re.compile(rb"[Ll]oss|LOSS|[Oo]verflow|OVERFLOW|grad[_ ]norm")


def _line_metrics(body: str) -> tuple[str, int | None, dict[str, float]] | None:
    """One log line -> (kind, step or None, canonical metrics); None when it holds none."""
    m = _MEGATRON.search(body)
    if m:
        vals: dict[str, float] = {}
        for part in body[m.end():].split("|"):
            name, sep, val = part.rpartition(":")
            if not sep:
                continue
            c = canonical(name)
            if c is None or c[0] in ("step", "rank", "run", "wall"):
                continue
            try:
                v = _num(val.split("/")[0])
            except ValueError:
                continue
            vals.setdefault(c[0], v * c[1])
        return "megatron", int(m.group(1)), vals
    if _HF_DICT.search(body):
        keys = dict(_HF_PAIR.findall(body))
        if "train_runtime" in keys or any(k.startswith("eval_") for k in keys):
            return None  # the end-of-training summary and evaluation dicts
        vals, step = {}, None
        for k, raw in keys.items():
            c = canonical(k)
            if c is None:
                continue
            if c[0] == "step":
                step = int(float(raw))
            elif c[0] not in ("rank", "run", "wall"):
                vals.setdefault(c[0], _num(raw) * c[1])
        return ("hf", step, vals) if vals else None
    m = _TQDM.search(body)
    if m:
        vals = {}
        for k, raw in _KV.findall(m.group(4)):
            c = canonical(k)
            if c and c[0] not in ("step", "rank", "run", "wall", "epoch"):
                vals.setdefault(c[0], _num(raw) * c[1])
        if vals:
            step = int(m.group(1)) * int(m.group(3)) + int(m.group(2))
            vals["epoch"] = float(m.group(1))
            return "lightning", step, vals
        return None
    m = _STEP.search(body)
    if m:
        vals = {}
        for name, raw, ms in _PAIR.findall(body[m.end():]):
            c = canonical(name)
            if c is None or c[0] in ("step", "rank", "run", "wall"):
                continue
            try:
                v = _num(raw)
            except ValueError:
                continue
            vals.setdefault(c[0], v * (1e-3 if ms else c[1]))
        if "loss" in vals or "grad_norm" in vals or "loss_scale" in vals:
            return "steps", int(m.group(1)), vals
    return None


def _is_metric_line(line: str) -> bool:
    low = line.lower()
    if not any(w in low for w in _WORDS):
        return False
    if _DS_ATTEMPT.search(line) or _DS_OVERFLOW_ITER.search(line) or _DS_REDUCE.search(line):
        return True
    body = _RANK_PREFIX.sub("", line, count=1)
    return _line_metrics(body) is not None


def read_text(path: Path, rel: str, hints: Hints) -> list[Any]:
    """Trainer log lines -> one series per rank prefix (or one for the file)."""
    size = path.stat().st_size
    if size > LINE_FORMAT_MAX:
        raise EvidenceError(rel, f"{size / 2**20:.0f} MiB text log is over the {LINE_FORMAT_MAX // 2**20} MiB "
                                 "line reader limit; export the metrics as CSV")
    per_rank: dict[int | None, Rows] = {}
    ordinal: dict[int | None, int] = {}
    kinds: dict[int | None, set[str]] = {}
    hf_total = hf_epochs = None
    with open(path, encoding="utf-8", errors="replace", newline="") as fh:
        for raw in fh:
            for line in raw.replace("\r", "\n").split("\n"):
                if not line:
                    continue
                if hf_total is None and "Total optimization steps" in line:
                    mt = _HF_TOTAL.search(line)
                    hf_total = int(mt.group(1).replace(",", "")) if mt else None
                    continue
                if hf_epochs is None and "Num Epochs" in line:
                    me = _HF_EPOCHS.search(line)
                    hf_epochs = int(me.group(1).replace(",", "")) if me else None
                    continue
                low = line.lower()
                if not any(w in low for w in _WORDS):
                    continue
                pm = _RANK_PREFIX.match(line)
                rank = hints.rank
                body = line
                if pm:
                    rank = int(next(g for g in pm.groups() if g is not None))
                    body = line[pm.end():]
                rows = per_rank.setdefault(rank, Rows())
                if _ds_line(body, rows):
                    kinds.setdefault(rank, set()).add("deepspeed")
                    continue
                got = _line_metrics(body)
                if got is None:
                    continue
                kind, step, vals = got
                kinds.setdefault(rank, set()).add(kind)
                if step is None:
                    ordinal[rank] = ordinal.get(rank, 0) + 1
                    step = ordinal[rank]
                if kind == "megatron" and vals.get("nan_iters", 0) > 0 and "loss" not in vals:
                    vals["loss"] = math.nan  # Megatron drops the NaN loss from the line, counts it here
                rows.add(step, vals)
    out = []
    for rank, rows in per_rank.items():
        if not rows.steps or not any(m in rows.vals for m in ("loss", "grad_norm", "loss_scale", "step_time")):
            continue
        step_from = "column"
        if rank in ordinal:
            step_from = "line_order"
            if hf_total and hf_epochs and "epoch" in rows.vals:
                step_from = _steps_from_epoch(rows, hf_total / hf_epochs) or step_from
        name = rel if len(per_rank) == 1 or rank is None else f"{rel}[rank{rank}]"
        fmt = "+".join(sorted(kinds.get(rank, {"text"})))
        out.append(rows.series(name, rel, f"log:{fmt}", rank=rank, step_from=step_from))
    if not out:
        raise EvidenceError(rel, "no training-metric lines (loss, grad norm, loss scale) found")
    return out


def _steps_from_epoch(rows: Rows, steps_per_epoch: float) -> str | None:
    """HF logs print no step, only a fractional epoch: step = epoch x steps per epoch."""
    ep = rows.vals.get("epoch", {})
    if len(ep) != len(rows.steps):
        return None
    derived = [round(ep[i] * steps_per_epoch) for i in range(len(rows.steps))]
    if any(b <= a for a, b in zip(derived, derived[1:], strict=False)) or derived[0] < 1:
        return None
    rows.steps = derived
    return "epoch"


def _ds_line(body: str, rows: Rows) -> bool:
    """DeepSpeed/apex dynamic loss-scale messages: overflow, attempted scale, minimum reached."""
    if "verflow" not in body and "loss scale" not in body.lower():
        return False
    m = _DS_OVERFLOW_ITER.search(body)
    if m:
        step = int(m.group(1))
        rows.marks.append({"kind": "overflow", "step": step})
        return True
    m = _DS_ATTEMPT.search(body) or _DS_REDUCE.search(body)
    if m:
        step = rows.last_step
        if rows.marks and rows.marks[-1].get("kind") == "overflow" and rows.marks[-1].get("scale") is None:
            step = rows.marks[-1]["step"]  # "Grad overflow on iteration N" came first
            rows.marks[-1]["scale"] = True
        elif step is not None:
            rows.marks.append({"kind": "overflow", "step": step, "scale": True})
        if step is not None:
            row = rows.row_for(step)
            rows.put(row, "loss_scale", _num(m.group(1)))
            rows.put(row, "skipped", 1.0)
        return True
    if _DS_MIN.search(body):
        rows.marks.append({"kind": "scale_at_minimum", "step": rows.last_step})
        return True
    return False


# -- CSV ---------------------------------------------------------------------------------------

def _sniff_delim(first: str) -> str:
    counts = {d: first.count(d) for d in (",", "\t", ";")}
    return max(counts, key=lambda d: counts[d])


def _csv_columns(header: list[str]) -> dict[str, Any]:
    """Which raw columns are which metric; W&B ``<run> - <metric>`` columns grouped by run."""
    plain: dict[str, tuple[str, float]] = {}
    per_run: dict[str, dict[str, tuple[str, float]]] = {}
    special: dict[str, str] = {}
    for col in header:
        name = col.strip().strip('"')
        if " - " in name:
            run, _, metric = name.rpartition(" - ")
            run = scrub(run)[:80]
            c = canonical(metric)
            if c and c[0] not in ("step", "rank", "run"):
                per_run.setdefault(run, {}).setdefault(c[0], (col, c[1]))
            continue
        c = canonical(name)
        if c is None:
            continue
        if c[0] in ("step", "rank", "run"):
            special.setdefault(c[0], col)
        elif c[0] not in {v[0] for v in plain.values()}:
            plain[col] = c
    return {"plain": plain, "per_run": per_run, "special": special}


def _csv_useful(cols: dict[str, Any]) -> bool:
    metrics = {c[0] for c in cols["plain"].values()}
    for d in cols["per_run"].values():
        metrics |= set(d)
    key = metrics & {"loss", "grad_norm", "loss_scale", "step_time", "data_time"}
    return bool(key) and ("step" in cols["special"] or len(metrics) >= 2 or bool(cols["per_run"]))


def _has_empty_cells(path: Path, delim: str, at: float) -> bool:
    """Are NaN values written as empty cells (",," or a delimiter at a line's end or start)?

    Only asked when a loss column holds NaN, and answered from 16 MiB of the file around the
    first NaN row (``at``: its position as a share of the rows), so a ten-million-row file is
    not read twice. If no cell there is empty, NaN is written out ("nan") and is exact;
    otherwise ``logged_nan`` judges by the shape of the column.
    """
    d = delim.encode()
    size = path.stat().st_size
    start = max(0, int(at * size) - 8 * 2**20)
    with open(path, "rb") as fh:
        fh.seek(start)
        buf = fh.read(16 * 2**20)
    if start:
        buf = buf[buf.find(b"\n") + 1:]  # from the start of a line
    return any(p in buf for p in (d + d, d + b"\n", d + b"\r\n", b"\n" + d))


def _csv_ranges(path: Path, data_start: int, size: int) -> list[tuple[int, int]]:
    """Byte ranges of the data rows, each ending at a newline, about CSV_RANGE_BYTES long."""
    parts = max(1, (size - data_start) // CSV_RANGE_BYTES)
    bounds = [data_start]
    with open(path, "rb") as fh:
        for i in range(1, parts):
            fh.seek(data_start + (size - data_start) * i // parts)
            fh.readline()  # to the start of the next line
            at = fh.tell()
            if bounds[-1] < at < size:
                bounds.append(at)
    bounds.append(size)
    return list(zip(bounds[:-1], bounds[1:], strict=True))


class _Span:
    """A read-only window ``[start, end)`` of a file, for pandas to read a byte range in place.

    pandas pulls its input in small pieces through ``read``; handing it the file itself (and not
    the range copied into one bytes object) keeps every range's text out of fresh memory.
    """

    def __init__(self, path: Path, start: int, end: int) -> None:
        self._fh = open(path, "rb")  # noqa: SIM115 - closed by the reader through close()
        self._fh.seek(start)
        self._left = end - start

    def read(self, n: int = -1) -> bytes:
        n = self._left if n is None or n < 0 else min(n, self._left)
        data = self._fh.read(n)
        self._left -= len(data)
        return data

    def close(self) -> None:
        self._fh.close()

    def __iter__(self) -> Any:  # pandas checks for it on file-likes; lines are never asked for
        return iter(())


def _newlines(path: Path, span: tuple[int, int]) -> int:
    """Lines in a byte range (a last line without newline counts): an upper bound on its rows."""
    buf = bytearray(4 * 2**20)  # reused for the whole range: no fresh memory per read
    n, left, last = 0, span[1] - span[0], b"\n"
    with open(path, "rb") as fh:
        fh.seek(span[0])
        while left > 0:
            got = fh.readinto(memoryview(buf)[:min(left, len(buf))])
            if not got:
                break
            n += buf.count(b"\n", 0, got)
            last = buf[got - 1:got]
            left -= got
    return n + (last != b"\n")


def _convert(frame: Any, names: dict[int, str], run_pos: int | None) -> tuple[dict[int, Any], Any]:
    """One parsed range's columns as numpy arrays, and the mask of repeated header lines."""
    import numpy as np
    import pandas as pd

    drop = np.zeros(len(frame), bool)
    conv: dict[int, Any] = {}
    for pos in names:
        s = frame[pos]
        if pos == run_pos:
            conv[pos] = s.astype(str).to_numpy()
        elif s.dtype.kind in "fiub":
            conv[pos] = s.to_numpy()
        else:  # text in a numeric column: a header repeated on append, or junk
            num = pd.to_numeric(s, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
            idx = np.flatnonzero(np.isnan(num) & ~s.isna().to_numpy())
            drop[idx[(s.iloc[idx].astype(str).str.strip() == names[pos].strip()).to_numpy()]] = True
            conv[pos] = num
    return conv, drop


def _read_columns(path: Path, delim: str, header: list[str], data_start: int, names: dict[int, str],
                  step_pos: int | None, run_pos: int | None,
                  compact: frozenset[int] = frozenset()) -> tuple[dict[int, Any], Any]:
    """Parse the wanted columns of every data row: byte ranges in parallel threads, each written
    straight into one preallocated array per column. Returns the columns and, when some step
    cells were not numbers, the mask of rows with a valid step (else None).

    pandas' C tokenizer and float conversion release the GIL, so ranges parsed on every core cut
    the wall time of a ten-million-row file by the core count. What costs next is touching fresh
    memory, so each column is allocated once (its length bounded by a count of lines) and no
    range's text or columns are ever copied whole. Rows never span ranges unless a quoted field
    holds a newline: a file with quotes in its data is read as one range. ``compact``: the
    positions whose values may be kept as float32.
    """
    import os
    import warnings
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import pandas as pd

    size = path.stat().st_size
    with open(path, "rb") as fh:
        fh.seek(data_start)
        quoted = b'"' in fh.read(65536)
    ranges = [(data_start, size)] if quoted else _csv_ranges(path, data_start, size)
    workers = min(len(ranges), os.cpu_count() or 1, 8)
    ex = ThreadPoolExecutor(workers, thread_name_prefix="mldoctor-csv") if workers > 1 else None

    def each(fn: Any, items: list[Any]) -> list[Any]:
        return list(ex.map(fn, items)) if ex else [fn(i) for i in items]

    try:
        counts = each(lambda span: _newlines(path, span), ranges)
        offsets = [0]
        for c in counts:
            offsets.append(offsets[-1] + c)
        total = offsets[-1]
        # Past a million rows, loss-like values are kept as float32 (7 significant digits, more
        # than any detector or report uses): half the memory to touch, which on a VM is most of
        # the time. Clocks stay float64: an epoch timestamp in float32 is off by minutes.
        def dtype(pos: int) -> Any:
            if pos == run_pos:
                return object
            if pos == step_pos:
                return np.int64
            return np.float32 if pos in compact and total > CSV_FLOAT32_ROWS else np.float64

        dest = {pos: np.empty(total, dtype(pos)) for pos in names}
        bad_step: list[Any] = []  # global rows whose step cell was not a number

        def parse(i: int) -> int:
            span = _Span(path, *ranges[i])
            try:
                frame = pd.read_csv(span, sep=delim, header=None, names=range(len(header)), index_col=False,
                                    usecols=sorted(names), engine="c", on_bad_lines="skip",
                                    encoding="utf-8", encoding_errors="replace")
            except pd.errors.EmptyDataError:
                return 0
            finally:
                span.close()
            conv, drop = _convert(frame, names, run_pos)
            del frame
            keep = ~drop if drop.any() else None
            n = len(drop) if keep is None else int(keep.sum())
            at = offsets[i]
            for pos, a in conv.items():
                v = a if keep is None else a[keep]
                if pos == step_pos and v.dtype.kind == "f":
                    ok = np.isfinite(v)
                    if not ok.all():
                        bad_step.append(at + np.flatnonzero(~ok))
                    v = np.where(ok, v, 0)
                dest[pos][at:at + n] = v
            return n

        with warnings.catch_warnings():  # mixed text and numbers in a column is expected here
            warnings.simplefilter("ignore", pd.errors.DtypeWarning)
            got = each(parse, list(range(len(ranges))))
    finally:
        if ex:
            ex.shutdown()
    n = sum(got)
    if n < total:  # dropped or blank lines left gaps: close them, in order, in place
        end = 0
        for at, k in zip(offsets, got, strict=False):
            if k and at != end:
                for a in dest.values():
                    a[end:end + k] = a[at:at + k]
            end += k
        dest = {pos: a[:n] for pos, a in dest.items()}
    ok = None
    if bad_step:
        ok = np.ones(total, bool)
        ok[np.concatenate(bad_step)] = False
        if n < total:
            ok = np.concatenate([ok[at:at + k] for at, k in zip(offsets, got, strict=False)])
    return dest, ok


def read_csv(path: Path, rel: str, hints: Hints) -> list[Any]:
    import numpy as np
    import pandas as pd
    from doctor.probes.metrics_detect import Series, logged_nan

    with open(path, "rb") as fh:
        first_raw = fh.readline()
    first = first_raw.decode("utf-8-sig", errors="replace")
    delim = _sniff_delim(first)
    header = next(iter(__import__("csv").reader([first.rstrip("\r\n")], delimiter=delim)), [])
    cols = _csv_columns(header)
    if not _csv_useful(cols):
        raise EvidenceError(rel, "CSV header names no training metric (loss, grad_norm, loss_scale, step_time)")
    want: dict[str, list[tuple[str, str, float]]] = {}  # run key -> [(raw col, metric, factor)]
    for col, (m, f) in cols["plain"].items():
        want.setdefault("", []).append((col, m, f))
    for run, d in cols["per_run"].items():
        for m, (col, f) in d.items():
            want.setdefault(run, []).append((col, m, f))
    usecols = sorted({c for lst in want.values() for c, _, _ in lst} | set(cols["special"].values()))
    position = {c: header.index(c) for c in usecols}  # the first column of a repeated name
    try:
        compact = frozenset(position[c] for lst in want.values() for c, m, _ in lst if m in _COMPACT)
        by_pos, step_ok = _read_columns(path, delim, header, len(first_raw), {position[c]: c for c in usecols},
                                        position.get(cols["special"].get("step", "")),
                                        position.get(cols["special"].get("run", "")), compact)
    except (ValueError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise EvidenceError(rel, f"unreadable CSV ({str(exc).splitlines()[0][:120]})") from None
    full = {c: by_pos[position[c]] for c in usecols}
    n = len(next(iter(full.values()))) if full else 0
    if n == 0:
        raise EvidenceError(rel, "CSV has a header but no rows")
    metric_cols = {c for lst in want.values() for c, _, _ in lst}
    if not any(np.isfinite(full[c][:1000]).any() or np.isfinite(full[c]).any() for c in metric_cols):
        raise EvidenceError(rel, "CSV metric columns hold no numbers")
    step_col = cols["special"].get("step")
    if step_col:
        ok, step, step_from = step_ok, full[step_col], "column"
    else:
        ok = None
        step = np.arange(1, n + 1, dtype=np.int64)
        step_from = "row"
    # A mask of None means "all rows": no copies of ten-million-row columns for the usual case.
    groups: list[tuple[str | None, int | None, Any]] = [(None, hints.rank, ok)]
    rank_col, run_col = cols["special"].get("rank"), cols["special"].get("run")
    if rank_col or run_col:
        rk = full[rank_col] if rank_col else None
        rn = full[run_col] if run_col else None
        groups = []
        for r in (np.unique(rk[np.isfinite(rk)]) if rk is not None else [None]):
            for nm in (np.unique(rn) if rn is not None else [None]):
                mask = np.ones(n, bool) if ok is None else ok.copy()
                if r is not None:
                    mask &= rk == r
                if nm is not None:
                    mask &= rn == nm
                if mask.any():
                    groups.append((None if nm is None else scrub(str(nm))[:80], None if r is None else int(r), mask))
    out = []
    no_gaps: bool | None = None
    for run_key, lst in want.items():
        for run, rank, mask in groups:
            cols_out, nl, src = {}, {}, {}
            def pick(a: Any, mask: Any = mask) -> Any:
                return a if mask is None else a[mask]

            for col, m, f in lst:
                v = pick(full[col])
                cols_out[m] = v * f if f != 1.0 else v
                src[m] = col
            for m in ("loss", "grad_norm"):
                if m not in cols_out:
                    continue
                isn = np.isnan(cols_out[m])
                first = int(np.argmax(isn))
                if not isn[first]:
                    continue  # no NaN at all
                if no_gaps is None:
                    no_gaps = not _has_empty_cells(path, delim, first / max(1, len(isn)))
                if no_gaps:  # no cell near the NaN rows is empty: every NaN was written as a value
                    nl[m] = isn
                    continue
                others = [v for k, v in cols_out.items() if k in _TRAINING and k != m]
                flags = logged_nan(cols_out[m], others)
                if flags is not None:
                    nl[m] = flags
            run_name = run_key or run
            parts = [rel] + ([run_name] if run_name else []) + ([f"rank{rank}"] if rank_col and rank is not None else [])
            s = Series(name=":".join(parts), file=rel, fmt="csv", step=pick(step), cols=cols_out, nan_logged=nl,
                       rank=rank, run=run_name, step_from=step_from)
            _postprocess(s)
            if s.rows:
                out.append(s)
    return out


# -- JSONL / JSON ------------------------------------------------------------------------------

def _flatten(rec: dict[str, Any], prefix: str = "", depth: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in rec.items():
        key = f"{prefix}/{k}" if prefix else str(k)
        if isinstance(v, dict) and depth < 2:
            out.update(_flatten(v, key, depth + 1))
        else:
            out[key] = v
    return out


def _plan(keys: tuple[str, ...]) -> tuple[bool, list[tuple[str, str, float]]] | None:
    """How to read a record with these keys: whether to skip it (evaluation and end-of-run
    summaries), and (raw key, metric, factor) for the keys we read. Cached per key tuple, since
    a metrics file repeats the same few key sets on every line."""
    if any(k.startswith("eval_") for k in keys) or "train_runtime" in keys:
        return True, []
    out = []
    for k in keys:
        c = canonical(k)
        if c is not None:
            out.append((k, c[0], c[1]))
    return False, out


def _records_to_series(records: Any, rel: str, hints: Hints, fmt: str) -> list[Any]:
    per: dict[tuple[int | None, str | None], Rows] = {}
    ordinal: dict[tuple[int | None, str | None], int] = {}
    plans: dict[tuple[str, ...], Any] = {}
    for rec in records:
        if not isinstance(rec, dict):
            continue
        keys = tuple(rec)
        plan = plans.get(keys)
        if plan is None or plan[2]:  # new key set, or one with nested values: flatten it
            flat = rec if plan is not None and not plan[2] else _flatten(rec)
            nested = len(flat) != len(rec) or any(isinstance(v, dict) for v in rec.values())
            skip, read = _plan(tuple(str(k) for k in flat))
            if len(plans) < 1024:
                plans[keys] = (skip, read, nested)
        else:
            flat = rec
            skip, read = plan[0], plan[1]
        if skip:
            continue
        vals: dict[str, float] = {}
        step = rank = run = None
        for k, m, factor in read:
            v = flat[k]
            if m == "run":
                run = scrub(str(v))[:80]  # a name from the logs: scrubbed like any text we keep
                continue
            tv = type(v)
            if tv is float or tv is int:
                x = float(v)
            elif tv is str:
                try:
                    x = _num(v)
                except ValueError:
                    continue
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                x = float(v)
            else:
                continue
            if m == "step":
                step = int(x) if math.isfinite(x) else None
            elif m == "rank":
                rank = int(x) if math.isfinite(x) else None
            elif m not in vals:
                vals[m] = x * factor
        if not vals:
            continue
        key = (rank if rank is not None else hints.rank, run)
        rows = per.get(key)
        if rows is None:
            rows = per[key] = Rows()
        if step is None:
            ordinal[key] = ordinal.get(key, 0) + 1
            step = ordinal[key]
        rows.add(step, vals)
    out = []
    for (rank, run), rows in per.items():
        if not any(m in rows.vals for m in ("loss", "grad_norm", "loss_scale", "step_time")):
            continue
        parts = [rel] + ([run] if run else []) + ([f"rank{rank}"] if rank is not None and len(per) > 1 else [])
        out.append(rows.series(":".join(parts), rel, fmt, rank=rank, run=run,
                               step_from="line_order" if (rank, run) in ordinal else "column"))
    if not out:
        raise EvidenceError(rel, "no records with a training metric (loss, grad_norm, loss_scale, step_time)")
    return out


def read_jsonl(path: Path, rel: str, hints: Hints) -> list[Any]:
    size = path.stat().st_size
    if size > LINE_FORMAT_MAX:
        raise EvidenceError(rel, f"{size / 2**20:.0f} MiB JSONL is over the {LINE_FORMAT_MAX // 2**20} MiB "
                                 "line reader limit; export the metrics as CSV")
    bad = [0]
    decode = json.JSONDecoder().raw_decode

    def records() -> Any:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    rec, end = decode(line)  # json.loads without its two whitespace regexes
                except ValueError:
                    bad[0] += 1
                    continue
                if end == len(line):
                    yield rec
                else:
                    bad[0] += 1

    try:
        return _records_to_series(records(), rel, hints, "jsonl")
    except EvidenceError:
        if bad[0]:
            raise EvidenceError(rel, f"no usable JSON records ({bad[0]} line(s) are not valid JSON)") from None
        raise


def read_json(path: Path, rel: str, hints: Hints) -> list[Any]:
    """HF ``trainer_state.json`` (``log_history``) or a JSON list of metric records."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except ValueError as exc:
        raise EvidenceError(rel, f"invalid JSON ({exc.msg} at line {exc.lineno})") from None
    recs = doc.get("log_history") if isinstance(doc, dict) else doc
    if not isinstance(recs, list):
        raise EvidenceError(rel, "JSON holds no list of metric records (no log_history)")
    return _records_to_series(recs, rel, hints, "json:trainer_state" if isinstance(doc, dict) else "json")


# -- TensorBoard event files -------------------------------------------------------------------

def _crc32c_table() -> list[int]:
    tab = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        tab.append(c)
    return tab


_CRC_TAB = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C, rotated and offset ("masked")."""
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC_TAB[(c ^ b) & 0xFF] ^ (c >> 8)
    c ^= 0xFFFFFFFF
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecords(raw: bytes) -> tuple[list[bytes], str]:
    """Split TFRecord framing: u64 length, u32 masked crc of it, data, u32 masked crc of data.

    Only the length checksums are verified (8 bytes each; the data checksum would cost a pure
    Python CRC over every byte). Returns the records and a note when the file ends early.
    """
    out, pos, n = [], 0, len(raw)
    while pos + 12 <= n:
        (length,) = struct.unpack_from("<Q", raw, pos)
        (lcrc,) = struct.unpack_from("<I", raw, pos + 8)
        if masked_crc32c(raw[pos:pos + 8]) != lcrc:
            return out, f"bad record header at byte {pos}"
        end = pos + 12 + length
        if end + 4 > n:
            return out, f"truncated record at byte {pos} (a writer still running?)"
        out.append(raw[pos + 12:end])
        pos = end + 4
    return out, "" if pos == n else f"{n - pos} trailing bytes"


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def pb_fields(buf: bytes) -> Any:
    """Yield (field number, wire type, value) of one protobuf message; bytes for length-delimited."""
    pos, n = 0, len(buf)
    while pos < n:
        key, pos = _varint(buf, pos)
        fno, wt = key >> 3, key & 7
        if wt == 0:
            val, pos = _varint(buf, pos)
        elif wt == 1:
            val = buf[pos:pos + 8]
            pos += 8
        elif wt == 2:
            ln, pos = _varint(buf, pos)
            val = buf[pos:pos + ln]
            pos += ln
        elif wt == 5:
            val = buf[pos:pos + 4]
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wt}")
        if pos > n:
            raise ValueError("truncated field")
        yield fno, wt, val


_DT_FLOAT, _DT_DOUBLE, _DT_INT32, _DT_INT64, _DT_HALF = 1, 2, 3, 9, 19


def _tensor_scalar(buf: bytes) -> float | None:
    """The value of a scalar TensorProto (TF2 ``tf.summary.scalar`` writes these)."""
    dtype, content = 0, b""
    vals: list[float] = []
    for fno, wt, val in pb_fields(buf):
        if fno == 1 and wt == 0:
            dtype = val
        elif fno == 4 and wt == 2:
            content = val
        elif fno == 5:
            vals += list(struct.unpack(f"<{len(val) // 4}f", val)) if wt == 2 else [struct.unpack("<f", val)[0]]
        elif fno == 6:
            vals += list(struct.unpack(f"<{len(val) // 8}d", val)) if wt == 2 else [struct.unpack("<d", val)[0]]
        elif fno in (7, 10) and wt == 0:
            vals.append(float(val if val < 2**63 else val - 2**64))
        elif fno == 13 and wt == 0:
            vals.append(struct.unpack("<e", struct.pack("<H", val & 0xFFFF))[0])
    if vals:
        return float(vals[0])
    fmt = {_DT_FLOAT: "<f", _DT_DOUBLE: "<d", _DT_INT32: "<i", _DT_INT64: "<q", _DT_HALF: "<e"}.get(dtype)
    if fmt and len(content) >= struct.calcsize(fmt):
        return float(struct.unpack_from(fmt, content)[0])
    return None


def read_tfevents(path: Path, rel: str, hints: Hints) -> list[Any]:
    size = path.stat().st_size
    if size > LINE_FORMAT_MAX:
        raise EvidenceError(rel, f"{size / 2**20:.0f} MiB event file is over the {LINE_FORMAT_MAX // 2**20} MiB limit")
    recs, note = tfrecords(path.read_bytes())
    if not recs:
        raise EvidenceError(rel, f"no TFRecord events ({note or 'empty'})")
    rows = Rows()
    wall0 = None
    tags: dict[str, str] = {}
    try:
        for rec in recs:
            step, wall, summary, session = 0, None, None, None
            for fno, wt, val in pb_fields(rec):
                if fno == 1 and wt == 1:
                    wall = struct.unpack("<d", val)[0]
                elif fno == 2 and wt == 0:
                    step = val if val < 2**63 else val - 2**64
                elif fno == 5 and wt == 2:
                    summary = val
                elif fno == 7 and wt == 2:
                    session = val
            if wall is not None and wall0 is None:
                wall0 = wall
            if session is not None:
                status = next((v for f, w, v in pb_fields(session) if f == 1 and w == 0), 0)
                if status == 1 and rows.steps:  # SessionLog.START after data: a restart
                    rows.marks.append({"kind": "restart", "step": step, "from_step": rows.last_step})
            if summary is None:
                continue
            for fno, wt, val in pb_fields(summary):
                if fno != 1 or wt != 2:
                    continue
                tag, value = None, None
                for f2, w2, v2 in pb_fields(val):
                    if f2 == 1 and w2 == 2:
                        tag = bytes(v2).decode("utf-8", "replace")
                    elif f2 == 2 and w2 == 5:
                        value = struct.unpack("<f", v2)[0]
                    elif f2 == 8 and w2 == 2:
                        value = _tensor_scalar(v2)
                if tag is None or value is None:
                    continue
                c = canonical(tag)
                if c is None or c[0] in ("step", "rank", "run", "wall"):
                    continue
                if tags.setdefault(c[0], tag) != tag:
                    continue  # a second tag for the same metric (e.g. two loss heads): keep the first
                rows.put(rows.row_for(int(step)), c[0], value * c[1])
    except (ValueError, struct.error) as exc:
        raise EvidenceError(rel, f"corrupt event record ({exc})") from None
    if not rows.steps:
        raise EvidenceError(rel, "event file holds no training-metric scalars")
    run_dir = str(Path(rel).parent)
    s = rows.series(run_dir if run_dir != "." else rel, rel, "tensorboard", rank=hints.rank)
    s.meta = {"wall0": wall0 or 0.0, "tb_dir": run_dir, "note": note}
    return [s]


# -- the probe ---------------------------------------------------------------------------------

def _looks_tfevents(sample: Sample) -> bool:
    raw = sample.raw
    if len(raw) < 16:
        return False
    (length,) = struct.unpack_from("<Q", raw, 0)
    if length > 1 << 30 or masked_crc32c(raw[:8]) != struct.unpack_from("<I", raw, 8)[0]:
        return False
    return b"brain.Event" in raw[12:12 + min(length, 64)] or "tfevents" in sample.name


def _looks_csv(sample: Sample) -> bool:
    text = sample.text
    first, _, rest = text.partition("\n")
    if not rest.strip() or len(first) > 4000:
        return False
    delim = _sniff_delim(first)
    if first.count(delim) < 1:
        return False
    header = [h.strip().strip('"') for h in first.rstrip("\r").split(delim)]
    if any(not h for h in header[:2]):
        return False
    return _csv_useful(_csv_columns(header))


def _looks_jsonl(sample: Sample) -> bool:
    lines = [ln.strip() for ln in sample.text.splitlines()[:50] if ln.strip()]
    if len(lines) < 2 or not lines[0].startswith("{"):
        return False
    hits = 0
    for ln in lines[:-1]:  # the last line of the sample may be cut
        try:
            rec = json.loads(ln)
        except ValueError:
            return False
        if isinstance(rec, dict) and any((c := canonical(str(k))) and c[0] in ("loss", "grad_norm", "loss_scale")
                                         for k in _flatten(rec)):
            hits += 1
    return hits >= 1


def _looks_json(sample: Sample) -> bool:
    head = sample.text.lstrip()[:4096]
    return head.startswith("{") and '"log_history"' in sample.text and '"loss"' in sample.text


def _looks_text(sample: Sample) -> bool:
    lines = [ln for ln in sample.text.replace("\r", "\n").split("\n")[:2000] if ln.strip()]
    if not lines:
        return False
    # Three metric lines make a training log; a short paste (a few lines copied into a ticket)
    # counts with two, since every line of it was chosen.
    need = 2 if len(lines) <= 40 else 3
    hits = 0
    for ln in lines:
        if _is_metric_line(ln):
            hits += 1
            if hits >= need:
                return True
    return False


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
        if _looks_tfevents(sample):
            return True
        if b"\x00" in sample.raw[:4096]:
            return False
        return _looks_json(sample) or _looks_jsonl(sample) or _looks_csv(sample)

    def also_sniff(self, sample: Sample) -> bool:
        """A text log (owned by the logs probe) that also carries training-metric lines.

        The head of the file is checked first; a long log whose first 64 KiB are start-up noise
        (Megatron's argument dump, NCCL INFO lines) is checked on its last 64 KiB too.
        """
        raw = sample.raw
        if b"\x00" in raw[:4096] or _looks_tfevents(sample):
            return False
        if _KEY_BYTES.search(raw) and _looks_text(sample):
            return True
        if sample.size <= len(raw):
            return False
        with open(sample.path, "rb") as fh:
            fh.seek(max(0, sample.size - len(raw)))
            tail = fh.read(len(raw))
        if b"\x00" in tail or not _KEY_BYTES.search(tail):
            return False
        text = tail.decode("utf-8", "replace").split("\n", 1)[-1]
        return _looks_text(Sample(sample.path, sample.name, text.encode(), sample.size))

    def parse(self, path: Path, rel: str, hints: Hints) -> list[Parsed]:
        sample = Sample.read(path)
        if _looks_tfevents(sample):
            series = read_tfevents(path, rel, hints)
        elif b"\x00" in sample.raw[:4096]:
            raise EvidenceError(rel, "binary file that is not a TensorBoard event file")
        elif _looks_json(sample):
            series = read_json(path, rel, hints)
        elif _looks_jsonl(sample):
            series = read_jsonl(path, rel, hints)
        elif _looks_csv(sample):
            series = read_csv(path, rel, hints)
        else:
            series = read_text(path, rel, hints)  # reached through also_sniff
        return [Parsed(self.name, rel, s, s.rank, hints.host) for s in series]

    def build(self, parsed: list[Parsed], facts: dict[str, Any]) -> None:
        from doctor.probes.metrics_detect import Params

        options = ((facts.get("meta") or {}).get("options") or {}).get("metrics")
        params = Params.from_env(options if isinstance(options, dict) else None)
        facts[self.name] = summarize(merge_tensorboard([p.data for p in parsed]), params)


PROBE = MetricsProbe()


# -- from series to facts ----------------------------------------------------------------------

def merge_tensorboard(series: list[Any]) -> list[Any]:
    """Event files of one TensorBoard run directory are one run, restarted: join them by time."""
    import numpy as np
    from doctor.probes.metrics_detect import Series

    out, groups = [], {}
    for s in series:
        meta = getattr(s, "meta", None) or {}
        if s.fmt == "tensorboard" and "tb_dir" in meta:
            groups.setdefault((meta["tb_dir"], s.rank), []).append(s)
        else:
            out.append(s)
    for (_, _), parts in groups.items():
        if len(parts) == 1:
            out.append(parts[0])
            continue
        parts.sort(key=lambda s: s.meta.get("wall0", 0.0))
        metrics = sorted({m for s in parts for m in s.cols})
        cols = {m: np.concatenate([s.cols.get(m, np.full(s.rows, np.nan)) for s in parts]) for m in metrics}
        nl = {}
        for m in {m for s in parts for m in s.nan_logged}:
            nl[m] = np.concatenate([s.nan_logged.get(m, np.zeros(s.rows, bool)) for s in parts])
        merged = Series(name=parts[0].name, file=", ".join(s.file for s in parts), fmt="tensorboard",
                        step=np.concatenate([s.step for s in parts]), cols=cols, nan_logged=nl,
                        rank=parts[0].rank, marks=[m for s in parts for m in s.marks])
        out.append(merged)
    return out


def _state(r: dict[str, Any]) -> str:
    loss = r.get("loss") or {}
    ls = r.get("loss_scale") or {}
    if ls.get("collapsed"):
        return "overflow"
    if loss.get("first_nan") and not loss["first_nan"]["recovered"]:
        return "nan"
    if (loss.get("divergence") or {}).get("detected"):
        return "diverged"
    if loss.get("spikes") or loss.get("first_nan"):
        return "spiky"
    return "ok"


_STATE_RANK = {"overflow": 0, "nan": 1, "diverged": 2, "spiky": 3, "ok": 4}


def _at(r: dict[str, Any], step: int) -> str:
    """'step 312' or 'log entry 312' when the log prints no step numbers."""
    return f"log entry {step}" if r.get("step_from") in ("line_order", "row") else f"step {step}"


def _with_context(detail: str, context: list[str]) -> str:
    """The detail line, then what changed shortly before, as one sentence for a finding."""
    if not context:
        return detail + "."
    return f"{detail}; shortly before: " + "; ".join(context) + "."


def summarize(series: list[Any], params: Any) -> dict[str, Any]:
    """Run the detectors on every series and fold the results into the ``metrics`` namespace."""
    import dataclasses

    import numpy as np
    from doctor.probes.metrics_detect import _fmt, analyze_series, curve, observed

    results = [analyze_series(s, params) for s in series]
    for r in results:
        r["state"] = _state(r)
    order = sorted(range(len(results)), key=lambda i: (_STATE_RANK[results[i]["state"]], -results[i]["rows"]))
    facts: dict[str, Any] = {"n_series": len(results), "first_nan_step": -1, "spikes": [], "events": [],
                             "lr_jumps": [], "restarts": [], "n_spikes": 0, "n_spikes_recovered": 0,
                             "params": {k: float(v) for k, v in dataclasses.asdict(params).items()}}
    facts["series"] = [
        {k: results[i].get(k) for k in ("name", "file", "format", "rank", "run", "rows", "first_step", "last_step",
                                        "metrics", "state", "step_from")}
        for i in order[:32]
    ]
    events: list[dict[str, Any]] = []

    def ev(kind: str, step: int, value: Any, z: Any, r: dict[str, Any], detail: str, sev: int) -> None:
        events.append({"kind": kind, "step": int(step), "value": value, "zscore": z, "series": r["name"],
                       "detail": detail, "_sev": sev})

    # NaN: the earliest first non-finite loss over all series.
    nan_best = None
    for r in results:
        fn = (r.get("loss") or {}).get("first_nan")
        if fn and (nan_best is None or fn["step"] < nan_best[0]["step"]):
            nan_best = (fn, r)
        if fn:
            ev("nan", fn["step"], fn["value"], None, r, f"loss became {fn['value']} at {_at(r, fn['step'])} in {r['name']}", 0)
    if nan_best:
        fn, r = nan_best
        last = (f" (last finite value {_fmt(fn['last_finite_value'])} at {_at(r, fn['last_finite_step'])})"
                if fn.get("last_finite_step") is not None else " (no finite value before it)")
        again = "; finite again later (a skipped or bad batch)" if fn["recovered"] else ""
        facts["first_nan_step"] = fn["step"]
        facts["nan"] = {k: v for k, v in fn.items() if k != "pos"} | {
            "series": r["name"],
            "detail": f"loss became {fn['value']} at {_at(r, fn['step'])} in {r['name']}{last}; "
                      f"{fn['count']} non-finite value(s){again}",
        }
    # Spikes: largest first over all series.
    spikes = []
    for r in results:
        for sp in (r.get("loss") or {}).get("spikes", []):
            state = (f"recovered after {sp['recovery_steps']} step(s)" if sp["recovered"]
                     else ("the run ends before it could recover" if sp["ongoing"] else "did not recover"))
            d = (f"loss spiked to {_fmt(sp['value'])} at {_at(r, sp['peak_step'])} in {r['name']} "
                 f"({_fmt(sp['ratio'])}x its window median {_fmt(sp['baseline'])}, robust z {_fmt(sp['zscore'])}); {state}")
            spikes.append({k: v for k, v in sp.items() if k != "pos"} | {"series": r["name"], "detail": d})
        facts["n_spikes"] += (r.get("loss") or {}).get("n_spikes", 0)
    spikes.sort(key=lambda s: -(s["zscore"] or 0))
    facts["spikes"] = spikes[: params.max_spikes]
    facts["n_spikes_recovered"] = sum(1 for s in facts["spikes"] if s["recovered"])
    for sp in facts["spikes"]:
        ev("spike", sp["step"], sp["value"], sp["zscore"], {"name": sp["series"]}, sp["detail"], 2 if sp["recovered"] else 1)
    # Divergence: the earliest detected one, else the main series' "not detected".
    div_best = None
    for r in results:
        d = (r.get("loss") or {}).get("divergence") or {}
        if d.get("detected") and (div_best is None or d["step"] < div_best[0]["step"]):
            div_best = (d, r)
    if div_best:
        d, r = div_best
        how = "after a spike" if d["after_spike"] else "without a single spike"
        detail = (f"loss rose from {_fmt(d['from_value'])} to {_fmt(d['to_value'])} ({_fmt(d['ratio'])}x) from "
                  f"{_at(r, d['step'])} in {r['name']} and stayed up ({how})")
        facts["divergence"] = {k: v for k, v in d.items() if k != "pos"} | {"series": r["name"], "detail": detail}
        ev("divergence", d["step"], d["to_value"], None, r, detail, 1)
    else:
        facts["divergence"] = {"detected": False}
    main_loss = next((results[i] for i in order if results[i].get("loss")), None)
    if main_loss:
        lo = main_loss["loss"]
        facts["loss"] = {k: lo.get(k) for k in ("rows", "first", "last", "min", "min_step", "median", "max")} | {
            "series": main_loss["name"], "window": lo.get("block")}
    # Loss scale: a collapsed series first, then many skipped steps, then the longest.
    ls_res = [r for r in results if r.get("loss_scale")]
    if ls_res:
        r = min(ls_res, key=lambda r: (not r["loss_scale"].get("collapsed"), not r["loss_scale"].get("many_skipped"),
                                       -r["loss_scale"].get("rows", 0)))
        ls = dict(r["loss_scale"])
        if ls.get("collapsed"):
            began = (f"overflow skips began at {_at(r, ls['first_skip_after_calibration'])}; "
                     if ls.get("first_skip_after_calibration", -1) >= 0 and ls["first_skip_after_calibration"] < ls["collapse_step"] else "")
            detail = (f"fp16 loss scale collapsed in {r['name']}: {began}from {_fmt(ls.get('peak', ls.get('max')))} it fell "
                      f"without recovering from {_at(r, ls['collapse_step'])} to {_fmt(ls.get('min'))} at "
                      f"{_at(r, ls.get('min_step', ls['collapse_step']))}; {ls.get('skipped_steps', 0)} step(s) skipped for overflow")
        else:
            detail = (f"{ls.get('skipped_steps', 0)} step(s) skipped for fp16 overflow in {r['name']} "
                      f"({ls.get('skipped_after_calibration', 0)} after the initial calibration); scale "
                      f"{_fmt(ls.get('initial'))} -> {_fmt(ls.get('final'))}")
        ls.update(series=r["name"], detail=detail)
        ls.setdefault("collapse_step", -1)
        ls.setdefault("first_skip_after_calibration", -1)
        facts["loss_scale"] = ls
        if ls.get("collapsed"):
            ev("loss_scale_collapse", ls["collapse_step"], ls.get("min"), None, r, detail, 0)
        elif ls.get("many_skipped"):
            ev("skipped_steps", ls.get("first_skip_after_calibration", -1), ls.get("skipped_after_calibration"), None, r, detail, 1)
    gn_res = [r for r in results if r.get("grad_norm")]
    if gn_res:
        r = min(gn_res, key=lambda r: (not r["grad_norm"].get("explosion"), r["grad_norm"].get("explosion_step", 0),
                                       -r["grad_norm"].get("rows", 0)))
        g = {k: v for k, v in r["grad_norm"].items() if k != "events"}
        g.setdefault("explosion_step", -1)
        g.setdefault("leads_loss_by", -1)
        if g.get("explosion"):
            lead = (f"; the loss went wrong {g['leads_loss_by']} step(s) later" if g["leads_loss_by"] > 0 else
                    ("; the loss went wrong at the same step" if g["leads_loss_by"] == 0 else ""))
            g["detail"] = (f"grad norm exploded at {_at(r, g['explosion_step'])} in {r['name']} "
                           f"({_fmt(g.get('explosion_ratio'))}x its trailing median {_fmt(g.get('median'))}; max "
                           f"{_fmt(g.get('max'))}){lead}")
            ev("grad_explosion", g["explosion_step"], g.get("max"), None, r, g["detail"], 1)
        elif g.get("nonfinite_tail"):
            g["detail"] = (f"grad norm NaN/Inf on the last {g['nonfinite_tail']} logged step(s) of {r['name']}, from "
                           f"{_at(r, g['nonfinite_tail_step'])}, while the loss stayed finite")
        else:
            g["detail"] = f"grad norm median {_fmt(g.get('median'))}, p90 {_fmt(g.get('p90'))}, max {_fmt(g.get('max'))} in {r['name']}"
        g["series"] = r["name"]
        facts["grad_norm"] = g
    for r in results:
        for j in r.get("lr_jumps", []):
            facts["lr_jumps"].append(j | {"series": r["name"]})
            ev("lr_jump", j["step"], j["to"], None, r, f"learning rate jumped {_fmt(j['ratio'])}x ({_fmt(j['from'])} -> "
               f"{_fmt(j['to'])}) at {_at(r, j['step'])} in {r['name']}", 3)
        for x in r.get("restarts", []):
            facts["restarts"].append(x | {"series": r["name"]})
            what = ("resumed: the step counter went back from " + str(x["from_step"])) if x["kind"] == "resume" else x.get("detail", "")
            ev(x["kind"], x["step"], None, None, r, f"{x['kind'].replace('_', ' ')} at {_at(r, x['step'])} in {r['name']} ({what})", 3)
    facts["lr_jumps"] = facts["lr_jumps"][: params.max_events]
    facts["restarts"] = facts["restarts"][: params.max_events]
    if main_loss:
        pl = (main_loss["loss"].get("plateau") or {"detected": False}) | {"series": main_loss["name"]}
        facts["plateau"] = pl
        if pl.get("detected"):
            ev("plateau", pl["since_step"], pl.get("level"), None, main_loss,
               f"loss improved by less than {params.plateau_rel:.0%} since {_at(main_loss, pl['since_step'])} in {main_loss['name']}", 4)
    # Step time and data time: the series with the most timed rows.
    timed = [r for r in results if r.get("step_time")]
    if timed:
        r = max(timed, key=lambda r: r["step_time"]["n"])
        facts["step_time"] = r["step_time"] | {"series": r["name"]}
        if r.get("data_time"):
            facts["data_time"] = r["data_time"] | {"series": r["name"]}
        if r.get("data_time_share") is not None:
            facts["data_time_share"] = r["data_time_share"]
    else:
        dt = [r for r in results if r.get("data_time")]
        if dt:
            facts["data_time"] = dt[0]["data_time"] | {"series": dt[0]["name"]}
    for key in ("nan", "divergence", "loss_scale", "grad_norm"):
        item = facts.get(key)
        if isinstance(item, dict) and item.get("detail"):
            item["summary"] = _with_context(item["detail"], item.get("context") or [])
    for sp in facts["spikes"]:
        sp["summary"] = _with_context(sp["detail"], sp.get("context") or [])
    events.sort(key=lambda e: (e["_sev"], e["step"]))
    facts["events"] = [{k: v for k, v in e.items() if k != "_sev"} for e in events[: params.max_events]]
    # Curves of the main series, small enough for facts and the report.
    curves: dict[str, Any] = {}
    by_name = {s.name: s for s in series}
    main_s = by_name.get(main_loss["name"]) if main_loss else (series[order[0]] if results else None)
    if main_s is not None:
        for m in ("loss", "grad_norm", "lr", "loss_scale"):
            st, v = observed(main_s, m)
            if len(v):
                curves[m] = curve(np.asarray(st), np.asarray(v)) | {"series": main_s.name}
    facts["curves"] = curves
    by_rank: dict[str, dict[str, Any]] = {}
    for r in results:
        if r.get("rank") is None or not r.get("loss"):
            continue
        lo = r["loss"]
        by_rank[str(r["rank"])] = {
            "first_nan_step": lo["first_nan"]["step"] if lo.get("first_nan") else -1,
            "n_spikes": lo.get("n_spikes", 0),
            "diverged": bool((lo.get("divergence") or {}).get("detected")),
            "loss_last": lo.get("last"),
        }
    if by_rank:
        facts["by_rank"] = by_rank
    return facts


# -- library use: one tidy table ---------------------------------------------------------------

def load_series(paths: list[Path | str]) -> list[Any]:
    """Every metric series in these files/folders (files that are not metrics are skipped)."""
    out: list[Any] = []
    for p in paths:
        p = Path(p)
        files = [p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file())
        base = p.parent if p.is_file() else p
        for f in files:
            rel = f.relative_to(base).as_posix()
            try:
                sample = Sample.read(f)
                if not (PROBE.sniff(sample) or PROBE.also_sniff(sample)):
                    continue
                out += [x.data for x in PROBE.parse(f, rel, Hints.from_path(rel))]
            except EvidenceError:
                continue
    return merge_tensorboard(out)


def to_table(series: list[Any]) -> Any:
    """One tidy pandas table: a row per logged step of each series, a column per metric.

    Columns: ``series``, ``file``, ``rank``, ``step``, then the canonical metrics present
    (``loss``, ``grad_norm``, ``lr``, ``loss_scale``, ``step_time``, ...). A metric missing on a
    row is NaN; a NaN that was *logged* is NaN too and flagged in a ``nan_<metric>`` column
    (present only when some value was logged as NaN).
    """
    import numpy as np
    import pandas as pd

    frames = []
    for s in series:
        extra = {f"nan_{m}": v for m, v in s.nan_logged.items() if v.any()}
        df = pd.DataFrame({"series": s.name, "file": s.file, "rank": s.rank, "step": s.step} | dict(s.cols) | extra)
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=["series", "file", "rank", "step"])
    out = pd.concat(frames, ignore_index=True)
    out["series"] = out["series"].astype("category")
    out["step"] = out["step"].astype(np.int64)
    return out


def load_table(paths: list[Path | str]) -> Any:
    """The tidy table of every metric file under ``paths``."""
    return to_table(load_series(paths))


def table_series(table: Any) -> list[Any]:
    """Back from a tidy table to series (NaN cells count as missing, as the table cannot tell)."""
    import numpy as np
    from doctor.probes.metrics_detect import METRICS, Series, logged_nan

    out = []
    key = "series" if "series" in table.columns else None
    groups = table.groupby(key, sort=False, observed=True) if key else [("table", table)]
    for name, df in groups:
        cols = {m: df[m].to_numpy(dtype=np.float64) for m in METRICS if m in df.columns}
        nl = {}
        for m in ("loss", "grad_norm"):
            if f"nan_{m}" in df.columns:
                nl[m] = df[f"nan_{m}"].to_numpy(dtype=bool)
            elif m in cols:  # no flags: the same rule as for CSV cells
                flags = logged_nan(cols[m], [v for k, v in cols.items() if k in _TRAINING and k != m])
                if flags is not None:
                    nl[m] = flags
        step = df["step"].to_numpy(dtype=np.int64) if "step" in df.columns else np.arange(1, len(df) + 1)
        rank = df["rank"].iloc[0] if "rank" in df.columns and len(df) else None
        out.append(Series(name=str(name), file=str(df["file"].iloc[0]) if "file" in df.columns else str(name),
                          fmt="table", step=step, cols=cols, nan_logged=nl,
                          rank=None if rank is None or rank != rank else int(rank)))
    return out


def analyze(source: Any, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``metrics`` facts for paths, a tidy table, or a list of series."""
    from doctor.probes.metrics_detect import Params

    params = Params.from_env(options)
    if hasattr(source, "columns"):
        series = table_series(source)
    elif isinstance(source, list) and source and hasattr(source[0], "cols"):
        series = source
    else:
        series = load_series(source if isinstance(source, list) else [source])
    return summarize(series, params)
