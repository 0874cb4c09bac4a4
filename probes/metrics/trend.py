"""Sustained loss divergence: the last window sits well above the best level reached before it.

Split out of :mod:`~doctor.probes.metrics.detect` (which calls :func:`divergence` with its
block statistics). The test compares two window medians, the last window's and the best level's,
and asks for a rise that is large in three senses at once; each guards against a way a *healthy*
curve's noise looked like a rise (measured on the demo job, tests/fixtures/metrics_healthy_demo):

1. Relative: ``div_rel`` (15%) above the best level, so it works for any loss scale.
2. Against the training's own progress: at least ``div_drop_rel`` (5%) of the drop from the first
   window to the best level. Once a classifier separates its classes the loss is near zero and
   heavy-tailed, and 15% of 0.1 is a rise that one bad batch in a window of ten produces; a rise
   that gives back less than a twentieth of what training gained is not a divergence.
3. Statistical: ``div_z`` (8) standard errors of a window median, with the noise *pooled*: the
   median of the robust scales of the windows from the best level up to the last one. The best
   window's own scale is not used: it is often the best exactly because it was unusually quiet
   (the false alarm this replaced used a window with a third of the typical scale). The last
   window's own scale is not used either: a loss whose noise grows with its level (a near-zero
   classification loss that triples after an LR raise triples its spread too) would widen its
   own yardstick, as a spike would with mean/std. Over about 8,000 prefixes of the demo job's
   real per-rank losses and of resamplings of them, a healthy prefix reached 6.7 on this scale,
   so 8 leaves margin, while a sustained 3x rise of that same near-zero loss scored 8.3 or more
   (windows of 27-35 points; a 2x rise is found about half the time there).

The best level itself is the median of the ``div_best_k`` (3) lowest window medians, not the
lowest: the minimum of many noisy window medians is biased low by about two standard errors
for a few dozen windows, and it takes two windows at a level to call it reached. A real
divergence (the loss settles at a level, then climbs after an LR raise) keeps several windows
near its best level, so this costs nothing there.

Everything is O(number of windows) plus one median of the last window: the block medians
and scales are the ones the spike detector already computed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# Standard error of the median of n normal draws is ~sqrt(pi/2) * sigma / sqrt(n).
_MEDIAN_SE = math.sqrt(math.pi / 2.0)


def _fmt(x: float, nd: int = 6) -> float | None:
    """JSON-safe, ``nd`` significant digits (the same rounding as detect._f, without the import)."""
    return None if math.isnan(x) else float(f"{x:.{nd}g}")


def _rolling_median5(x: np.ndarray) -> np.ndarray:
    """Centred median of 5 (edges repeat the first/last full window)."""
    if len(x) < 5:
        return np.full(len(x), np.median(x)) if len(x) else x.copy()
    from numpy.lib.stride_tricks import sliding_window_view

    out = np.median(sliding_window_view(x, 5), axis=1)
    return np.concatenate((np.full(2, out[0]), out, np.full(2, out[-1])))


def divergence(x: np.ndarray, steps: np.ndarray, b: Any, p: Any,  # detect.Blocks, detect.Params (no import: detect calls this)
               spikes: list[dict[str, Any]]) -> dict[str, Any]:
    """A rise that lasts; see the module docstring for the three tests and the best level."""
    res: dict[str, Any] = {"detected": False}
    nb = len(b.med)
    if nb < 4:
        return res
    size = b.size
    tail_x = x[-size:]
    tail = float(np.median(tail_x))
    # Windows wholly before the last one (a block that overlaps the last window is left out).
    prior = b.med[:-1] if len(x) % size == 0 else b.med
    cand = prior[: max(1, len(prior) - 1)]
    k = int(min(max(1, p.div_best_k), len(cand)))
    lowest = np.argpartition(cand, k - 1)[:k] if k < len(cand) else np.arange(len(cand))
    lowest = lowest[np.argsort(cand[lowest], kind="stable")]
    kbest = int(lowest[(k - 1) // 2])  # the median of the k lowest
    best = float(cand[kbest])
    first_low = int(lowest.min())
    noise = float(np.median(b.scale[first_low: len(cand)]))  # pooled over the windows compared
    early = float(b.med[0])
    rise = tail - best
    se = _MEDIAN_SE * noise / math.sqrt(size)  # of one window median
    res.update(best=_fmt(best), best_step=int(steps[kbest * size]), tail=_fmt(tail),
               noise=_fmt(noise), zscore=_fmt(rise / se, 4) if se > 0 else None)
    floor = max(p.div_rel * abs(best), p.div_drop_rel * max(0.0, early - best))
    if not (rise >= floor and rise >= p.div_z * se):
        return res
    thr = best + 0.5 * rise
    # The final stretch of blocks whose median stays above the half-way level.
    above = b.med >= thr
    k0 = len(above)
    while k0 > 0 and above[k0 - 1]:
        k0 -= 1
    if k0 <= kbest:
        return res
    lo, hi = max(0, (k0 - 1) * size), min(len(x), (k0 + 1) * size)
    sm = _rolling_median5(x[lo:hi])
    hit = np.flatnonzero(sm >= thr)
    start = lo + int(hit[0]) if len(hit) else k0 * size
    sustained_points = len(x) - start
    if sustained_points < max(size // 2, 5):
        return res
    st = int(steps[start])
    after_spike = any(abs(sp["step"] - st) <= 2 * size for sp in spikes)
    res.update(detected=True, step=st, from_value=_fmt(best), to_value=_fmt(tail),
               ratio=_fmt(tail / best, 4) if best > 0 else None, after_spike=after_spike,
               points=int(sustained_points), pos=start)
    return res
