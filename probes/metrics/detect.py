"""Loss-curve and training-stability detectors over logged training metrics.

Input is one :class:`Series` per run/rank/file (numpy arrays in logging order, so a resume that
sends the step counter backwards stays visible); output is a small, JSON-shaped summary and a
list of events that the ``metrics`` probe (``summarize``) turns into ``metrics.*`` facts.

Every detector is vectorised (numpy, blocks of ``window`` points) so ten million rows take well
under a second; exact per-point work is only done around the few candidate events. Thresholds
live in :class:`Params`, each named with its source; override them with environment variables
``MLDOCTOR_METRICS_<NAME>`` (e.g. ``MLDOCTOR_METRICS_SPIKE_Z=5``) or an ``options`` mapping.

Sources of the defaults (see shared/knowledge/perf-health-stability-anchors.md, section 5):

- robust z-score over a trailing window: llm.c ``OutlierDetector`` (z-score over a sliding
  window of 128) and Megatron-LM's rerun state machine (first 100 samples as the reference);
  median/MAD instead of mean/std so the spike itself does not widen its own yardstick.
- ``spike_z = 7``: OLMo 2's spike score counts points 7 sigma from a rolling average.
- ``window = 100``: llm-foundry ``KillLossSpike`` window_size and Megatron's 100 samples.
- ``div_rel = 0.15`` for a sustained rise: llm-foundry flags divergence when at least half its
  window stays above a cap; we ask for the last window's median to stay 15% above the best
  level reached (proposal, relative so it works for any loss scale). ``div_z``, ``div_drop_rel``
  and ``div_best_k`` keep a near-zero, heavy-tailed healthy loss from passing for a rise: a
  pooled noise estimate, a floor of 5% of the loss's own drop, and a best level that is the
  median of the 3 lowest window medians (reasons in :mod:`~doctor.probes.metrics.trend`).
- ``gn_ratio = 10``: Megatron's ``SPIKY_LOSS_FACTOR`` (10x the reference) applied to the grad
  norm; "explosion" is an order of magnitude, sustained or followed by NaN/divergence.
- ``ls_floor = 1``: DeepSpeed and Megatron ``min_loss_scale`` default; torch GradScaler starts
  at 65536 and halves on each overflow (its docs), so a scale that reaches 1 has lost 16 halvings.
- ``lr_jump_ratio = 2``: a schedule changes the LR smoothly; a 2x change between two logged
  points that the neighbouring points do not share is a jump (proposal).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

METRICS = ("loss", "grad_norm", "lr", "loss_scale", "step_time", "data_time", "skipped",
           "nan_iters", "epoch", "consumed", "throughput")


@dataclass(frozen=True)
class Params:
    """Detector thresholds; see the module docstring for where each default comes from."""

    window: int = 100            # trailing window (points) for median/MAD baselines
    min_window: int = 8          # short series: window shrinks to n//10 but not below this
    spike_z: float = 7.0         # robust z-score of a spike (OLMo 2: 7 sigma)
    spike_min_rel: float = 0.10  # and at least 10% above the baseline median
    scale_floor_rel: float = 0.01  # MAD floor, as a share of the median (flat series)
    spike_gap: int = 3           # candidate points closer than this form one event
    recover_windows: float = 5.0  # look this many windows after a spike for recovery
    div_rel: float = 0.15        # sustained: last window's median 15% above the best level
    div_z: float = 8.0           # ... and this many standard errors of a window median, the noise
                                 # pooled over the windows compared (trend.py; healthy max 6.7)
    div_drop_rel: float = 0.05   # ... and 5% of the drop from the first window to the best level
    div_best_k: int = 3          # best level: median of the 3 lowest window medians (not the min)
    gn_ratio: float = 10.0       # grad norm >= 10x its trailing median (Megatron factor 10)
    gn_growth: float = 100.0     # or its window median grows 100x over the run
    gn_min_points: int = 2       # an explosion lasts at least this many logged points ...
    lead_horizon: int = 50       # ... or a NaN/divergence follows within this many steps
    lr_jump_ratio: float = 2.0   # LR changes by 2x between two logged points
    ls_floor: float = 1.0        # min_loss_scale default of DeepSpeed/Megatron
    ls_collapse_pow: int = 10    # or the scale ends 2**10 below its post-calibration peak
    skip_share: float = 0.05     # skipped steps after calibration above 5% of steps
    skip_min: int = 10           # ... and at least this many
    context_steps: int = 50      # what changed within this many steps before an event
    plateau_rel: float = 0.01    # plateau: <1% improvement over the last quarter of the run
    max_spikes: int = 20
    max_events: int = 50

    @classmethod
    def from_env(cls, options: dict[str, Any] | None = None, environ: dict[str, str] | None = None) -> Params:
        """Defaults, then ``MLDOCTOR_METRICS_<NAME>`` variables, then ``options`` (wins)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = (options or {}).get(f.name, env.get(f"MLDOCTOR_METRICS_{f.name.upper()}"))
            if raw is None or raw == "":
                continue
            try:
                values[f.name] = int(raw) if f.type in ("int", int) else float(raw)
            except (TypeError, ValueError):
                continue  # a bad override keeps the default rather than breaking the diagnosis
        return replace(cls(), **values)


