"""Partial evidence: what a few pasted lines already say, worded as no more than they show.

The detectors of :mod:`~doctor.probes.metrics.detect` judge a series against its own trailing
window (at least ``2 x min_window`` points); a ticket often holds far less: one line with
``loss: nan``, a three-row table, or a sentence such as ``1.2 s/it before, 3.4 s/it after``.
That is evidence, but not of everything a whole series shows (when it started, whether it
recovered), so it goes to ``metrics.partial`` rather than to the facts the whole-series rules
read, and the rules that read it (STAB009, STAB010, PERF014) say what a longer series would add:

- ``nan``: a loss of NaN/Inf in a series of one logged point (a fragment; a longer series goes
  to ``metrics.nan`` as before);
- ``jump``: in a series too short for the spike detector, a point at least ``JUMP_RATIO`` times
  the highest loss before it;
- ``slowdown``: a stated before/after change of step time or throughput (the reader's
  ``change`` kind), and the data-loading time stated with it when there is one;
- ``rise``: in a loss series too short for the divergence detector, the loss ends well above the
  lowest value it reached and above where the paste began, with no NaN (STAB011);
- ``grad_growth``: in a grad-norm series too short for the explosion detector, the norm grows by
  an order of magnitude or more point after point, possibly into NaN/Inf (STAB012).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from doctor.probes.metrics.detect import Params, Series, observed
from doctor.probes.metrics.detect import format_number as _fmt

Result = dict[str, Any]

#: A loss at least this many times the highest value logged before it, in a few points, is a
#: jump: training noise between logged points stays well inside 2x (llm-foundry's
#: KillLossSpike and Megatron's rerun machine flag 10x only with a full window; with two or
#: three points a smaller factor is only a lead, hence the low-confidence rule).
JUMP_RATIO = 2.0
#: A stated change of step time or throughput smaller than this is within run-to-run noise
#: (proposal: 25%, above the few percent that clocks, thermals and data order cause).
SLOW_FACTOR = 1.25
#: A loss whose last two logged values are at least this many times the lowest value reached
#: before them, and above the first value of the paste, rose and stayed up: per-step noise of a
#: healthy loss stays within it over a few points once it has started to fall (proposal, kept
#: below the 2x of a jump so that a slow climb counts too).
RISE_RATIO = 1.5
#: A gradient norm that ends this many times above the lowest value before it, rising on each of
#: the last logged points, grew by an order of magnitude (Megatron's SPIKY_LOSS_FACTOR is 10).
GROWTH_RATIO = 10.0
#: ... and is only called an explosion when it also turned NaN/Inf, grew 100x, or reached a norm
#: far above any clipping threshold in use (clip values are 0.5-5 in practice).
GROWTH_STRONG = 100.0
GROWTH_ABS = 1e4


def take_fragments(results: list[Result]) -> list[tuple[dict[str, Any], Result]]:
    """Series whose loss is one logged point and non-finite: its ``first_nan`` is moved out of
    the series result (so rules about a whole series do not read one line as a run) and
    returned with the result it came from."""
    out = []
    for r in results:
        lo = r.get("loss") or {}
        fn = lo.get("first_nan")
        if fn and lo.get("rows") == 1:
            lo["first_nan"] = None
            out.append((fn, r))
    return out


def partial(series: list[Series], results: list[Result], frags: list[tuple[dict[str, Any], Result]],
            params: Params) -> dict[str, Any]:
    """The ``metrics.partial`` map: only the keys something was found for."""
    out: dict[str, Any] = {}
    if frags:
        out["nan"] = _nan(frags, results)
    by_name = {s.name: s for s in series}
    jump = _jump(by_name, results, params)
    if jump:
        out["jump"] = jump
    slow = _slowdown(series)
    if slow:
        out["slowdown"] = slow
    rise = _rise(by_name, results, params)
    if rise:
        out["rise"] = rise
    growth = _grad_growth(by_name, results, params)
    if growth:
        out["grad_growth"] = growth
    return out


def _at(r: Result, step: int) -> str:
    return f"log entry {step}" if r.get("step_from") in ("line_order", "row") else f"step {step}"


def _rise(by_name: dict[str, Series], results: list[Result], params: Params) -> dict[str, Any] | None:
    """A loss that fell, then climbed and stayed up, in a series too short for STAB004.

    Why: a ticket often pastes five or ten lines; the trend detector needs two windows. Without a
    NaN, "it went down, then up, and it is still up" is what divergence looks like in a few
    points; a single high point (a jump) is left to ``_jump``.
    """
    best: dict[str, Any] | None = None
    for r in results:
        lo = r.get("loss") or {}
        s = by_name.get(r["name"])
        if s is None or lo.get("first_nan") or (lo.get("divergence") or {}).get("detected"):
            continue
        steps, x = observed(s, "loss")
        n = len(x)
        if n < 4 or n >= 2 * params.min_window or not np.isfinite(x).all() or (x <= 0).any():
            continue
        if (np.diff(steps) <= 0).any():  # the step went back: a restart begins a new run, not a rise
            continue
        i = int(np.argmin(x[:-2]))
        low = float(x[i])
        tail = x[-2:]
        if not (tail >= RISE_RATIO * low).all() or x[-1] <= x[0] or x[-1] < x[-2] * 0.9:
            continue
        ratio = float(x[-1] / low)
        cand = {"low_step": int(steps[i]), "low_value": float(f"{low:.6g}"), "last_value": float(f"{x[-1]:.6g}"),
                "first_value": float(f"{x[0]:.6g}"), "ratio": float(f"{ratio:.4g}"), "points": n,
                "series": r["name"],
                "detail": (f"loss fell to {_fmt(low)} at {_at(r, int(steps[i]))}, then rose to {_fmt(float(x[-1]))} "
                           f"({_fmt(ratio)}x) and stayed up, above the first value logged ({_fmt(float(x[0]))}), "
                           f"with no NaN, in {r['name']}; only {n} points, fewer than the "
                           f"{2 * params.min_window} the divergence detector needs")}
        if best is None or cand["ratio"] > best["ratio"]:
            best = cand
    return best


def _grad_growth(by_name: dict[str, Series], results: list[Result], params: Params) -> dict[str, Any] | None:
    """A grad norm that grows point after point by an order of magnitude in a short series.

    Why: STAB007 needs two windows of grad norms; a pasted handful of HF Trainer dicts or log
    lines whose norm climbs 10x, 100x, then turns Inf/NaN shows the explosion just as well, and
    its first step comes before the loss's NaN.
    """
    best: dict[str, Any] | None = None
    for r in results:
        s = by_name.get(r["name"])
        if s is None:
            continue
        steps, g = observed(s, "grad_norm")
        n = len(g)
        if n < 3 or n >= 2 * params.min_window or (np.diff(steps) <= 0).any():  # a restart: not one run
            continue
        fin = np.isfinite(g)
        bad = np.flatnonzero(~fin)
        cut = int(bad[0]) if len(bad) else n
        pre = g[:cut]
        if len(pre) < 3 or (pre <= 0).any():
            continue
        low_pos = np.minimum.accumulate(pre)
        ratio = float(pre[-1] / low_pos[-2])
        rising = bool((np.diff(pre[-3:]) > 0).all())
        then_nonfinite = cut < n
        if ratio < GROWTH_RATIO or not rising:
            continue
        if not (then_nonfinite or ratio >= GROWTH_STRONG or pre[-1] >= GROWTH_ABS):
            continue
        i = int(np.argmin(pre[:-1]))
        cand = {"from_step": int(steps[i]), "from_value": float(f"{pre[i]:.6g}"), "to_step": int(steps[cut - 1]),
                "to_value": float(f"{pre[-1]:.6g}"), "ratio": float(f"{ratio:.4g}"), "points": n,
                "then_nonfinite": then_nonfinite, "nonfinite_step": int(steps[cut]) if then_nonfinite else -1,
                "series": r["name"]}
        then = f", then NaN/Inf at {_at(r, int(steps[cut]))}" if then_nonfinite else ""
        cand["detail"] = (f"grad norm grew from {_fmt(float(pre[i]))} at {_at(r, int(steps[i]))} to "
                          f"{_fmt(float(pre[-1]))} at {_at(r, int(steps[cut - 1]))} ({_fmt(ratio)}x), rising on each "
                          f"of the last points{then}, in {r['name']}; only {n} points logged")
        if best is None or cand["ratio"] > best["ratio"]:
            best = cand
    return best


def _nan(frags: list[tuple[dict[str, Any], Result]], results: list[Result]) -> dict[str, Any]:
    fn, r = frags[0]
    finite = [(x["name"], x["loss"]["last"]) for x in results
              if (x.get("loss") or {}).get("last") is not None and x is not r]
    seen = (f"; another piece logs a finite loss ({_fmt(finite[0][1])} in {finite[0][0]})" if finite else "")
    detail = (f"loss logged as {fn['value']} in {r['name']} (a single logged value{seen}); a longer "
              f"series would show at which step it started and what changed just before")
    return {"value": fn["value"], "series": r["name"], "count": len(frags), "detail": detail,
            "finite_elsewhere": bool(finite)}


def _jump(by_name: dict[str, Series], results: list[Result], params: Params) -> dict[str, Any] | None:
    """The largest jump over the short series (those the spike detector does not judge)."""
    best: dict[str, Any] | None = None
    for r in results:
        lo = r.get("loss") or {}
        s = by_name.get(r["name"])
        if s is None or lo.get("first_nan") or lo.get("spikes") or (lo.get("divergence") or {}).get("detected"):
            continue
        steps, x = observed(s, "loss")
        n = len(x)
        if n < 2 or n >= 2 * params.min_window or not np.isfinite(x).all() or (x <= 0).any():
            continue
        prior = np.maximum.accumulate(x)[:-1]
        ratio = x[1:] / prior
        hits = np.flatnonzero(ratio >= JUMP_RATIO)
        if not len(hits):
            continue
        i = int(hits[0]) + 1
        base = float(prior[i - 1])
        after = x[i + 1:]
        stays = int((after >= JUMP_RATIO * base * 0.75).sum())
        back = bool(len(after) and after[-1] < 1.5 * base)
        at = f"log entry {int(steps[i])}" if r.get("step_from") in ("line_order", "row") else f"step {int(steps[i])}"
        how = ("the next logged value is back near the earlier level" if back else
               (f"{stays} later value(s) stay up" if len(after) else "it is the last value logged"))
        cand = {"step": int(steps[i]), "from_value": float(f"{base:.6g}"), "to_value": float(f"{x[i]:.6g}"),
                "ratio": float(f"{x[i] / base:.4g}"), "points": n, "later_points": int(len(after)),
                "stays_up": stays, "recovered": back, "series": r["name"],
                "detail": (f"loss jumped from {_fmt(base)} to {_fmt(float(x[i]))} ({_fmt(float(x[i] / base))}x "
                           f"the highest value before it) at {at} in {r['name']}; {how}; only {n} points "
                           f"logged, fewer than the {2 * params.min_window} the spike detector needs")}
        if best is None or cand["ratio"] > best["ratio"]:
            best = cand
    return best


def _slowdown(series: list[Series]) -> dict[str, Any] | None:
    """A stated before/after change (``1.2 s/it before, 3.4 s/it after``, ``it/s dropped from 5
    to 1``): how many times slower, and the data time stated next to it."""
    for s in series:
        if "change" not in s.fmt:
            continue
        _, st = observed(s, "step_time")
        _, tp = observed(s, "throughput")
        st, tp = st[np.isfinite(st) & (st > 0)], tp[np.isfinite(tp) & (tp > 0)]
        if len(st) >= 2:
            metric, before, after, factor = "step_time", float(st[0]), float(st[-1]), float(st[-1] / st[0])
            said = f"step time went from {_fmt(before)} s to {_fmt(after)} s"
        elif len(tp) >= 2:
            metric, before, after, factor = "throughput", float(tp[0]), float(tp[-1]), float(tp[0] / tp[-1])
            said = f"throughput went from {_fmt(before)} to {_fmt(after)} per second"
        else:
            continue
        if factor < SLOW_FACTOR:
            continue
        out: dict[str, Any] = {"metric": metric, "before": float(f"{before:.6g}"), "after": float(f"{after:.6g}"),
                               "factor": float(f"{factor:.4g}"), "series": s.name}
        _, dt = observed(s, "data_time")
        dt = dt[np.isfinite(dt) & (dt >= 0)]
        data = ""
        if len(dt) >= 2:
            out["data_before"], out["data_after"] = float(f"{dt[0]:.6g}"), float(f"{dt[-1]:.6g}")
            if metric == "step_time" and after > before:
                share = (float(dt[-1]) - float(dt[0])) / (after - before)
                out["data_added_share"] = float(f"{max(0.0, min(1.0, share)):.4g}")
            data = f"; data time went from {_fmt(float(dt[0]))} s to {_fmt(float(dt[-1]))} s"
        out["detail"] = (f"{said} ({_fmt(factor)}x slower) as stated in {s.name}{data}")
        return out
    return None

