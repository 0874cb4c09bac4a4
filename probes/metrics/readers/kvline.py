"""Metric numbers from a log line of any shape: the fallback grammar behind the trainer formats.

Known trainer formats (HF dicts, Megatron, Lightning bars) have their own parsers in
:mod:`~doctor.probes.metrics.readers.text`; everything else people log or paste is read here by
one grammar instead of one regex per trainer:

- a line is a sequence of ``key SEP value [unit]`` pairs, SEP being ``:``, ``=`` or a space;
  cells may be separated by ``|``, ``,``, `` - `` (Keras) or nothing (``step 10 loss: nan``);
- a value is an int, a float, scientific notation, ``nan``/``inf``/``-inf``, optionally wrapped
  as ``[0.0001]`` (DeepSpeed), ``tensor(0.53, device='cuda:0')`` or ``np.float32(0.5)``;
- a unit decides the metric when the key does not: ``it/s`` and ``s/it`` are step times,
  ``samples/s`` / ``tokens/s`` are throughput, ``50ms/step`` is a Keras step time;
- the step comes from a step key (``step``, ``iteration``, ``num_updates``), else a progress
  counter (``450/1000 [``, counted on from the epoch when one is known), else the caller's line
  order (an epoch number is kept as the ``epoch`` column: several lines share one);
- a Markdown table (``| step | loss |`` over ``|---|``) names its columns once in the header;
- a stated change is two points: ``from 1.2 s/it to 3.4 s/it``, ``1.2 s/it before, 3.4 s/it
  after``, ``it/s dropped from 5 to 1`` (the unit before the change); bare seconds only when the
  line says they are a step's or the data wait's; ``loss scale: 65536 -> 32768`` keeps the value
  after the arrow (a scale that went down marks a skipped step).

Numbers are found first and each key is read from the few characters before its number, so the
work per line is linear in its length (no pattern is allowed to scan a long line twice). A line
counts only when it looks like a record, not a sentence (:func:`parse` says how), so prose that
mentions "loss" and config dumps that print ``lr: 3e-4`` once do not become series.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import lru_cache

from doctor.probes.metrics.names import canonical
from doctor.probes.metrics.rows import parse_number

NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf(?:inity)?)(?![a-z])"
#: Rate and time units, longest first; a unit must end the token (``5s`` yes, ``5sec`` yes).
UNIT = (r"it/s|s/it|its/s|[mu]?s/step|(?:samples?|tokens?|toks?|seqs?|imgs?|images?|ex|examples?|"
        r"words?|sents?)/s(?:ec)?|ms|secs?|s")
#: A number, not part of a date, a clock time or a version (``2026-12-02``, ``13:32``, ``1.2.3``).
_NUMBER = re.compile(rf"(?<![\w.])(?:tensor\(|np\.float\d*\(|\[\s*)?({NUM})(?:\s*({UNIT}))?(?![\w./]|[-:]\d)",
                     re.I)
#: The key just before a number: up to four words, a unit in parentheses, then the separator.
_KEY_END = re.compile(r"((?:[A-Za-z][\w./]{0,40}[ \-]){0,3}[A-Za-z][\w./]{0,40})\s*(\((?:ms|s|sec)\))?\s*"
                      r"([:=]|\s)\s*$")
_CELL_BREAK = re.compile(r"\||,|;|\s-\s|[{}<>\[\]]")
#: ``450/1000 [`` (tqdm, Keras) or ``[ 50/1000]`` (mmengine): the step within an epoch.
_COUNTER = re.compile(r"(?<![\w./])(\d+)\s*/\s*(\d+)\s*\[|\[\s*(\d+)\s*/\s*(\d+)\s*\]")
_EPOCH_HEAD = re.compile(r"^\s*Epoch\s+(\d+)\s*/\s*(\d+)\s*$", re.I)
_CONFIG = re.compile(r"[:=]\s*['\"]?(?:true|false|none|null)\b", re.I)
_WORD = re.compile(r"[A-Za-z]{2,}")
#: A change pasted in a ticket: ``before: 1.2 s/it, after: 3.4 s/it``, ``from 1200 samples/s to 300``.
_CHANGE = re.compile(rf"(?<![\w])(?:from|before|was)\s*[:=]?\s*({NUM})\s*({UNIT})?(?![\w/])[^\d\n]{{0,40}}?"
                     rf"(?<![\w])(?:to|after|now)\s*[:=]?\s*({NUM})\s*({UNIT})?(?![\w/])", re.I)
#: The same change with each unit written after its number and the words after it:
#: ``1.2 s/it before, 3.4 s/it after``.
_CHANGE_POST = re.compile(rf"(?<![\w.])({NUM})\s*({UNIT})(?![\w/])\s*(?:before|previously|earlier|originally)\b"
                          rf"[^\d\n]{{0,40}}?(?<![\w.])({NUM})\s*({UNIT})?(?![\w/])\s*(?:after|now|today)\b", re.I)
#: A rate unit just before the change (``it/s dropped from 5 to 1``): the unit of both numbers.
_UNIT_BEFORE = re.compile(r"(it/s|s/it|its/s|[mu]?s/step|(?:samples?|tokens?|toks?|seqs?|imgs?|images?|ex|"
                          r"examples?|words?|sents?)/s(?:ec)?)\s*(?:[A-Za-z]+\s+){0,3}$", re.I)
#: ``65536 -> 32768``: the value after an arrow replaces the one before it (the new value).
_ARROW = re.compile(r"^\s*(?:->|=>|\u2192|-->)\s*$")
#: A cheap test before the change patterns: their words, as whole words.
_MAYBE_CHANGE = re.compile(r"\b(?:from|before|was|previously|earlier|originally)\b", re.I)
#: Bare seconds in a change count only when the line says they are a step's (or its data wait).
_TIMED = re.compile(r"step|iter|batch|epoch|data|it/s|s/it")
_EXCLUDED_WORDS = {"val", "eval", "valid", "validation", "test", "min", "max", "std", "best", "avg_val"}
#: Steps per second (fairseq's ``ups``): a step time once inverted.
_RATE_KEYS = {"ups", "it_s", "its", "steps_per_sec", "steps_per_second", "it_per_sec", "iters_per_sec",
              "iterations_per_second"}
_STEP_LIKE = ("step", "epoch", "rank", "run", "wall", "consumed")
#: Metrics whose presence makes a line a training-metric record.
VALUE_METRICS = ("loss", "grad_norm", "lr", "loss_scale", "throughput", "step_time", "data_time")


@dataclass
class Parsed:
    """One line's metrics and its step (None: the caller numbers lines in order)."""

    vals: dict[str, float] = field(default_factory=dict)
    step: int | None = None
    epoch: int | None = None
    #: several points on one line ("before/after" pastes), each a metrics dict in order.
    points: list[dict[str, float]] = field(default_factory=list)


