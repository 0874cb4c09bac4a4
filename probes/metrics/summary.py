"""From detector results to the ``metrics`` facts namespace.

The detectors (:mod:`~doctor.probes.metrics.detect`) judge one series at a time; a job leaves
several (per file, run and rank), and rules want one answer per question: the earliest NaN, the
largest spikes, the worst loss scale. Each step below answers one question over all series, in
the order the facts were always written (the events' order among equals depends on it), and
writes the one readable line a finding quotes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from doctor.probes.metrics.detect import Params, Series, analyze_series, curve, observed
from doctor.probes.metrics.detect import format_number as _fmt
from doctor.probes.metrics.partial import partial, take_fragments

Result = dict[str, Any]  # one series' detector results (analyze_series), plus its state

_STATE_RANK = {"overflow": 0, "nan": 1, "diverged": 2, "spiky": 3, "ok": 4}
_SERIES_KEYS = ("name", "file", "format", "rank", "run", "rows", "first_step", "last_step", "metrics",
                "state", "step_from")


class _Events:
    """Events from every step, kept with a severity so the worst come first at the end."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def add(self, kind: str, step: int, value: Any, z: Any, series: str, detail: str, sev: int) -> None:
        self.items.append({"kind": kind, "step": int(step), "value": value, "zscore": z, "series": series,
                           "detail": detail, "_sev": sev})

    def ordered(self, limit: int) -> list[dict[str, Any]]:
        self.items.sort(key=lambda e: (e["_sev"], e["step"]))
        return [{k: v for k, v in e.items() if k != "_sev"} for e in self.items[:limit]]


def _state(r: Result) -> str:
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


def _at(r: Result, step: int) -> str:
    """'step 312' or 'log entry 312' when the log prints no step numbers."""
    return f"log entry {step}" if r.get("step_from") in ("line_order", "row") else f"step {step}"


def _with_context(detail: str, context: list[str]) -> str:
    """The detail line, then what changed shortly before, as one sentence for a finding."""
    if not context:
        return detail + "."
    return f"{detail}; shortly before: " + "; ".join(context) + "."


def summarize(series: list[Series], params: Params) -> dict[str, Any]:
    """Run the detectors on every series and fold the results into the ``metrics`` namespace."""
    results = [analyze_series(s, params) for s in series]
    frags = take_fragments(results)  # one logged NaN is partial evidence, not a run's first NaN
    for r in results:
        r["state"] = _state(r)
    order = sorted(range(len(results)), key=lambda i: (_STATE_RANK[results[i]["state"]], -results[i]["rows"]))
    facts = _base_facts(results, order, params)
    events = _Events()
    _nan(results, facts, events)
    _spikes(results, facts, events, params)
    _divergence(results, facts, events)
    main_loss = next((results[i] for i in order if results[i].get("loss")), None)
    if main_loss:
        _loss(main_loss, facts)
    _loss_scale(results, facts, events)
    _grad_norm(results, facts, events)
    _lr_jumps_and_restarts(results, facts, events, params)
    if main_loss:
        _plateau(main_loss, facts, events, params)
    _timing(results, facts)
    _throughput(results, facts)
    _summaries(facts)
    part = partial(series, results, frags, params)
    if part:
        facts["partial"] = part
    facts["events"] = events.ordered(params.max_events)
    facts["curves"] = _curves(series, results, order, main_loss)
    by_rank = _by_rank(results)
    if by_rank:
        facts["by_rank"] = by_rank
    return facts


def _base_facts(results: list[Result], order: list[int], params: Params) -> dict[str, Any]:
    """Every key a rule may read, present even when nothing was found, and the worst 32 series."""
    facts: dict[str, Any] = {"n_series": len(results), "first_nan_step": -1, "spikes": [], "events": [],
                             "lr_jumps": [], "restarts": [], "n_spikes": 0, "n_spikes_recovered": 0,
                             "params": {k: float(v) for k, v in dataclasses.asdict(params).items()}}
    facts["series"] = [{k: results[i].get(k) for k in _SERIES_KEYS} for i in order[:32]]
    return facts


