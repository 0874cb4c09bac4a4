"""Small self-contained SVG charts of training metrics, with detected events marked.

Plain SVG text (no matplotlib, no display, no scripts), so the same string goes into the HTML
report, a Markdown ticket (as a file) or the TUI's export. Everything drawn comes from a series
section (curves and the events detected on them), built by a probe from its facts, which keeps
the chart faithful to what the rules saw: a chart made from a saved bundle equals the one made
on the cluster.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any

# Muted colours that survive print and dark themes.
_LINE = "#1f6feb"
_GRID = "#d0d7de"
_TEXT = "#57606a"
_MARK = {
    "nan": "#cf222e", "spike": "#d1242f", "divergence": "#bc4c00", "grad_explosion": "#8250df",
    "loss_scale_collapse": "#bf8700", "skipped_steps": "#bf8700", "lr_jump": "#0969da",
    "resume": "#1a7f37", "data_restart": "#1a7f37", "plateau": "#6e7781",
}


def _curves(source: dict[str, Any]) -> dict[str, Any]:
    """``{"curves": {name: {steps, values, series}}, "events": [...]}``: what a series section
    carries (the HTML renderer builds it from ``doctor.evidence.sections.SeriesSet``), which is
    also the shape of the metrics probe's namespace; a table or series goes through
    ``doctor.probes.metrics.analyze`` first."""
    if "curves" in source or "events" in source:
        return source
    return {}


def _num(v: Any) -> float:
    if isinstance(v, (int, float)):
        return float(v)
    return {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}.get(str(v), math.nan)


def _tick(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e5 or a < 1e-3:
        return f"{v:.0e}".replace("e+0", "e").replace("e-0", "e-")
    return f"{v:.4g}"


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, n - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step) * step
    out, v = [], start
    while v <= hi + step * 1e-9 and len(out) < 12:
        out.append(round(v, 12))
        v += step
    return out


def loss_chart_svg(facts_or_table: Any, metric: str = "loss", width: int = 640, height: int = 240,
                   title: str | None = None, log_scale: bool | None = None, max_markers: int = 12) -> str:
    """An SVG line chart of ``metric`` with the detected events marked.

    ``facts_or_table``: curves and events (a series section's data, or the metrics namespace).
    ``log_scale`` defaults to automatic (a positive series spanning more than two decades, as a
    blow-up does). Marks: spikes (circles at the peak), the first NaN/Inf (red line, crosses on
    the top edge),
    learning-rate jumps and resumes (dashed lines), divergence (shaded from where it starts),
    loss-scale collapse (triangle on the bottom edge).
    """
    m = _curves(facts_or_table)
    cur = (m.get("curves") or {}).get(metric) or {}
    steps = [int(s) for s in cur.get("steps", [])]
    vals = [_num(v) for v in cur.get("values", [])]
    name = title or f"{metric} — {cur.get('series', '')}".rstrip(" —")
    left, right, top, bottom = 58, 14, 26, 34
    pw, ph = width - left - right, height - top - bottom
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" font-family="system-ui, sans-serif" font-size="11">',
        f"<title>{escape(name)}</title>",
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{left}" y="16" fill="#24292f" font-size="12" font-weight="600">{escape(name)}</text>',
    ]
    finite = [(s, v) for s, v in zip(steps, vals, strict=False) if math.isfinite(v)]
    if not steps or not finite:
        out.append(f'<text x="{width / 2}" y="{height / 2}" fill="{_TEXT}" text-anchor="middle">'
                   f"no {escape(metric)} values to draw</text></svg>")
        return "\n".join(out)
    x0, x1 = min(steps), max(steps)
    if x1 == x0:
        x1 = x0 + 1
    fv = [v for _, v in finite]
    lo, hi = min(fv), max(fv)
    use_log = log_scale if log_scale is not None else (lo > 0 and hi / lo > 100)
    use_log = bool(use_log and lo > 0)
    if use_log:
        ylo, yhi = math.log10(lo), math.log10(hi)
    else:
        pad = (hi - lo) * 0.06 or abs(hi) * 0.1 or 1.0
        ylo, yhi = lo - pad, hi + pad
    if yhi == ylo:
        yhi = ylo + 1

    def px(s: float) -> float:
        return left + (s - x0) / (x1 - x0) * pw

    def py(v: float) -> float:
        t = math.log10(v) if use_log else v
        return top + ph - (t - ylo) / (yhi - ylo) * ph

    # Grid and axes.
    yt = _nice_ticks(ylo, yhi) if not use_log else list(range(math.ceil(ylo), math.floor(yhi) + 1))
    if use_log and len(yt) > 7:
        yt = yt[:: math.ceil(len(yt) / 6)]
    for t in yt:
        y = top + ph - (t - ylo) / (yhi - ylo) * ph
        label = _tick(10 ** t) if use_log else _tick(t)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="{_GRID}" stroke-width="0.6"/>')
        out.append(f'<text x="{left - 6}" y="{y + 3.5:.1f}" fill="{_TEXT}" text-anchor="end">{escape(label)}</text>')
    for t in _nice_ticks(x0, x1, 6):
        x = px(t)
        out.append(f'<line x1="{x:.1f}" y1="{top + ph}" x2="{x:.1f}" y2="{top + ph + 4}" stroke="{_TEXT}" stroke-width="0.8"/>')
        out.append(f'<text x="{x:.1f}" y="{top + ph + 16}" fill="{_TEXT}" text-anchor="middle">{int(t)}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="{_GRID}"/>')
    out.append(f'<text x="{left + pw}" y="{height - 4}" fill="{_TEXT}" text-anchor="end">step'
               f'{" (log y)" if use_log else ""}</text>')

    events = [e for e in (m.get("events") or []) if e.get("series") == cur.get("series") or not cur.get("series")]
    # Divergence: shade from its start to the end.
    for e in events:
        if e.get("kind") == "divergence" and x0 <= e["step"] <= x1:
            x = px(e["step"])
            out.append(f'<rect x="{x:.1f}" y="{top}" width="{left + pw - x:.1f}" height="{ph}" '
                       f'fill="{_MARK["divergence"]}" fill-opacity="0.08"><title>{escape(e.get("detail", ""))}</title></rect>')
    # The curve, broken where the step counter goes back (a resume) or a value is not finite.
    seg: list[str] = []
    prev = None
    for s, v in zip(steps, vals, strict=False):
        if not math.isfinite(v) or (prev is not None and s < prev):
            if len(seg) > 1:
                out.append(f'<polyline fill="none" stroke="{_LINE}" stroke-width="1.3" points="{" ".join(seg)}"/>')
            seg = []
        if math.isfinite(v):
            seg.append(f"{px(s):.1f},{py(v):.1f}")
        prev = s
    if len(seg) > 1:
        out.append(f'<polyline fill="none" stroke="{_LINE}" stroke-width="1.3" points="{" ".join(seg)}"/>')
    elif len(seg) == 1:
        x, y = seg[0].split(",")
        out.append(f'<circle cx="{x}" cy="{y}" r="1.5" fill="{_LINE}"/>')
    # Non-finite values: crosses on the top edge.
    bad = [s for s, v in zip(steps, vals, strict=False) if not math.isfinite(v)]
    for s in bad[:: max(1, len(bad) // 40)]:
        x = px(s)
        out.append(f'<path d="M{x - 3:.1f},{top + 1} l6,6 m0,-6 l-6,6" stroke="{_MARK["nan"]}" stroke-width="1"/>')
    # Event marks (each with a tooltip).
    shown = 0
    labels: list[float] = []  # x of labels already placed, to stack close ones
    for e in sorted(events, key=lambda e: e.get("step", 0)):
        kind, st = e.get("kind"), e.get("step")
        if st is None or not (x0 <= st <= x1) or kind in ("divergence", "plateau"):
            continue
        if shown >= max_markers:
            break
        shown += 1
        x = px(st)
        col = _MARK.get(kind, _TEXT)
        tip = f"<title>{escape(e.get('detail', kind))}</title>"
        if kind == "spike" and isinstance(e.get("value"), (int, float)) and math.isfinite(e["value"]):
            v = float(e["value"])
            if (not use_log or v > 0) and metric == "loss":
                y = min(max(py(v), top), top + ph)
                out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="none" stroke="{col}" stroke-width="1.6">{tip}</circle>')
                continue
        if kind == "nan":
            out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + ph}" stroke="{col}" stroke-width="1.4">{tip}</line>')
            out.append(f'<text x="{x + 3:.1f}" y="{top + 11}" fill="{col}">{escape(str(e.get("value", "nan")).upper())} @ {st}</text>')
        elif kind in ("lr_jump", "resume", "data_restart", "grad_explosion"):
            label = {"lr_jump": "LR", "resume": "resume", "data_restart": "data", "grad_explosion": "grad"}[kind]
            out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + ph}" stroke="{col}" '
                       f'stroke-width="1" stroke-dasharray="4 3">{tip}</line>')
            row = sum(1 for lx in labels if abs(lx - x) < 34)
            labels.append(x)
            out.append(f'<text x="{x + 3:.1f}" y="{top + ph - 4 - 12 * row}" fill="{col}">{label}</text>')
        elif kind in ("loss_scale_collapse", "skipped_steps"):
            y = top + ph
            out.append(f'<path d="M{x:.1f},{y - 8:.1f} l5,8 l-10,0 z" fill="{col}">{tip}</path>')
        else:
            out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + ph}" stroke="{col}" stroke-width="1">{tip}</line>')
    out.append("</svg>")
    return "\n".join(out)