_RATE = re.compile(rf"(?<![\w.])({NUM})\s*(it/s|s/it|its/s|[mu]?s/step|(?:samples?|tokens?|toks?|seqs?|imgs?|images?|"
                   rf"ex|examples?|words?|sents?)/s(?:ec)?)(?![\w./])", re.I)


def rates(body: str) -> dict[str, float]:
    """The step time and throughput a line states by unit alone (``3.1 it/s``, ``50ms/step``,
    ``1200 samples/s``): what a known format's parser leaves out, found in one regex pass."""
    out: dict[str, float] = {}
    for m in _RATE.finditer(body):
        try:
            got = _unit_metric(m.group(2), parse_number(m.group(1)), None)
        except ValueError:
            continue
        if got is not None:
            out.setdefault(got[0], got[1])
    return out


def _unit_metric(unit: str, value: float, key_canon: str | None) -> tuple[str, float] | None:
    """What a unit alone says: a rate is a step time or a throughput whatever the key."""
    u = unit.lower()
    if u in ("it/s", "its/s"):
        return ("step_time", 1.0 / value) if value > 0 else None
    if u == "s/it":
        return "step_time", value
    if u.endswith("/step"):
        return "step_time", value * (1e-3 if u.startswith("ms") else 1e-6 if u.startswith("us") else 1.0)
    if "/s" in u:
        return "throughput", value
    if key_canon in ("step_time", "data_time"):
        return key_canon, value * (1e-3 if u == "ms" else 1.0)
    return None