def _nan(results: list[Result], facts: dict[str, Any], events: _Events) -> None:
    """The earliest first non-finite loss over all series; every series' first one is an event."""
    nan_best = None
    for r in results:
        fn = (r.get("loss") or {}).get("first_nan")
        if fn and (nan_best is None or fn["step"] < nan_best[0]["step"]):
            nan_best = (fn, r)
        if fn:
            events.add("nan", fn["step"], fn["value"], None, r["name"],
                       f"loss became {fn['value']} at {_at(r, fn['step'])} in {r['name']}", 0)
    if not nan_best:
        return
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


def _spikes(results: list[Result], facts: dict[str, Any], events: _Events, params: Params) -> None:
    """Loss spikes over all series, largest first, capped at ``params.max_spikes``."""
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
        events.add("spike", sp["step"], sp["value"], sp["zscore"], sp["series"], sp["detail"],
                   2 if sp["recovered"] else 1)


def _divergence(results: list[Result], facts: dict[str, Any], events: _Events) -> None:
    """The earliest detected divergence, else ``detected: False``."""
    div_best = None
    for r in results:
        d = (r.get("loss") or {}).get("divergence") or {}
        if d.get("detected") and (div_best is None or d["step"] < div_best[0]["step"]):
            div_best = (d, r)
    if not div_best:
        facts["divergence"] = {"detected": False}
        return
    d, r = div_best
    how = "after a spike" if d["after_spike"] else "without a single spike"
    detail = (f"loss rose from {_fmt(d['from_value'])} to {_fmt(d['to_value'])} ({_fmt(d['ratio'])}x) from "
              f"{_at(r, d['step'])} in {r['name']} and stayed up ({how})")
    facts["divergence"] = {k: v for k, v in d.items() if k != "pos"} | {"series": r["name"], "detail": detail}
    events.add("divergence", d["step"], d["to_value"], None, r["name"], detail, 1)


def _loss(main_loss: Result, facts: dict[str, Any]) -> None:
    """The main series' loss summary: the worst series that logs a loss."""
    lo = main_loss["loss"]
    facts["loss"] = {k: lo.get(k) for k in ("rows", "first", "last", "min", "min_step", "median", "max")} | {
        "series": main_loss["name"], "window": lo.get("block")}


def _loss_scale(results: list[Result], facts: dict[str, Any], events: _Events) -> None:
    """One loss-scale series: a collapsed one first, then many skipped steps, then the longest."""
    ls_res = [r for r in results if r.get("loss_scale")]
    if not ls_res:
        return
    r = min(ls_res, key=lambda r: (not r["loss_scale"].get("collapsed"), not r["loss_scale"].get("many_skipped"),
                                   -r["loss_scale"].get("rows", 0)))
    ls = dict(r["loss_scale"])
    if ls.get("collapsed") and not ls.get("rows"):  # only DeepSpeed's "already at minimum" message
        detail = (f"the fp16 loss scaler reports its scale already at the minimum in {r['name']} (DeepSpeed's "
                  f"\"Current loss scale already at minimum\"): it cannot lower it further after repeated "
                  f"overflows; no loss-scale values were logged, so when the overflows began is not shown")
    elif ls.get("collapsed"):
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
        events.add("loss_scale_collapse", ls["collapse_step"], ls.get("min"), None, r["name"], detail, 0)
    elif ls.get("many_skipped"):
        events.add("skipped_steps", ls.get("first_skip_after_calibration", -1), ls.get("skipped_after_calibration"),
                   None, r["name"], detail, 1)


def _grad_norm(results: list[Result], facts: dict[str, Any], events: _Events) -> None:
    """One grad-norm series: the earliest explosion first, then the longest series."""
    gn_res = [r for r in results if r.get("grad_norm")]
    if not gn_res:
        return
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
        events.add("grad_explosion", g["explosion_step"], g.get("max"), None, r["name"], g["detail"], 1)
    elif g.get("nonfinite_tail"):
        g["detail"] = (f"grad norm NaN/Inf on the last {g['nonfinite_tail']} logged step(s) of {r['name']}, from "
                       f"{_at(r, g['nonfinite_tail_step'])}, while the loss stayed finite")
    else:
        g["detail"] = f"grad norm median {_fmt(g.get('median'))}, p90 {_fmt(g.get('p90'))}, max {_fmt(g.get('max'))} in {r['name']}"
    g["series"] = r["name"]
    facts["grad_norm"] = g


