"""Rows keyed by step, shared by the line-oriented readers (JSONL, trainer logs, TensorBoard).

Those formats deliver one value at a time, in logging order; CSV delivers whole columns and only
shares :func:`postprocess` (clocks turned into step times). numpy is imported inside the
functions so that loading the probe (every ``mldoctor`` run) does not pay for it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from doctor.probes.metrics.detect import Series

#: Line-by-line readers (JSONL, text, TensorBoard) stop here: past it, CSV is the way in.
LINE_FORMAT_MAX = 256 * 2**20


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
               step_from: str = "column") -> Series:
        import numpy as np
        from doctor.probes.metrics.detect import Series

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
        postprocess(s)
        return s


def parse_number(text: str) -> float:
    """A logged number, with the NaN and Inf spellings of C, Python and MSVC runtimes."""
    t = text.strip().lower().lstrip("[").rstrip("]")
    if t in ("nan", "-nan", "+nan", "nan(ind)", "-nan(ind)"):
        return math.nan
    if t in ("inf", "+inf", "infinity", "+infinity"):
        return math.inf
    if t in ("-inf", "-infinity"):
        return -math.inf
    return float(t)


def postprocess(s: Series) -> None:
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