@lru_cache(maxsize=8192)
def _key(window: str) -> tuple[str | None, str, int, int, bool]:
    """The metric named at the end of ``window`` (text since the previous number).

    Returns (canonical name or None, the separator, where the key starts in the window, the
    words it covers, whether any word stands there). Only the text after the last cell break
    (``|``, ``,``, `` - ``, brackets) is the key's. The longest run of words that names a metric
    wins (``lm loss``, ``elapsed time per iteration``); a word such as ``val`` or ``max`` in
    front of it makes it another metric, so it is dropped. Cached: a log repeats its keys on
    every line, so the windows repeat too.
    """
    cut = 0
    for cb in _CELL_BREAK.finditer(window):
        cut = cb.end()
    rest = window[cut:]
    wordy = bool(_WORD.search(rest))
    m = _KEY_END.search(rest)
    if not m:
        return None, "", len(window), 0, wordy
    words = re.split(r"[ \-]", m.group(1))
    paren = m.group(2) or ""
    kpos, sep = cut + m.start(1), m.group(3)
    nwords = len(_WORD.findall(m.group(1)))
    for k in range(len(words)):
        cand = words[k:]
        if "_".join(cand).lower() in _RATE_KEYS:
            return "step_rate", sep, kpos, nwords, wordy
        if any(w.lower() in _EXCLUDED_WORDS for w in cand):
            continue
        c = canonical(" ".join(cand) + paren)
        if c is not None:
            if any(w.lower() in _EXCLUDED_WORDS for w in words[:k][-1:]):
                return None, sep, kpos, nwords, wordy
            return (c[0] if c[1] == 1.0 else f"{c[0]}@{c[1]}"), sep, kpos, nwords, wordy
    return None, sep, kpos, nwords, wordy


def parse(body: str, epoch: int | None = None) -> Parsed | None:
    """One line -> its metrics, or None when it is not a metric record; ``epoch`` is the one a
    header line above announced (Keras), for bars that count steps within an epoch.

    A record, not a sentence: at least one training metric named by its key (a rate alone is
    any progress bar: a download, a preprocessing pass), and other than a learning rate unless
    a step key says which step (``lr=3e-4`` is what configs and code say); a lone ``key value``
    pair (space separated, no ``|`` cell) is not enough, nor are more leftover words than pairs
    (prose quoting a number); ``key=True`` pairs mark a config dump; a question is never one.
    """
    if body.rstrip().endswith("?") or _CONFIG.search(body):
        return None
    if _MAYBE_CHANGE.search(body):
        for change in (*_CHANGE.finditer(body), *_CHANGE_POST.finditer(body)):
            pts = _change_points(body, change)  # the first change with a unit ("from 2 to 8 GPUs" has none)
            if pts:
                return Parsed(points=pts)
    out = Parsed()
    spans: list[tuple[int, int]] = []
    prev = 0
    n_pairs = 0
    strict = False
    keyed = False
    piped = "|" in body
    covered = 0
    last_name: str | None = None
    arrows = ">" in body or "\u2192" in body
    for m in _NUMBER.finditer(body):
        start = m.start()
        wstart = max(prev, start - 80)
        prev = m.end()
        if arrows and last_name and _ARROW.match(body[wstart:start]):
            _arrow_value(out, last_name, m.group(1))
            continue
        last_name = None
        name, sep, kpos, nwords, wordy = _key(body[wstart:start])
        raw, unit = m.group(1), m.group(2) or ""
        if name is None and not unit:  # a number without a metric: a date, an id, a count
            if wordy and sep:
                n_pairs += 1
                spans.append((wstart + kpos, m.end()))
                covered += nwords + len(_WORD.findall(raw))
            continue
        try:
            value = parse_number(raw)
        except ValueError:
            continue
        factor = 1.0
        if name and "@" in name:
            name, f = name.split("@")
            factor = float(f)
        if unit:
            got = _unit_metric(unit, value, name)
            if got is None and name in ("step_time", "data_time"):
                continue  # "time 5 items/s": neither
            if got is not None:
                keyed = keyed or got[0] == name
                name, value, factor = got[0], got[1], 1.0
            elif name in VALUE_METRICS:
                keyed = True
        elif name in VALUE_METRICS or name == "step_rate":
            keyed = True
        if name is None:
            if wordy and sep:
                n_pairs += 1
                spans.append((wstart + kpos, m.end()))
                covered += nwords + len(_WORD.findall(m.group(0)))
            continue
        n_pairs += 1
        spans.append((wstart + kpos, m.end()))
        covered += nwords + len(_WORD.findall(m.group(0)))
        strict = strict or sep in (":", "=") or bool(unit)
        if name == "step_rate":
            if not value > 0:
                continue
            name, value = "step_time", 1.0 / value
        if name == "step":
            if out.step is None and raw.isdigit():
                out.step = int(raw)
            continue
        if name == "epoch":
            if out.epoch is None and math.isfinite(value):
                out.epoch = int(value)
            continue
        if name in ("rank", "run", "wall"):
            continue
        if name not in out.vals:
            out.vals[name] = value * factor
            last_name = name if arrows and factor == 1.0 and not unit else None
    if not keyed or not any(k in out.vals for k in VALUE_METRICS):
        return None
    # A learning rate alone is what configs and code say (``lr=3e-4``); so is a lone scale.
    # Unless a step counter says this is a record of one step.
    if out.step is None and (not any(k in out.vals for k in VALUE_METRICS if k != "lr")
                             or (set(out.vals) <= {"lr", "loss_scale"} and n_pairs < 2)):
        return None
    if n_pairs < 2 and not strict and not piped:
        return None
    first = min(s for s, _ in spans)
    last = max(e for _, e in spans)
    leftover = len(_WORD.findall(body[first:last])) - covered
    if leftover > max(2, n_pairs):
        return None
    if out.epoch is None:
        out.epoch = epoch
    if out.step is None:
        c = _COUNTER.search(body)
        if c:
            n = int(c.group(1) or c.group(3))
            total = int(c.group(2) or c.group(4))
            out.step = (out.epoch or 0) * total + n
    if out.epoch is not None:
        out.vals["epoch"] = float(out.epoch)
    return out