def _lr_jumps_and_restarts(results: list[Result], facts: dict[str, Any], events: _Events, params: Params) -> None:
    """LR jumps and resumes of every series, in series order (one series' events stay together)."""
    for r in results:
        for j in r.get("lr_jumps", []):
            facts["lr_jumps"].append(j | {"series": r["name"]})
            events.add("lr_jump", j["step"], j["to"], None, r["name"],
                       f"learning rate jumped {_fmt(j['ratio'])}x ({_fmt(j['from'])} -> "
                       f"{_fmt(j['to'])}) at {_at(r, j['step'])} in {r['name']}", 3)
        for x in r.get("restarts", []):
            facts["restarts"].append(x | {"series": r["name"]})
            what = ("resumed: the step counter went back from " + str(x["from_step"])) if x["kind"] == "resume" else x.get("detail", "")
            events.add(x["kind"], x["step"], None, None, r["name"],
                       f"{x['kind'].replace('_', ' ')} at {_at(r, x['step'])} in {r['name']} ({what})", 3)
    facts["lr_jumps"] = facts["lr_jumps"][: params.max_events]
    facts["restarts"] = facts["restarts"][: params.max_events]


def _plateau(main_loss: Result, facts: dict[str, Any], events: _Events, params: Params) -> None:
    """The main loss' plateau: information only, the least severe event."""
    pl = (main_loss["loss"].get("plateau") or {"detected": False}) | {"series": main_loss["name"]}
    facts["plateau"] = pl
    if pl.get("detected"):
        events.add("plateau", pl["since_step"], pl.get("level"), None, main_loss["name"],
                   f"loss improved by less than {params.plateau_rel:.0%} since {_at(main_loss, pl['since_step'])} "
                   f"in {main_loss['name']}", 4)


def _timing(results: list[Result], facts: dict[str, Any]) -> None:
    """Step and data time of the series with the most timed rows (data time alone otherwise)."""
    timed = [r for r in results if r.get("step_time")]
    if timed:
        r = max(timed, key=lambda r: r["step_time"]["n"])
        facts["step_time"] = r["step_time"] | {"series": r["name"]}
        if r.get("data_time"):
            facts["data_time"] = r["data_time"] | {"series": r["name"]}
        if r.get("data_time_share") is not None:
            facts["data_time_share"] = r["data_time_share"]
        return
    dt = [r for r in results if r.get("data_time")]
    if dt:
        facts["data_time"] = dt[0]["data_time"] | {"series": dt[0]["name"]}


def _throughput(results: list[Result], facts: dict[str, Any]) -> None:
    """Items per second of the series with the most such rows (samples, tokens or words/s)."""
    tp = [r for r in results if r.get("throughput")]
    if tp:
        r = max(tp, key=lambda r: r["throughput"]["n"])
        facts["throughput"] = r["throughput"] | {"series": r["name"]}


def _summaries(facts: dict[str, Any]) -> None:
    """A finding quotes one sentence: the detail and what changed shortly before it."""
    for key in ("nan", "divergence", "loss_scale", "grad_norm"):
        item = facts.get(key)
        if isinstance(item, dict) and item.get("detail"):
            item["summary"] = _with_context(item["detail"], item.get("context") or [])
    for sp in facts["spikes"]:
        sp["summary"] = _with_context(sp["detail"], sp.get("context") or [])


def _curves(series: list[Series], results: list[Result], order: list[int],
            main_loss: Result | None) -> dict[str, Any]:
    """Curves of the main series, small enough for facts and the report."""
    curves: dict[str, Any] = {}
    by_name = {s.name: s for s in series}
    main_s = by_name.get(main_loss["name"]) if main_loss else (series[order[0]] if results else None)
    if main_s is not None:
        for m in ("loss", "grad_norm", "lr", "loss_scale"):
            st, v = observed(main_s, m)
            if len(v):
                curves[m] = curve(np.asarray(st), np.asarray(v)) | {"series": main_s.name}
    return curves


def _by_rank(results: list[Result]) -> dict[str, dict[str, Any]]:
    """Per-rank loss verdicts, so a rule can tell one bad rank from a bad run."""
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
    return by_rank
