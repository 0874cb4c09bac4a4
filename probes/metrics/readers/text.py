"""Trainer log lines: HF Trainer dicts, Megatron ``iteration N/M |`` lines, DeepSpeed and apex
loss-scale messages, Lightning progress bars and ``step N ... loss X`` lines (nanoGPT, llm.c and
most hand-written loops); any other shape (fairseq, Keras, mmengine, epoch summaries, Markdown
tables, pasted before/after timings) through the fallback grammar of :mod:`.kvline`, tried last
so the known formats keep their exact readings.

These logs belong to the logs probe; metrics reads them too (``also_sniff``), so the sniffer
here must say yes only to logs that really carry per-step metrics, not to any log that says "loss".
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from doctor.probes.metrics.names import canonical
from doctor.probes.metrics.readers import kvline
from doctor.probes.metrics.rows import LINE_FORMAT_MAX, Rows, parse_number

from doctor.evidence.contract import Hints, Sample
from doctor.evidence.errors import EvidenceError

if TYPE_CHECKING:
    from doctor.probes.metrics.detect import Series

_NUMRE = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf(?:inity)?)"
_RANK_PREFIX = re.compile(r"^\s*(?:\[(?:rank|RANK)\s*(\d+)\]\s*:?|(?:rank|RANK)\s*(\d+)(?:/\d+)?\s*[:|]|(\d{1,5}):\s)")
_MEGATRON = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|")
_HF_DICT = re.compile(r"\{\s*['\"][A-Za-z_][\w/.\- ]*['\"]\s*:")
_HF_PAIR = re.compile(r"['\"]([A-Za-z_][\w/.\- ]*)['\"]\s*:\s*(" + _NUMRE + r")", re.I)
_STEP = re.compile(r"(?<![\w/])(?:global[_ ]step|step|iteration|iter|it)\s*[:=#]?\s*\[?\s*(\d+)(?:\s*/\s*(\d+))?(?![\w.])", re.I)
_PAIR = re.compile(r"([A-Za-z][A-Za-z0-9_/.\- ]{0,48}?)\s*(?:[:=]\s*|\s+)\[?\s*(" + _NUMRE + r")(\s*ms\b)?", re.I)
#: ``loss scale: 65536 -> 32768``: a value and what it became on the same line.
_ARROW_PAIR = re.compile(r"([A-Za-z][A-Za-z0-9_/.\- ]{0,40}?)\s*[:=]?\s*(" + _NUMRE + r")\s*(?:->|=>|\u2192)\s*(" + _NUMRE + r")",
                         re.I)
#: Metrics a ``step N`` line may also carry before its step (``train_loss 2.31 step 10 ...``).
_BEFORE_STEP = frozenset(kvline.VALUE_METRICS)
_TQDM = re.compile(r"Epoch\s+(\d+)\s*:.*?\|\s*(\d+)\s*/\s*(\d+)\s*\[[^\]]*?,\s*([^\]]*)\]")
_KV = re.compile(r"([A-Za-z_][\w/.\-]*)\s*=\s*(" + _NUMRE + r")", re.I)
_DS_OVERFLOW_ITER = re.compile(r"Grad overflow on iteration:?\s*(\d+)", re.I)
_DS_ATTEMPT = re.compile(r"(?:OVERFLOW!|overflow!|Overflow detected).*?Attempted loss scale:\s*(" + _NUMRE + r")(?:,\s*reducing to\s*(" + _NUMRE + r"))?", re.I)
_DS_REDUCE = re.compile(r"Reducing dynamic loss scale from\s*(" + _NUMRE + r")\s*to\s*(" + _NUMRE + r")", re.I)
#: apex amp's skip message (NVIDIA/apex apex/amp/handle.py, ``skip_step``: "Gradient overflow.  Skipping
#: step, loss scaler {} reducing loss scale to {}") and fairseq's (fairseq/optim/dynamic_loss_scaler.py
#: ``check_overflow`` raises "setting loss scale to: {}", fairseq/trainer.py logs it after "NOTE: gradient
#: overflow detected, ignoring gradient, "): both name the scale after the cut, and a skipped step.
_APEX_REDUCE = re.compile(r"Gradient overflow\.\s+Skipping step, loss scaler \d+ reducing loss scale to\s*(" + _NUMRE + r")",
                          re.I)
_FAIRSEQ_OVERFLOW = re.compile(r"gradient overflow detected, ignoring gradient, setting loss scale to:\s*(" + _NUMRE + r")",
                               re.I)
#: The scaler at its floor: DeepSpeed's "Current loss scale already at minimum", fairseq's
#: "Minimum loss scale reached (x)" (fairseq/optim/dynamic_loss_scaler.py, FloatingPointError).
_DS_MIN = re.compile(r"Current loss scale already at minimum|Minimum loss scale reached", re.I)
_HF_TOTAL = re.compile(r"Total optimization steps\s*=\s*([\d,]+)")
_HF_EPOCHS = re.compile(r"Num Epochs\s*=\s*([\d,]+)")
_WORDS = ("loss", "norm", "lr", "learning", "scale", "overflow", "iteration", "step", "epoch", "/s", "s/it",
          "time", "throughput", "wps")
#: A cheap byte test run before the line parsers: no such word, no metric line.
KEY_BYTES = re.compile(rb"[Ll]oss|LOSS|[Oo]verflow|OVERFLOW|grad[_ ]norm|gnorm|it/s|s/it|[Tt]hroughput|"
                       rb"(?:samples|tokens|tok)/s|[Dd]ata[_ ]time")
#: Kinds read by the fallback grammar (:mod:`kvline`): a file read only through them must show
#: a metric more than once, with rows that differ, before it is a series (a config dump is not).
_LOOSE = frozenset({"generic", "table", "change"})
#: A file is a metrics series when it carries one of these (an lr alone says nothing).
_SERIES_METRICS = ("loss", "grad_norm", "loss_scale", "step_time", "throughput", "data_time")


LineMetrics = tuple[str, int | None, dict[str, float], list[dict[str, float]]]


def _line_metrics(body: str, epoch: int | None = None) -> LineMetrics | None:
    """One log line -> (kind, step or None, canonical metrics, further points on the same line);
    None when it holds none. Only a before/after paste has further points."""
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
                v = parse_number(val.split("/")[0])
            except ValueError:
                continue
            vals.setdefault(c[0], v * c[1])
        return "megatron", int(m.group(1)), vals, []
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
                vals.setdefault(c[0], parse_number(raw) * c[1])
        return ("hf", step, vals, []) if vals else None
    m = _TQDM.search(body)
    if m:
        vals = {}
        for k, raw in _KV.findall(m.group(4)):
            c = canonical(k)
            if c and c[0] not in ("step", "rank", "run", "wall", "epoch"):
                vals.setdefault(c[0], parse_number(raw) * c[1])
        if vals:
            step = int(m.group(1)) * int(m.group(3)) + int(m.group(2))
            vals["epoch"] = float(m.group(1))
            _extras(body, vals)
            return "lightning", step, vals, []
        return None
    m = _STEP.search(body)
    if m:
        vals: dict[str, float] = {}
        _pairs(body[m.end():], vals, lambda name: name not in ("step", "rank", "run", "wall"))
        if m.start() > 2 and "loss" not in vals:  # the step came after the loss: look before it
            _before_step(body[:m.start()], vals)
        if "->" in body or "=>" in body or "\u2192" in body:
            _arrows(body[m.end():], vals)
        if "loss" in vals or "grad_norm" in vals or "loss_scale" in vals:
            _extras(body, vals)
            return "steps", int(m.group(1)), vals, []
    g = kvline.parse(body, epoch)
    if g is None:
        return None
    if g.points:
        return "change", None, g.points[0], g.points[1:]
    return "generic", g.step, g.vals, []


def _before_step(head: str, vals: dict[str, float]) -> None:
    """Metric pairs printed ahead of the step counter (``train_loss 2.31 step 10 ...``): only
    training metrics, never overriding what follows the step (an epoch or a rank before it is
    the line's prefix, not a value)."""
    _pairs(head, vals, lambda name: name in _BEFORE_STEP)


def _pairs(text: str, vals: dict[str, float], keep: Callable[[str], bool]) -> None:
    """Add the ``name value`` pairs of ``text`` whose canonical name ``keep`` accepts, scaled
    to the canonical unit (ms to s), never overriding a value already there."""
    for name, raw, ms in _PAIR.findall(text):
        c = canonical(name)
        if c is None or not keep(c[0]):
            continue
        try:
            v = parse_number(raw)
        except ValueError:
            continue
        vals.setdefault(c[0], v * (1e-3 if ms else c[1]))


def _arrows(body: str, vals: dict[str, float]) -> None:
    """``loss scale: 65536 -> 32768``: the value after the arrow is the current one; a loss
    scale that went down is a step skipped for overflow (scalers halve exactly then)."""
    for name, a, b in _ARROW_PAIR.findall(body):
        c = canonical(name.strip())
        if c is None or c[0] in ("step", "rank", "run", "wall", "epoch"):
            continue
        try:
            old, new = parse_number(a), parse_number(b)
        except ValueError:
            continue
        vals[c[0]] = new * c[1]
        if c[0] == "loss_scale" and new < old:
            vals["skipped"] = 1.0


def _extras(body: str, vals: dict[str, float]) -> None:
    """Metrics a known format's parser leaves out (a tqdm rate, a ``3.1 it/s`` cell): added by
    unit, never overriding what the format's own parser read."""
    if "/s" not in body and "s/it" not in body and "/step" not in body:
        return  # only a rate is ever missing: a format's own parser reads its named cells
    for k, v in kvline.rates(body).items():
        vals.setdefault(k, v)


def _metric_line(line: str) -> LineMetrics | None:
    """What a line holds, for the sniffer: a DeepSpeed message counts as a known format."""
    low = line.lower()
    if not any(w in low for w in _WORDS):
        return None
    if _DS_ATTEMPT.search(line) or _DS_OVERFLOW_ITER.search(line) or _DS_REDUCE.search(line) \
            or _APEX_REDUCE.search(line) or _FAIRSEQ_OVERFLOW.search(line):
        return "deepspeed", None, {}, []
    if _DS_MIN.search(line):
        return "deepspeed", None, {"loss_scale": 1.0}, []  # the scaler's floor (min_loss_scale default)
    body = _RANK_PREFIX.sub("", line, count=1)
    return _line_metrics(body)


def read_text(path: Path, rel: str, hints: Hints, prose: bool = False) -> list[Series]:
    """Trainer log lines -> one series per rank prefix (or one for the file). ``prose``: the
    sentences of a ticket, of which only stated before/after changes and NaN/Inf losses count
    (a sentence quoting one finite loss is not a run)."""
    size = path.stat().st_size
    if size > LINE_FORMAT_MAX:
        raise EvidenceError(rel, f"{size / 2**20:.0f} MiB text log is over the {LINE_FORMAT_MAX // 2**20} MiB "
                                 "line reader limit; export the metrics as CSV")
    per_rank: dict[int | None, Rows] = {}
    ordinal: dict[int | None, int] = {}
    kinds: dict[int | None, set[str]] = {}
    hf_total = hf_epochs = None
    table: kvline.Table | None = None
    epoch: int | None = None  # the last Keras "Epoch 5/10" header
    with open(path, encoding="utf-8", errors="replace", newline="") as fh:
        for raw in fh:
            for line in raw.replace("\r", "\n").split("\n"):
                if not line:
                    continue
                if table is not None or line.lstrip().startswith("|"):
                    table = _table_line(line, table, per_rank.setdefault(hints.rank, Rows()), ordinal, kinds, hints)
                    if table is not None:
                        continue
                if line.startswith("Epoch") and (e := kvline.epoch_header(line)) is not None:
                    epoch = e
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
                got = _line_metrics(body, epoch)
                if got is None:
                    continue
                kind, step, vals, more = got
                if prose and kind != "change" and all(math.isfinite(v) for k, v in vals.items() if k == "loss"):
                    continue
                kinds.setdefault(rank, set()).add(kind)
                if step is None:
                    ordinal[rank] = ordinal.get(rank, 0) + 1
                    step = ordinal[rank]
                if kind == "megatron" and vals.get("nan_iters", 0) > 0 and "loss" not in vals:
                    vals["loss"] = math.nan  # Megatron drops the NaN loss from the line, counts it here
                rows.add(step, vals)
                for point in more:
                    ordinal[rank] = ordinal.get(rank, 0) + 1
                    rows.add(ordinal[rank], point)
    out = []
    for rank, rows in per_rank.items():
        at_min = any(mk.get("kind") == "scale_at_minimum" for mk in rows.marks)
        if not rows.steps or not (at_min or any(m in rows.vals for m in _SERIES_METRICS)):
            continue
        if kinds.get(rank, set()) <= _LOOSE and not (_looks_like_a_run(rows) or _nonfinite_loss(rows)):
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


def _table_line(line: str, table: kvline.Table | None, rows: Rows, ordinal: dict[int | None, int],
                kinds: dict[int | None, set[str]], hints: Hints) -> kvline.Table | None:
    """A Markdown table (``| step | loss |``) row by row; returns the table still open, or None
    when this line is not part of one (the caller reads it as an ordinary line then)."""
    if table is None:
        return kvline.table_header(line)
    got = kvline.table_row(table, line)
    if got is None:
        return kvline.table_header(line)
    if got is True or not table.seen_rule:
        return table
    assert isinstance(got, kvline.Parsed)
    step = got.step
    if step is None:
        ordinal[hints.rank] = ordinal.get(hints.rank, 0) + 1
        step = ordinal[hints.rank]
    rows.add(step, got.vals)
    kinds.setdefault(hints.rank, set()).add("table")
    return table


def _looks_like_a_run(rows: Rows) -> bool:
    """A series read only by the fallback grammar is a run's record when a metric other than the
    learning rate was logged at least twice and not every row is the same (a config printed by each rank is)."""
    if not any(len(rows.vals.get(m, ())) >= 2 for m in _SERIES_METRICS):
        return False
    seen = {tuple(sorted((m, d.get(i)) for m, d in rows.vals.items())) for i in range(len(rows.steps))}
    return len(seen) > 1


def _nonfinite_loss(rows: Rows) -> bool:
    """A loss logged as NaN or Inf: evidence even on one line (``loss: nan`` pasted in a ticket),
    which a config dump never prints; the summary reads such a fragment as partial evidence."""
    return any(not math.isfinite(v) for v in rows.vals.get("loss", {}).values())


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
    m = _DS_ATTEMPT.search(body) or _DS_REDUCE.search(body) or _APEX_REDUCE.search(body) or _FAIRSEQ_OVERFLOW.search(body)
    if m:
        step = rows.last_step
        if rows.marks and rows.marks[-1].get("kind") == "overflow" and rows.marks[-1].get("scale") is None:
            step = rows.marks[-1]["step"]  # "Grad overflow on iteration N" came first
            rows.marks[-1]["scale"] = True
        else:
            last = rows.marks[-1] if rows.marks else {}
            if step is None or (last.get("numbered") and last.get("step") == step):
                # A paste of overflow messages alone: number them in order.
                step = (step or 0) + 1
                rows.marks.append({"kind": "overflow", "step": step, "scale": True, "numbered": True})
            else:
                rows.marks.append({"kind": "overflow", "step": step, "scale": True})
        if step is not None:
            row = rows.row_for(step)
            rows.put(row, "loss_scale", parse_number(m.group(1)))
            rows.put(row, "skipped", 1.0)
        return True
    if _DS_MIN.search(body):
        if rows.last_step is None:
            rows.row_for(1)  # the message alone (a ticket quoting it): one row for it to stand on
        rows.marks.append({"kind": "scale_at_minimum", "step": rows.last_step})
        return True
    return False


def looks_text(sample: Sample) -> bool:
    """A training log or a metrics paste: enough lines that are metric records.

    Lines of a known trainer format count one each; a before/after paste counts two (it holds
    two points); a Markdown table with a metric column is enough by itself. Lines read only by
    the fallback grammar count when, together, they look like a run (some metric twice, rows
    not all equal), so a config dump that prints ``lr: 3e-4`` on every rank does not.
    """
    lines = [ln for ln in sample.text.replace("\r", "\n").split("\n")[:2000] if ln.strip()]
    if not lines:
        return False
    # Three metric lines make a training log; a short paste (a few lines copied into a ticket)
    # counts with two, since every line of it was chosen.
    need = 2 if len(lines) <= 40 else 3
    hits = 0
    loose: list[dict[str, float]] = []
    table: kvline.Table | None = None
    for ln in lines:
        if table is not None or ln.lstrip().startswith("|"):
            if table is None:
                table = kvline.table_header(ln)
            else:
                row = kvline.table_row(table, ln)
                if isinstance(row, kvline.Parsed) and table.seen_rule:
                    return True
                table = table if row is True else kvline.table_header(ln)
            if table is not None:
                continue
        got = _metric_line(ln)
        if got is None:
            continue
        if need == 2 and (not math.isfinite(got[2].get("loss", 0.0)) or "loss_scale" in got[2] and got[0] == "deepspeed"):
            return True  # a short paste whose one line is decisive (a NaN/Inf loss, the scaler at its minimum)
        if got[0] == "generic":
            loose.append(got[2])
        else:
            hits += 2 if got[0] == "change" else 1
        if hits + _loose_hits(loose) >= need:
            return True
    return False


def _loose_hits(loose: list[dict[str, float]]) -> int:
    """How many fallback-grammar lines count: all of them once two differ on a shared metric."""
    if len(loose) < 2:
        return 0
    first = loose[0]
    for other in loose[1:]:
        if first.keys() & other.keys() and other != first:
            return len(loose)
    return 0
