"""How a case's answer is scored and summed up, shared by bench/evaluate.py (which runs the
cases) and bench/evaluate_doc.py (which writes docs/benchmarks.md from the results)."""

from __future__ import annotations

import contextlib
import statistics
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("hang", "crash", "slow", "diverge", "healthy", "health-check")
ORIGINS = ("captured", "external", "public")


def seen_by_rules(url: str, evidence: str = "") -> bool:
    """Whether a public case was seen while the rules were written: its thread URL is cited in the
    rules, signatures, probes or playbooks, or its evidence file is a rule's test case."""
    needles = [n for n in (url.rstrip("/") if url.startswith("https://") else "", Path(evidence).name if evidence else "") if n]
    if not needles:
        return False
    for folder in ("rules", "probes/logs/patterns", "probes", "playbooks"):
        for p in (ROOT / folder).rglob("*"):
            if p.is_file() and p.suffix in (".yaml", ".py", ".md", ".txt", ".json"):
                with contextlib.suppress(OSError):
                    text = p.read_text(errors="replace")
                    if any(n in text for n in needles):
                        return True
    return False


def _said(row: dict[str, Any]) -> str:
    top = row["got"]["top"]
    if row.get("error") and not top:
        return f"error: {row['error']}"
    if not top:
        return "nothing wrong"
    return "; ".join(f"{f['cause']} ({f['severity']}{', ranks ' + _ranks(f['ranks']) if f['ranks'] else ''})"
                     for f in top)


def _ranks(r: list[int]) -> str:
    if not r:
        return "-"
    if len(r) > 6:
        return f"{','.join(map(str, r[:4]))},... ({len(r)})"
    return ",".join(map(str, r))


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    faults = [r for r in rows if r["truth"]["cause"] is not None]
    healthy = [r for r in rows if r["truth"]["cause"] is None]
    tp, fp, fn = (sum(r[k] for r in rows) for k in ("tp", "fp", "fn"))
    secs = [r["seconds"] for r in rows if r["seconds"] == r["seconds"]]

    def frac(xs: list[dict[str, Any]], key: str) -> tuple[int, int]:
        return sum(bool(r[key]) for r in xs), len(xs)

    by_kind = {}
    for kind in KINDS:
        ks = [r for r in rows if r["kind"] == kind]
        if ks:
            by_kind[kind] = {"n": len(ks), "right": frac(ks, "right")[0],
                             "top1": frac([r for r in ks if r["top1"] is not None], "top1"),
                             "top3": frac([r for r in ks if r["top3"] is not None], "top3")}
    by_origin = {}
    for origin in ORIGINS:
        os_ = [r for r in rows if r["origin"] == origin]
        if os_:
            by_origin[origin] = {"n": len(os_), "right": frac(os_, "right")[0]}
    unseen = [r for r in rows if r["origin"] == "public" and not r["seen_by_rules"]]
    return {
        "n": len(rows), "faults": len(faults), "healthy": len(healthy),
        "top1": frac(faults, "top1"), "top3": frac(faults, "top3"), "right": frac(rows, "right"),
        "culprit_precision": tp / (tp + fp) if tp + fp else None,
        "culprit_recall": tp / (tp + fn) if tp + fn else None,
        "culprit_cases": sum(bool(r["truth"]["ranks"]) for r in rows),
        "false_alarms": frac(healthy, "false_alarm"),
        "unseen_public": {"n": len(unseen), "right": frac(unseen, "right")[0],
                          "top1": frac([r for r in unseen if r["top1"] is not None], "top1")},
        "by_kind": by_kind, "by_origin": by_origin,
        "seconds_median": statistics.median(secs) if secs else None, "seconds_max": max(secs) if secs else None,
        "cli_median": (statistics.median(c) if (c := [r["cli_seconds"] for r in rows if r.get("cli_seconds")]) else None),
        "expect_pass_failing": [r["case"] for r in rows if r["expect_pass"] and not r["right"]],
        "unexpected_pass": [r["case"] for r in rows if not r["expect_pass"] and r["right"]],
    }


def summarize_sealed(rows: list[dict[str, Any]], cases: list[Any]) -> dict[str, Any]:
    """The sealed split in aggregate only (bench/sealed.py says why), with the first-sight figures
    each batch recorded when it was added next to today's."""
    s = summarize(rows)
    out = {k: s[k] for k in ("n", "faults", "healthy", "top1", "top3", "right", "false_alarms", "by_kind")}
    out["state_ok"] = [sum(bool(r["state_ok"]) for r in rows), len(rows)]
    tickets = [r for r in rows if r["ticket"] and r["top1"] is not None]
    out["tickets_top1"] = [sum(bool(r["top1"]) for r in tickets), len(tickets)]
    herrings = [r for r in rows if r["red_herring"]]
    out["red_herrings_alarmed"] = [sum(r["got"]["alarms"] > 0 for r in herrings if r["truth"]["cause"] is None), len(herrings)]
    batches: dict[str, dict[str, Any]] = {}
    for case in cases:
        fr = case.truth.get("first_run") or {}
        b = batches.setdefault(str(case.truth.get("batch", "?")), {"n": 0, "top1": [0, 0], "top3": [0, 0], "right": [0, 0]})
        b["n"] += 1
        for key in ("top1", "top3", "right"):
            if fr.get(key) is not None:
                b[key][0] += bool(fr[key])
                b[key][1] += 1
    out["batches_first_sight"] = batches
    out["miss_shapes"] = miss_shapes(rows)
    return out


def miss_shapes(rows: list[dict[str, Any]]) -> dict[str, int]:
    """How the wrong answers look, counted over the split: whether mldoctor read nothing at all,
    read evidence but named no cause, or named the wrong one. Aggregate only, so it guides general
    reading work (the first two are gaps in breadth, the last in reasoning) without pointing at a
    single case."""
    shapes = {"nothing_read": 0, "read_no_finding": 0, "wrong_cause": 0, "alarm_on_healthy": 0}
    for r in rows:
        if r["right"]:
            continue
        got = r["got"]
        if r["truth"]["cause"] is None:
            shapes["alarm_on_healthy"] += 1
        elif not got["kinds"]:
            shapes["nothing_read"] += 1
        elif not got["top"]:
            shapes["read_no_finding"] += 1
        else:
            shapes["wrong_cause"] += 1
    return shapes


def _med(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")
