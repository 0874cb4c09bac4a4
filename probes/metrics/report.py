"""The metrics kind's part of the report: the curves (charted in HTML, sparklines in the TUI),
the events detected on them, and the step-time and data-loading lines.

Drawn from ``metrics.curves`` and ``metrics.events`` only, so a chart made from a saved bundle
equals the one made on the cluster and shows what the rules saw.
"""

from __future__ import annotations

from typing import Any

from doctor.evidence.sections import Section, SectionContext, Series, SeriesSet

#: Curves in the order they are shown, with the caption of the ones worth an HTML chart.
_ORDER = (("loss", "Loss"), ("step_time", "Step time"), ("grad_norm", "Gradient norm"), ("lr", ""),
          ("loss_scale", "Loss scale"))


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def sections(facts: dict[str, Any], context: SectionContext) -> list[Section]:
    m = facts.get("metrics") if isinstance(facts.get("metrics"), dict) else {}
    curves = m.get("curves") if isinstance(m.get("curves"), dict) else {}
    events = [e for e in (m.get("events") or []) if isinstance(e, dict)]
    captions = dict(_ORDER)
    series = []
    for name in [n for n, _ in _ORDER] + sorted(set(curves) - set(captions)):
        c = curves.get(name)
        if not isinstance(c, dict) or not c.get("values"):
            continue
        series.append(Series(name=name, steps=list(c.get("steps") or []), values=list(c["values"]),
                             label=str(c.get("series") or ""), chart=captions.get(name, "")))
    lines = []
    st = m.get("step_time") if isinstance(m.get("step_time"), dict) else {}
    if st.get("median") is not None:
        lines.append(f"step time: median {_fmt(st['median'])}s, p90 {_fmt(st.get('p90') or 0)}s, "
                     f"max {_fmt(st.get('max') or 0)}s over {st.get('n', '?')} steps ({st.get('series', '')})")
    if isinstance(m.get("data_time_share"), (int, float)):
        lines.append(f"data loading: {m['data_time_share']:.0%} of step time")
    if not series and not lines and not events:
        return []
    return [Section(id="charts", title="Metrics", nav="Metrics", order=10,
                    body=SeriesSet(series, events, lines, primary="loss"),
                    summary=f"{len(series)} curve(s), {len(events)} event(s)")]