@dataclass
class Series:
    """One run's (or rank's, or file's) metrics, in logging order.

    ``cols[m]`` holds NaN where ``m`` was not logged on that row; ``nan_logged[m]`` marks rows
    where a NaN was *logged* (a diverged loss), which a missing cell must not be mistaken for.
    ``marks`` are text events the reader saw (overflow messages, restarts).
    """

    name: str
    file: str
    fmt: str
    step: np.ndarray
    cols: dict[str, np.ndarray]
    nan_logged: dict[str, np.ndarray] = field(default_factory=dict)
    rank: int | None = None
    run: str | None = None
    step_from: str = "column"
    marks: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return int(len(self.step))


# -- small helpers -----------------------------------------------------------------------------

def _f(x: Any, nd: int = 6) -> float | None:
    """A JSON-safe float: None for NaN, strings never; rounded to ``nd`` significant digits."""
    if x is None:
        return None
    x = float(x)
    if math.isnan(x):
        return None
    if math.isinf(x):
        return x
    return float(f"{x:.{nd}g}")


def format_number(x: float | None) -> str:
    """A number for a readable line: 4 significant digits read well and keep a finding short."""
    if x is None:
        return "nan"
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.4g}"


def observed(s: Series, m: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of the rows where ``m`` was logged (a logged NaN counts, a gap does not).

    Cached per series: detectors and charts ask for the same metric several times.
    """
    cache = s.meta.setdefault("_observed", {})
    if m in cache:
        return cache[m]
    v = s.cols.get(m)
    if v is None:
        res = (np.empty(0, np.int64), np.empty(0))
    else:
        miss = np.isnan(v)
        if not miss.any():
            res = (s.step, v)
        else:
            logged = s.nan_logged.get(m)
            keep = ~miss if logged is None else (~miss | logged)
            res = (s.step, v) if keep.all() else (s.step[keep], v[keep])
    cache[m] = res
    return res


@dataclass
class Blocks:
    """Median and robust scale of consecutive blocks of ``size`` points (a trailing baseline)."""

    size: int
    med: np.ndarray
    scale: np.ndarray

    def baseline(self, i: int) -> tuple[float, float]:
        """Median and scale of the block before the one holding point ``i``."""
        k = max(0, min(i // self.size - 1, len(self.med) - 1))
        return float(self.med[k]), float(self.scale[k])


def sample(x: np.ndarray) -> np.ndarray:
    """A strided sample of at most ~1M points for medians and percentiles of long series
    (exact below that; above, the error is far below anything a threshold cares about)."""
    return x if len(x) <= BIG else x[:: len(x) // BIG + 1]


def finite_part(x: np.ndarray, steps: np.ndarray, ok: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The finite (or ``ok``) values and their steps, as views when the bad ones are a tail
    (the usual diverged run) and copies only when they are scattered."""
    if ok is None:
        ok = np.isfinite(x)
    if ok.all():
        return x, steps
    k = int(np.argmin(ok))  # first bad one
    if not ok[k:].any():
        return x[:k], steps[:k]
    return x[ok], steps[ok]


def block_size(n: int, p: Params) -> int:
    return int(min(p.window, max(p.min_window, n // 10)))


BIG = 1_000_000  # above this many points, statistics use float32 blocks and strided samples


def blocks(x: np.ndarray, size: int, floor_rel: float) -> Blocks:
    """Median and MAD per block, with one temporary (float32 for long series: half the memory
    traffic; the MAD floor below covers what float32 cannot resolve)."""
    nb = len(x) // size
    if nb == 0:
        return Blocks(size, np.empty(0), np.empty(0))
    xb = x[: nb * size].reshape(nb, size)
    tmp = xb.astype(np.float32 if len(x) > BIG else np.float64)
    # One in-place partition per statistic (for an even block the upper middle value stands in
    # for the median: as robust a centre, half the work).
    tmp.partition(size // 2, axis=1)
    med = tmp[:, size // 2].astype(np.float64)
    np.subtract(xb, med[:, None], out=tmp, casting="unsafe")
    np.abs(tmp, out=tmp)
    tmp.partition(size // 2, axis=1)
    mad = tmp[:, size // 2].astype(np.float64)
    del tmp
    scale = np.maximum(1.4826 * mad, floor_rel * np.abs(med))
    scale = np.maximum(scale, 1e-12)
    return Blocks(size, med, scale)


def group_runs(idx: np.ndarray, gap: int) -> list[tuple[int, int]]:
    """Consecutive indices (gaps up to ``gap``) as (first, last) pairs."""
    if len(idx) == 0:
        return []
    cuts = np.flatnonzero(np.diff(idx) > gap)
    starts = np.concatenate(([0], cuts + 1))
    ends = np.concatenate((cuts, [len(idx) - 1]))
    return [(int(idx[a]), int(idx[e])) for a, e in zip(starts, ends, strict=True)]


def rolling_median(x: np.ndarray, k: int = 5, centered: bool = False) -> np.ndarray:
    """Median of ``x[i:i+k]`` at ``i`` (looking ahead), or of ``x[i-k//2:i+k//2+1]`` if centered."""
    if len(x) < k:
        return np.full(len(x), np.median(x)) if len(x) else x.copy()
    from numpy.lib.stride_tricks import sliding_window_view

    out = np.median(sliding_window_view(x, k), axis=1)
    if centered:
        h = k // 2
        return np.concatenate((np.full(h, out[0]), out, np.full(k - 1 - h, out[-1])))
    return np.concatenate((out, np.full(k - 1, out[-1])))


def upward_outliers(x: np.ndarray, p: Params, min_rel: float, ratio: float | None = None
                    ) -> tuple[list[dict[str, Any]], Blocks, int]:
    """Points far above their trailing window, grouped into events (most extreme first).

    Each point is compared with the median and robust scale of the block before it, block by
    block without materialising per-point baselines. Returns the events (positions in ``x``),
    the block statistics and the total number of events before capping.
    """
    n = len(x)
    size = block_size(n, p)
    b = blocks(x, size, p.scale_floor_rel)
    nb = len(b.med)
    if nb == 0:
        return [], b, 0
    parts = []
    with np.errstate(invalid="ignore", divide="ignore"):
        if nb >= 2:
            xb = x[size: nb * size].reshape(nb - 1, size)
            base = b.med[:-1, None]
            d = xb - base
            cand = d >= min_rel * np.abs(base)
            if ratio is not None:
                cand &= xb >= ratio * base
            d /= b.scale[:-1, None]
            cand &= d >= p.spike_z
            del d
            parts.append(np.flatnonzero(cand) + size)
        if n > nb * size:
            rest = x[nb * size:]
            z = (rest - b.med[-1]) / b.scale[-1]
            c2 = (z >= p.spike_z) & (rest - b.med[-1] >= min_rel * abs(b.med[-1]))
            if ratio is not None:
                c2 &= rest >= ratio * b.med[-1]
            parts.append(np.flatnonzero(c2) + nb * size)
    idx = np.concatenate(parts) if parts else np.empty(0, np.int64)
    runs = group_runs(idx, p.spike_gap)
    total = len(runs)
    if total > 4 * max(p.max_spikes * 5, 100):  # a noisy series: judge the largest only
        runs = sorted(runs, key=lambda r: -float(np.max(x[r[0]: r[1] + 1])))[: max(p.max_spikes * 5, 100)]
    events = []
    for a, e in runs:
        k = np.minimum(np.arange(a, e + 1) // size - 1, nb - 1)
        k = np.maximum(k, 0)
        zseg = (x[a: e + 1] - b.med[k]) / b.scale[k]
        j = int(np.nanargmax(zseg))
        ka = int(k[0])
        events.append({"start": a, "end": e, "peak": a + j, "z": float(zseg[j]), "base": float(b.med[ka])})
    events.sort(key=lambda ev: -ev["z"])
    return events[: max(p.max_spikes * 5, 100)], b, total


def logged_nan(v: np.ndarray, others: list[np.ndarray]) -> np.ndarray | None:
    """Which NaN cells of a table column (CSV without "nan" text, DataFrame) are NaN *values*.

    A table cannot tell a NaN from an empty cell (pandas even writes NaN as ""), so the shape
    decides, conservatively: only the run of empty cells after the column's last value counts,
    on rows where another training metric (grad norm, lr, step time, ...) was still logged
    (when the table has any), and only if that run is longer than the column's own gaps (a
    metric logged every 10th row leaves 9-row gaps that are not NaN). Empty cells between
    values are gaps: a false "loss became NaN" costs more than a missed isolated one.
    """
    isn = np.isnan(v)
    if not isn.any():
        return None
    fin = np.flatnonzero(~isn)
    if len(fin) == 0 or fin[-1] == len(v) - 1:
        return None
    gaps = np.diff(fin) - 1
    longest_gap = int(gaps.max()) if len(gaps) else 0
    cand = np.zeros(len(v), bool)
    cand[fin[-1] + 1:] = True
    if others:
        has_other = np.zeros(len(v), bool)
        for o in others:
            has_other |= np.isfinite(o)
        cand &= has_other
    if int(cand.sum()) <= 2 * longest_gap:
        return None
    return cand if cand.any() else None


# -- per-metric analyses -----------------------------------------------------------------------

def analyze_loss(steps: np.ndarray, x: np.ndarray, p: Params) -> dict[str, Any]:
    """First non-finite value, spikes (with recovery), sustained divergence, plateau."""
    out: dict[str, Any] = {"rows": int(len(x))}
    if len(x) == 0:
        return out
    fin = np.isfinite(x)
    all_finite = bool(fin.all())
    out["first_nan"] = None
    if not all_finite:
        f = int(np.argmax(~fin))  # everything before f is finite, by definition
        later_finite = bool(fin[f:].any())
        out["first_nan"] = {
            "pos": f, "step": int(steps[f]),
            "value": "nan" if math.isnan(x[f]) else ("inf" if x[f] > 0 else "-inf"),
            "count": int(len(x) - np.count_nonzero(fin)), "recovered": later_finite,
            "last_finite_step": int(steps[f - 1]) if f > 0 else None,
            "last_finite_value": _f(x[f - 1]) if f > 0 else None,
        }
    # Spikes and trends are judged on the finite values (up to a NaN that never recovers).
    if all_finite:
        xs, ss = x, steps
    elif not out["first_nan"]["recovered"]:
        f = out["first_nan"]["pos"]
        xs, ss = x[:f], steps[:f]  # views: no copy of a long prefix
    else:
        xs, ss = x[fin], steps[fin]
    n = len(xs)
    finite_vals = xs
    if n:
        out.update(first=_f(xs[0]), last=_f(xs[-1]), min=_f(xs.min()), min_step=int(ss[int(xs.argmin())]),
                   median=_f(np.median(sample(xs))), max=_f(xs.max()))
    evs, b, total = upward_outliers(xs, p, p.spike_min_rel) if n >= 2 * p.min_window else ([], blocks(xs, max(1, n), p.scale_floor_rel), 0)
    out["block"] = b.size
    spikes = []
    horizon = int(max(p.recover_windows * b.size, 20))
    for ev in evs:
        a, e, pk = ev["start"], ev["end"], ev["peak"]
        base_med, base_sc = b.baseline(a)
        thr = base_med + max(3.0 * base_sc, p.spike_min_rel * abs(base_med) * 0.5)
        k = max(5, b.size // 4)  # back for a while, not for one lucky point
        after = finite_vals[e + 1: e + 1 + horizon + k - 1]
        rec_pos = None
        if len(after):
            sm = rolling_median(after, min(k, len(after)))[: horizon]
            hit = np.flatnonzero(sm <= thr)
            if len(hit):
                rec_pos = e + 1 + int(hit[0])
        ongoing = rec_pos is None and (n - 1 - e) < horizon
        spikes.append({
            "pos": a, "step": int(ss[a]), "peak_step": int(ss[pk]), "value": _f(xs[pk]),
            "baseline": _f(base_med), "zscore": _f(ev["z"], 4),
            "ratio": _f(xs[pk] / base_med, 4) if base_med > 0 else None,
            "points": int(e - a + 1), "recovered": rec_pos is not None,
            "recovery_steps": int(ss[rec_pos] - ss[a]) if rec_pos is not None else -1,
            "ongoing": bool(ongoing),
        })
    out["spikes"] = spikes
    out["n_spikes"] = total
    out["divergence"] = _divergence(xs, ss, b, p, spikes)
    out["plateau"] = _plateau(xs, ss, b, p)
    return out


def _divergence(x: np.ndarray, steps: np.ndarray, b: Blocks, p: Params, spikes: list[dict[str, Any]]) -> dict[str, Any]:
    """A rise that lasts (see :mod:`~doctor.probes.metrics.trend` for how noise is kept out)."""
    from doctor.probes.metrics.trend import divergence

    return divergence(x, steps, b, p, spikes)


def _plateau(x: np.ndarray, steps: np.ndarray, b: Blocks, p: Params) -> dict[str, Any]:
    """No real progress over the last quarter of the run (information only, no rule)."""
    nb = len(b.med)
    if nb < 8:
        return {"detected": False}
    q = max(2, nb // 4)
    before = float(np.min(b.med[: nb - q]))
    last = float(np.min(b.med[nb - q:]))
    improve = (before - last) / abs(before) if before else 0.0
    res = {"detected": bool(-p.plateau_rel <= improve < p.plateau_rel), "since_step": int(steps[(nb - q) * b.size]),
           "improvement": _f(improve, 4), "level": _f(last)}
    return res


def analyze_grad_norm(steps: np.ndarray, g: np.ndarray, p: Params) -> dict[str, Any]:
    """Summary, non-finite norms, and explosions (10x jumps that last, or 100x growth)."""
    out: dict[str, Any] = {"rows": int(len(g)), "explosion": False}
    if len(g) == 0:
        return out
    fin = np.isfinite(g)
    out["nonfinite"] = int(len(g) - np.count_nonzero(fin))
    out["first_nonfinite_step"] = int(steps[int(np.argmin(fin))]) if out["nonfinite"] else -1
    # Non-finite norms at the end that never came back: the updates are NaN from there on (one
    # overflow step that the fp16 scaler skips leaves a single non-finite point, not a tail).
    last_ok = np.flatnonzero(fin[-100_000:])
    tail = len(fin[-100_000:]) - 1 - int(last_ok[-1]) if len(last_ok) else len(fin)
    out["nonfinite_tail"] = int(tail)
    out["nonfinite_tail_step"] = int(steps[len(g) - tail]) if tail else -1
    gs, ss = finite_part(g, steps, fin)
    if len(gs) == 0:
        return out
    gsm = sample(gs)
    out.update(median=_f(np.median(gsm)), p90=_f(np.percentile(gsm, 90)), max=_f(gs.max()),
               max_step=int(ss[int(gs.argmax())]))
    events: list[dict[str, Any]] = []
    if len(gs) >= 2 * p.min_window:
        evs, b, _ = upward_outliers(gs, p, p.spike_min_rel, ratio=p.gn_ratio)
        for ev in evs:
            a, e, pk = ev["start"], ev["end"], ev["peak"]
            events.append({"pos": a, "step": int(ss[a]), "peak_step": int(ss[pk]), "value": _f(gs[pk]),
                           "baseline": _f(ev["base"]), "zscore": _f(ev["z"], 4),
                           "ratio": _f(gs[pk] / ev["base"], 4) if ev["base"] > 0 else None,
                           "points": int(e - a + 1), "end_step": int(ss[e])})
        # Slow growth by orders of magnitude: a window median far above the lowest before it.
        if len(b.med) >= 3:
            run_min = np.minimum.accumulate(b.med)
            with np.errstate(divide="ignore", invalid="ignore"):
                grow = b.med[1:] / run_min[:-1]
            k = np.flatnonzero(grow >= p.gn_growth)
            if len(k):
                pos = (int(k[0]) + 1) * b.size
                out["growth"] = {"step": int(ss[pos]), "ratio": _f(float(grow[k[0]]), 4)}
    events.sort(key=lambda ev: ev["step"])
    out["events"] = events
    return out


def analyze_loss_scale(steps: np.ndarray, sc: np.ndarray, skipped: np.ndarray | None,
                       skip_steps: np.ndarray | None, p: Params) -> dict[str, Any]:
    """Dynamic loss scale: calibration, collapse toward underflow, skipped steps."""
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(sc) & (sc > 0)
    sc, st = finite_part(sc, steps, ok)
    out: dict[str, Any] = {"rows": int(len(sc)), "collapsed": False}
    if len(sc) == 0:
        return out
    d = np.diff(sc)
    dec = np.flatnonzero(d < 0) + 1
    inc = np.flatnonzero(d > 0) + 1
    # Calibration: the run of decreases right at the start (GradScaler starts high on purpose).
    calib_end = 0
    while calib_end < len(dec) and dec[calib_end] <= calib_end + 1 + max(2, len(sc) // 50):
        calib_end += 1
    after_calib = int(dec[calib_end - 1]) + 1 if calib_end else 0
    peak_ref = float(sc[after_calib:].max()) if after_calib < len(sc) else float(sc.max())
    mn_pos = int(sc.argmin())
    out.update(initial=_f(sc[0]), final=_f(sc[-1]), min=_f(sc[mn_pos]), min_step=int(st[mn_pos]),
               max=_f(sc.max()), decreases=int(len(dec)), increases=int(len(inc)),
               calibration_decreases=int(calib_end))
    # Skipped steps: logged flags/counts when present, else one per decrease of the scale.
    if skip_steps is not None and len(skip_steps):
        sk_steps = np.asarray(skip_steps)
        out["skipped_source"] = "logged"
    else:
        sk_steps = st[dec]
        out["skipped_source"] = "scale_decreases"
    n_steps = max(1, int(len(np.unique(steps))))
    calib_last_step = int(st[after_calib - 1]) if after_calib else int(st[0]) - 1
    late = sk_steps[sk_steps > calib_last_step]
    out.update(skipped_steps=int(len(sk_steps)), skipped_share=_f(len(sk_steps) / n_steps, 4),
               skipped_after_calibration=int(len(late)),
               skipped_share_after_calibration=_f(len(late) / n_steps, 4),
               first_skip_step=int(sk_steps.min()) if len(sk_steps) else -1,
               first_skip_after_calibration=int(late.min()) if len(late) else -1)
    floor_hit = float(sc.max()) > p.ls_floor and float(sc[mn_pos]) <= p.ls_floor
    fell = float(sc[-1]) <= peak_ref / 2.0 ** p.ls_collapse_pow
    if floor_hit or fell:
        # Start of the collapse: the run of decreases (one level may repeat, as with DeepSpeed's
        # hysteresis or a rounded print) that ends at the minimum.
        j = mn_pos
        while j > 0 and (sc[j - 1] > sc[j] or (sc[j - 1] == sc[j] and j > 1 and sc[j - 2] > sc[j - 1])):
            j -= 1
        out.update(collapsed=True, collapse_step=int(st[j]), peak=_f(peak_ref),
                   drop_pow2=_f(math.log2(peak_ref / max(float(sc[mn_pos]), 1e-300)), 4))
        below = np.flatnonzero(sc <= p.ls_floor)
        if len(below):
            out["floor_step"] = int(st[below[0]])
    out["many_skipped"] = bool(len(late) >= p.skip_min and len(late) / n_steps >= p.skip_share)
    out["_late_skips"] = late
    return out


def lr_jumps(steps: np.ndarray, lr: np.ndarray, p: Params) -> list[dict[str, Any]]:
    """Abrupt learning-rate changes that the neighbouring points do not share."""
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(lr) & (lr > 0)
    lr, st = finite_part(lr, steps, ok)
    if len(lr) < 3:
        return []
    with np.errstate(divide="ignore", invalid="ignore"):
        r = lr[1:] / lr[:-1]
        big = np.flatnonzero((r >= p.lr_jump_ratio) | (r <= 1.0 / p.lr_jump_ratio))
    out = []
    for i in big:
        d_i = math.log(r[i])
        if i == 0 or abs(math.log(r[i - 1])) > 0.25 * abs(d_i):
            continue  # part of a steep but smooth schedule (early warm-up)
        out.append({"step": int(st[i + 1]), "from": _f(lr[i]), "to": _f(lr[i + 1]),
                    "ratio": _f(lr[i + 1] / lr[i], 4)})
        if len(out) >= p.max_events:
            break
    return out


def restarts(s: Series, p: Params) -> list[dict[str, Any]]:
    """Resumes (the step counter goes back) and data-order restarts (epoch/samples go back)."""
    out: list[dict[str, Any]] = []
    st = s.step
    if len(st) >= 2 and s.step_from == "column":
        back = np.flatnonzero(st[1:] <= st[:-1]) + 1  # no int64 temporary of ten million
        for i in back[: p.max_events]:
            out.append({"kind": "resume", "step": int(st[i]), "from_step": int(st[i - 1])})
    for m in ("epoch", "consumed"):
        ss, v = observed(s, m)
        if len(v) < 2:
            continue
        dv, ds = np.diff(v), np.diff(ss)
        back = np.flatnonzero((dv < 0) & (ds > 0)) + 1
        for i in back[: p.max_events]:
            out.append({"kind": "data_restart", "step": int(ss[i]), "from_step": int(ss[i - 1]),
                        "detail": f"{'epoch' if m == 'epoch' else 'consumed samples'} went back from "
                                  f"{format_number(_f(v[i - 1]))} to {format_number(_f(v[i]))}"})
    for mk in s.marks:
        if mk.get("kind") == "restart":
            out.append({"kind": "resume", "step": int(mk["step"]), "from_step": int(mk.get("from_step", -1))})
    out.sort(key=lambda r: r["step"])
    return out


def timing(s: Series) -> dict[str, Any]:
    """Step-time and data-time summaries (seconds), the share of time spent waiting for data, and
    throughput (items per second) with its first and last values: a pasted "before/after" is
    two points, and the change between them is the whole story."""
    res: dict[str, Any] = {}
    st_time = s.cols.get("step_time")
    dt = s.cols.get("data_time")
    def summary(v: np.ndarray, ok: np.ndarray) -> dict[str, Any] | None:
        v, _ = finite_part(v, v, ok)
        if not len(v):
            return None
        vs = sample(v)
        return {"median": _f(np.median(vs)), "p90": _f(np.percentile(vs, 90)), "mean": _f(v.mean()),
                "max": _f(v.max()), "n": int(len(v)), "unit": "s", "first": _f(v[0]), "last": _f(v[-1])}

    tp = s.cols.get("throughput")
    if tp is not None:
        with np.errstate(invalid="ignore"):
            sm = summary(tp, np.isfinite(tp) & (tp > 0))
        if sm:
            sm["unit"] = "per s"
            sm["min"] = _f(float(np.min(tp[np.isfinite(tp) & (tp > 0)])))
            sm["last_over_first"] = _f(sm["last"] / sm["first"], 4)  # both > 0: only positive values kept
            res["throughput"] = sm

    if st_time is not None:
        with np.errstate(invalid="ignore"):
            sm = summary(st_time, np.isfinite(st_time) & (st_time > 0))
        if sm:
            res["step_time"] = sm
    if dt is not None:
        with np.errstate(invalid="ignore"):
            sm = summary(dt, np.isfinite(dt) & (dt >= 0))
        if sm:
            res["data_time"] = sm
        if st_time is not None:
            both = np.isfinite(dt) & np.isfinite(st_time) & (st_time > 0) & (dt >= 0)
            tot = float(st_time[both].sum())
            if tot > 0:
                res["data_time_share"] = _f(min(1.0, float(dt[both].sum()) / tot), 4)
    return res


# -- one series, end to end --------------------------------------------------------------------

def _skip_steps(s: Series) -> np.ndarray | None:
    """Steps the logs say were skipped (per-row flags/counts; cumulative counters differenced)."""
    steps, v = observed(s, "skipped")
    mark_steps = [int(m["step"]) for m in s.marks if m.get("kind") == "overflow" and m.get("step") is not None]
    if len(v) == 0 and not mark_steps:
        return None
    out: list[np.ndarray] = []
    if len(v):
        v = np.nan_to_num(v, nan=0.0)
        if len(v) > 1 and np.all(np.diff(v) >= 0) and v.max() > 1:
            v = np.diff(np.concatenate(([0.0], v)))  # a running total such as DeepSpeed's skipped=N
        out.append(np.repeat(steps[v > 0], np.maximum(1, v[v > 0].astype(np.int64))))
    if mark_steps:
        out.append(np.asarray(mark_steps, np.int64))
    res = np.unique(np.concatenate(out)) if out else np.empty(0, np.int64)
    return res


def analyze_series(s: Series, p: Params) -> dict[str, Any]:
    """Everything the facts need about one series; JSON-shaped apart from internal ``pos`` keys."""
    res: dict[str, Any] = {"name": s.name, "file": s.file, "format": s.fmt, "rank": s.rank,
                           "run": s.run, "rows": s.rows, "step_from": s.step_from,
                           "metrics": sorted(m for m, v in s.cols.items() if len(v) and
                                             (not np.isnan(v).all() or m in s.nan_logged))}
    if s.rows:
        res["first_step"], res["last_step"] = int(s.step[0]), int(s.step[-1])
    ls, lv = observed(s, "loss")
    res["loss"] = analyze_loss(ls, lv, p) if len(lv) else None
    gs, gv = observed(s, "grad_norm")
    res["grad_norm"] = analyze_grad_norm(gs, gv, p) if len(gv) else None
    ss, sv = observed(s, "loss_scale")
    skip = _skip_steps(s)
    if len(sv):
        res["loss_scale"] = analyze_loss_scale(ss, sv, None, skip, p)
    elif skip is not None and len(skip):
        res["loss_scale"] = {"rows": 0, "collapsed": False, "skipped_steps": int(len(skip)),
                             "first_skip_step": int(skip.min()), "skipped_source": "logged",
                             "skipped_after_calibration": int(len(skip)),
                             "skipped_share": _f(len(skip) / max(1, len(np.unique(s.step))), 4)}
        res["loss_scale"]["many_skipped"] = bool(len(skip) >= p.skip_min and res["loss_scale"]["skipped_share"] >= p.skip_share)
    else:
        res["loss_scale"] = None
    ls_res = res["loss_scale"]
    if ls_res is not None:
        late = ls_res.pop("_late_skips", None)
        if late is None:
            late = skip if skip is not None else np.empty(0, np.int64)
        fn = (res["loss"] or {}).get("first_nan")
        # Overflow skips while the loss was still finite: the scaler was fighting before any NaN.
        ls_res["skips_before_nan"] = int((late < fn["step"]).sum()) if fn else int(len(late))
    for mk in s.marks:
        if mk.get("kind") == "scale_at_minimum":  # DeepSpeed says so, with or without logged values
            res["loss_scale"] = res["loss_scale"] or {"rows": 0, "skipped_steps": 0, "skips_before_nan": 0}
            res["loss_scale"]["collapsed"] = True
            res["loss_scale"].setdefault("collapse_step", int(mk.get("step") or res.get("last_step") or 0))
    lrs, lrv = observed(s, "lr")
    res["lr_jumps"] = lr_jumps(lrs, lrv, p) if len(lrv) else []
    if len(lrv):
        fin = lrv[np.isfinite(lrv)]
        if len(fin):
            res["lr"] = {"first": _f(fin[0]), "last": _f(fin[-1]), "max": _f(fin.max())}
    res["restarts"] = restarts(s, p)
    res.update(timing(s))
    _link(res, p)
    return res


def _link(res: dict[str, Any], p: Params) -> None:
    """Explosion sustained or not; what each event followed; lead of grad norm over the loss."""
    loss = res.get("loss") or {}
    nan = loss.get("first_nan")
    div = loss.get("divergence") or {}
    loss_bad: list[int] = []
    if nan:
        loss_bad.append(nan["step"])
    if div.get("detected"):
        loss_bad.append(div["step"])
    loss_bad += [sp["step"] for sp in loss.get("spikes", []) if not sp["recovered"]]
    gn = res.get("grad_norm")
    if gn:
        gn_nonfinite = gn.get("first_nonfinite_step", -1)
        chosen = None
        for ev in gn.get("events", []):
            follows = [b for b in loss_bad if 0 <= b - ev["step"] <= p.lead_horizon]
            goes_inf = gn_nonfinite >= 0 and 0 <= gn_nonfinite - ev["step"] <= p.lead_horizon
            ev["sustained"] = bool(ev["points"] >= p.gn_min_points or follows or goes_inf)
            if ev["sustained"] and chosen is None:
                chosen = ev
        growth = gn.get("growth")
        cand = [c for c in (chosen, growth) if c]
        if cand:
            first = min(cand, key=lambda c: c["step"])
            gn["explosion"] = True
            gn["explosion_step"] = first["step"]
            gn["explosion_ratio"] = first.get("ratio")
            after = [b - first["step"] for b in loss_bad if b - first["step"] >= 0]
            gn["leads_loss_by"] = int(min(after)) if after else -1
        else:
            gn["explosion_step"] = -1
            gn["leads_loss_by"] = -1
    # Context: what changed shortly before each loss event.
    changes: list[tuple[int, str]] = []
    for j in res.get("lr_jumps", []):
        changes.append((j["step"], f"learning rate jumped {format_number(j['ratio'])}x ({format_number(j['from'])} -> {format_number(j['to'])}) at step {j['step']}"))
    for r in res.get("restarts", []):
        if r["kind"] == "resume":
            changes.append((r["step"], f"resumed from a checkpoint at step {r['step']} (the step counter went back from {r['from_step']})"))
        else:
            changes.append((r["step"], f"data order restarted at step {r['step']} ({r.get('detail', '')})"))
    if gn and gn.get("explosion"):
        changes.append((gn["explosion_step"], f"grad norm exploded at step {gn['explosion_step']} ({format_number(gn.get('explosion_ratio'))}x its trailing median)"))
    ls = res.get("loss_scale") or {}
    if ls.get("collapsed"):
        changes.append((ls["collapse_step"], f"fp16 loss scale began collapsing at step {ls['collapse_step']} (down to {format_number(ls.get('min'))} at step {ls.get('min_step')})"))

    def context(step: int, exclude: str = "") -> list[str]:
        lo = step - p.context_steps
        return [t for s_, t in sorted(changes) if lo <= s_ <= step and not (exclude and t.startswith(exclude))]

    if nan:
        nan["context"] = context(nan["step"])
    for sp in loss.get("spikes", []):
        sp["context"] = context(sp["step"])
    if div.get("detected"):
        div["context"] = context(div["step"])
    if ls.get("collapsed"):
        ls["context"] = context(ls["collapse_step"], exclude="fp16 loss scale")
    if gn and gn.get("explosion"):
        gn["context"] = context(gn["explosion_step"], exclude="grad norm")


# -- downsampled curves for charts -------------------------------------------------------------

def curve(steps: np.ndarray, v: np.ndarray, points: int = 240) -> dict[str, list[Any]]:
    """At most ~``points`` (step, value) pairs keeping each bucket's min and max (spikes survive).

    Non-finite values are kept as the strings "nan"/"inf" so a chart can mark them.
    """
    n = len(v)
    if n == 0:
        return {"steps": [], "values": []}
    order = np.arange(n)
    if n > points:
        nbk = max(1, points // 2)
        edges = np.linspace(0, n, nbk + 1).astype(np.int64)
        keep: list[int] = []
        fin = np.isfinite(v)
        for a, e in zip(edges[:-1], edges[1:], strict=True):
            if e <= a:
                continue
            seg = v[a:e]
            f = fin[a:e]
            if f.all():
                keep += sorted({a + int(seg.argmin()), a + int(seg.argmax())})
            else:
                keep.append(a + int(np.argmax(~f)))
                if f.any():
                    idx = np.flatnonzero(f)
                    keep.append(a + int(idx[np.argmax(seg[f])]))
        order = np.unique(np.asarray(keep))
    vals: list[Any] = []
    for x in v[order]:
        vals.append(_f(x) if np.isfinite(x) else ("nan" if np.isnan(x) else ("inf" if x > 0 else "-inf")))
    return {"steps": [int(s) for s in steps[order]], "values": vals}
