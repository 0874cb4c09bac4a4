"""Step timings written by the in-job helper (``doctor.torch``): slow steps, and whether they
recur with a period (a checkpoint every k steps is a cause, a one-off stall is another).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from doctor.probes.samples import timeshare as ts

from doctor.evidence.contract import (
    Hints,
)
from doctor.evidence.errors import EvidenceError

STEPS_SCHEMA = "mldoctor.steps/1"


def parse_steps(path: Path, rel: str, hints: Hints) -> dict[str, Any]:
    """The helper's JSONL: a header line, then one record per step."""
    header: dict[str, Any] | None = None
    recs: list[dict[str, Any]] = []
    bad = 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        for ln in fh:
            ln = ln.strip()
            if not ln:
                continue
            try:
                rec = json.loads(ln)
            except ValueError:
                bad += 1
                continue
            if not isinstance(rec, dict):
                bad += 1
            elif rec.get("schema") == STEPS_SCHEMA:
                header = header or rec
            elif isinstance(rec.get("step_time"), (int, float)):
                recs.append(rec)
    if header is None:
        raise EvidenceError(rel, f"no {STEPS_SCHEMA} header line")
    rank = header.get("rank") if isinstance(header.get("rank"), int) else hints.rank
    return {"type": "steps", "header": header, "records": recs, "bad": bad, "rank": rank}


def summarize_steps(data: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-rank and job-wide step-time facts from the helper's records."""
    by_rank: dict[str, dict[str, Any]] = {}
    tot_step = tot_data = tot_gc = 0.0
    phase_tot: dict[str, float] = {}
    compiles = 0
    slow_any: dict[str, Any] = {"n_slow": 0, "periodic": False, "interval": 0, "lost_share": 0.0}
    for d in data:
        recs = [r for r in d["records"] if r["step_time"] > 0]
        if not recs:
            continue
        rank = d["rank"] if d["rank"] is not None else 0
        times = [float(r["step_time"]) for r in recs]
        steps = [int(r.get("step", i)) for i, r in enumerate(recs)]
        st = sum(times)
        dt = sum(float(r.get("data_time") or 0.0) for r in recs)
        gt = sum(float(r.get("gc_time") or 0.0) for r in recs)
        phases: dict[str, float] = {}
        for r in recs:
            for k, v in (r.get("phases") or {}).items():
                if isinstance(v, (int, float)):
                    phases[k] = phases.get(k, 0.0) + float(v)
        comp = max((int(r.get("compiles") or 0) for r in recs), default=0)
        slow = ts.periodic_slow_steps(steps, times)
        srt = sorted(times)
        by_rank[str(rank)] = {
            "steps": len(recs), "step_time_median": round(statistics.median(times), 6),
            "step_time_p90": round(srt[min(len(srt) - 1, int(0.9 * len(srt)))], 6),
            "step_time_max": round(max(times), 6),
            "data_share": round(dt / st, 4) if st else 0.0, "gc_share": round(gt / st, 4) if st else 0.0,
            "phase_share": {k: round(v / st, 4) for k, v in phases.items()} if st else {},
            "compiles": comp, "slow": slow,
        }
        tot_step += st
        tot_data += dt
        tot_gc += gt
        compiles = max(compiles, comp)
        for k, v in phases.items():
            phase_tot[k] = phase_tot.get(k, 0.0) + v
        if slow["lost_share"] > slow_any.get("lost_share", 0.0) or (slow["periodic"] and not slow_any["periodic"]):
            slow_any = dict(slow) | {"rank": rank}
    if not by_rank:
        return {}
    meds = {r: v["step_time_median"] for r, v in by_rank.items()}
    mid = statistics.median(meds.values())
    return {
        "ranks": sorted(int(r) for r in by_rank),
        "n_steps": sum(v["steps"] for v in by_rank.values()),
        "step_time_median": round(mid, 6),
        "slowest_rank": int(max(meds, key=lambda r: meds[r])),
        "slowest_ratio": round(max(meds.values()) / mid, 3) if mid else 0.0,
        "data_share": round(tot_data / tot_step, 4) if tot_step else 0.0,
        "gc_share": round(tot_gc / tot_step, 4) if tot_step else 0.0,
        "phase_share": {k: round(v / tot_step, 4) for k, v in phase_tot.items()} if tot_step else {},
        "checkpoint_share": round(sum(v for k, v in phase_tot.items() if "checkpoint" in k or k in ("save", "ckpt")) / tot_step, 4) if tot_step else 0.0,
        "compiles": compiles,
        "slow": slow_any,
        "by_rank": by_rank,
    }


# --- source lines (live) ----------------------------------------------------------------------
