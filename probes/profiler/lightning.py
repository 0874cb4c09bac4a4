"""Lightning's SimpleProfiler report (``Trainer(profiler="simple")``), printed at the end of a
fit and written to ``<dirpath>/fit-<filename>.txt``.

Format (Lightning 2.x ``lightning/pytorch/profilers/simple.py`` ``SimpleProfiler.summary``, the
extended report; checked against the captures in tests/fixtures/profiler/h200/lightning-*.txt
from pytorch-lightning 2.6.6)::

    FIT Profiler Report

    ---------------------------------------------------------------------------------------
    |  Action                          \t|  Mean duration (s)\t|  Num calls \t|  Total time (s) \t|  Percentage %  \t|
    ---------------------------------------------------------------------------------------
    |  Total                           \t|  -              \t|  733       \t|  4.693          \t|  100 %         \t|
    |  run_training_epoch              \t|  4.3465         \t|  1         \t|  4.3465         \t|  92.617        \t|
    |  [_TrainingEpochLoop].train_dataloader_next \t| ...

The batch fetch is ``[_TrainingEpochLoop].train_dataloader_next`` (Lightning 2.x) or
``get_train_batch`` (1.x); the loop is ``run_training_epoch``. The share of the loop spent
fetching batches is the report's data-wait share.
"""

from __future__ import annotations

import re
from typing import Any

_HEADER = re.compile(r"^\|\s*Action\s*\|\s*Mean duration \(s\)\s*\|\s*Num calls\s*\|\s*Total time \(s\)", re.M)
_FETCH = re.compile(r"train_dataloader_next$|^get_train_batch$")
_LOOP = ("run_training_epoch",)
_STEP = ("run_training_batch",)
#: the report covers the fit from its first batch: the worker start-up allowance of the
#: profiler kind (``STARTUP_ALLOWANCE_US`` in its __init__), in seconds
STARTUP_ALLOWANCE_S = 1.0


def is_report(text: str) -> bool:
    return bool(_HEADER.search(text))


def parse_report(text: str) -> dict[str, Any] | None:
    """The report's rows (action, mean, calls, total) and the data-wait share of the loop."""
    m = _HEADER.search(text)
    if not m:
        return None
    rows: dict[str, dict[str, Any]] = {}
    for ln in text[m.end():].splitlines():
        s = ln.strip()
        if not s.startswith("|"):
            if rows and s and not set(s) <= {"-"}:
                break
            continue
        cells = [c.strip() for c in s.strip("|").split("|")]
        if len(cells) < 4:
            continue
        try:
            calls, total = int(cells[2]), float(cells[3])
        except ValueError:
            continue
        rows[cells[0]] = {"calls": calls, "total_s": total}
    if not rows:
        return None
    loop = next((rows[k]["total_s"] for k in _LOOP if k in rows), None) or rows.get("Total", {}).get("total_s") or 0.0
    fetch = sum(r["total_s"] for k, r in rows.items() if _FETCH.search(k))
    steps = next((rows[k]["calls"] for k in _STEP if k in rows), 0)
    top = sorted(((k, r) for k, r in rows.items() if k not in ("Total",) + _LOOP), key=lambda kr: -kr[1]["total_s"])[:5]
    return {
        "device": "", "steps": steps, "step_us": loop * 1e6, "self_cpu_us": 0.0, "self_device_us": 0.0,
        "shares": {"dataloader": round(min(1.0, max(0.0, fetch - STARTUP_ALLOWANCE_S) / loop), 4) if loop > 0 else 0.0,
                   "dataloader_raw": round(min(1.0, fetch / loop), 4) if loop > 0 else 0.0},
        "host_sync_per_step": 0.0, "host_sync_rows": [], "compiles": 0, "gpu_busy": None,
        "top": [{"name": k, "share": round(r["total_s"] / loop, 4) if loop else 0.0, "calls": r["calls"]} for k, r in top],
        "format": "lightning-simple",
    }
