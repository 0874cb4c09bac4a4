"""The library API: metric files as one tidy pandas table, and ``metrics`` facts from paths, a
table or series, for notebooks and tests that want the numbers without a whole diagnosis.

It reads files the way the probe does (:mod:`~doctor.probes.metrics.formats`) and folds them
with the probe's own :func:`~doctor.probes.metrics.summary.summarize`, so a table and a diagnosis
never disagree. pandas is imported inside the functions, so importing this module does not
load it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from doctor.probes.metrics.detect import METRICS, Params, Series, logged_nan
from doctor.probes.metrics.formats import carries_metric_lines, owns, read_series
from doctor.probes.metrics.names import TRAINING
from doctor.probes.metrics.readers.tfevents import merge_tensorboard
from doctor.probes.metrics.summary import summarize

from doctor.evidence.contract import Hints, Sample
from doctor.evidence.errors import EvidenceError


def load_series(paths: list[Path | str]) -> list[Series]:
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
                if not (owns(sample) or carries_metric_lines(sample)):
                    continue
                out += read_series(f, rel, Hints.from_path(rel))
            except EvidenceError:
                continue
    return merge_tensorboard(out)


def to_table(series: list[Series]) -> Any:
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


def table_series(table: Any) -> list[Series]:
    """Back from a tidy table to series (NaN cells count as missing, as the table cannot tell)."""
    import numpy as np

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
                flags = logged_nan(cols[m], [v for k, v in cols.items() if k in TRAINING and k != m])
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
    params = Params.from_env(options)
    if hasattr(source, "columns"):
        series = table_series(source)
    elif isinstance(source, list) and source and hasattr(source[0], "cols"):
        series = source
    else:
        series = load_series(source if isinstance(source, list) else [source])
    return summarize(series, params)