def _arrow_value(out: Parsed, name: str, raw: str) -> None:
    """``loss scale: 65536 -> 32768``: the value now is the one after the arrow; a scale that
    went down is a step the scaler skipped for overflow (DeepSpeed, apex and GradScaler halve
    the scale exactly when they skip a step)."""
    try:
        new = parse_number(raw)
    except ValueError:
        return
    old = out.vals.get(name)
    out.vals[name] = new
    if name == "loss_scale" and old is not None and new < old:
        out.vals["skipped"] = 1.0


def _change_points(body: str, m: re.Match[str]) -> list[dict[str, float]]:
    """Two points of one metric from a before/after sentence; the metric comes from the unit
    (after either number, or just before the change: ``it/s dropped from 5 to 1``), or from the
    words of the line for bare seconds (``data time went from 0.1s to 0.8s``)."""
    low = body.lower()
    pts = []
    unit = m.group(2) or m.group(4) or ""
    if not unit:
        before = _UNIT_BEFORE.search(body, max(0, m.start() - 60), m.start())
        unit = before.group(1) if before else ""
    if not unit:
        return []
    hint = "data_time" if "data" in low else "step_time"
    if unit.lower() in ("s", "ms", "sec", "secs") and not _TIMED.search(low):
        return []  # bare seconds of what? ("the import took 5s before, 10s after"): not a step
    for raw, u in ((m.group(1), m.group(2) or unit), (m.group(3), m.group(4) or unit)):
        try:
            v = parse_number(raw)
        except ValueError:
            return []
        got = _unit_metric(u, v, hint)
        if got is None:
            return []
        pts.append({got[0]: got[1]})
    return pts


def epoch_header(line: str) -> int | None:
    """Keras prints ``Epoch 5/10`` on its own line; its bars that follow count steps in it."""
    m = _EPOCH_HEAD.match(line)
    return int(m.group(1)) if m else None


@dataclass
class Table:
    """A Markdown table being read: which column is which metric."""

    cols: list[str | None]
    seen_rule: bool = False


def _cells(line: str) -> list[str] | None:
    s = line.strip()
    if not (s.startswith("|") and s.endswith("|")) or len(s) < 3:
        return None
    return [c.strip() for c in s[1:-1].split("|")]


def table_header(line: str) -> Table | None:
    """``| step | loss | lr |``: every cell a name, one of them a training metric."""
    cells = _cells(line)
    if not cells or len(cells) < 2 or any(not c or _NUMBER.fullmatch(c) for c in cells):
        return None
    cols: list[str | None] = []
    for c in cells:
        name = canonical(c)
        cols.append(name[0] if name and name[1] == 1.0 else None)
    if not any(c in VALUE_METRICS for c in cols):
        return None
    return Table(cols)


def table_row(table: Table, line: str) -> Parsed | None | bool:
    """A row of the table: its metrics; True for the ``|---|`` rule; None ends the table."""
    cells = _cells(line)
    if cells is None or len(cells) != len(table.cols):
        return None
    if all(set(c) <= set("-: ") and c for c in cells):
        table.seen_rule = True
        return True
    out = Parsed()
    for name, cell in zip(table.cols, cells, strict=True):
        if name is None:
            continue
        m = _NUMBER.fullmatch(cell.strip())
        if not m:
            continue
        try:
            v = parse_number(m.group(1))
        except ValueError:
            continue
        if name == "step":
            out.step = int(v) if math.isfinite(v) else None
        elif name == "epoch":
            out.epoch = int(v) if math.isfinite(v) else None
        elif name not in _STEP_LIKE:
            out.vals[name] = v
    if out.step is None and out.epoch is not None:
        out.step = out.epoch
    return out if out.vals else True
