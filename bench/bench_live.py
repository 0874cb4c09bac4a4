"""Time to verdict on live jobs (a hung one and a healthy one), and how long each rank is paused
by a stack dump.

Run: python bench/bench_live.py [--ranks 4 8] [--repeat 3] [--scenarios extra_collective healthy]
     [--baseline-tree DIR] [--runs-out FILE]
For each rank count and scenario it starts the real job (torchrun, gloo, CPU), waits until it
hangs (or runs), then runs `mldoctor diagnose --pid <launcher> --json` REPEAT times and prints
the median, p90 and max wall time (the whole command: start-up, probes, analysis, writing the
reports), the time of the run's last step (its own clock, from discovery to the verdict), the
first-pass time (two snapshots, before any follow-up), how many runs took a sampling window and
how long it was, the median and max py-spy pause per rank read from the bundle (each dump's wall
time: an upper bound on the pause, since it includes starting py-spy), the verdict, and the
ratio of the median to the first job's median measured in the same run (the machine's load
cancels out of the ratio). Targets: < 3 s for a hung job of 8 ranks; a healthy job of 8 ranks
< 5 s; < 50 ms median pause. Nothing is asserted.

``--baseline-tree DIR``: a copy of an older mldoctor (DIR/doctor with probes, rules and
playbooks under it, as installed) measured on the same job, run for run, alternating with the
current tree so that load on the shared host hits both alike; a second row per job gives its
figures and the current/baseline ratio of the medians. ``--runs-out`` writes every run as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from doctor.live import demo  # noqa: E402


def once(pid: int, out: Path, tree: Path | None = None) -> dict[str, Any]:
    """One ``mldoctor diagnose`` of the job; ``tree``: run that copy of mldoctor instead."""
    env = dict(os.environ)
    if tree is not None:  # the copy comes first on the path, ahead of the editable install
        env["PYTHONPATH"] = str(tree) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "doctor.cli", "diagnose", "--pid", str(pid), "--json",
                          "--out", str(out)], capture_output=True, text=True, timeout=300, env=env,
                         cwd=str(tree) if tree is not None else None)
    wall = time.perf_counter() - t0
    report = json.loads(res.stdout)
    manifest = json.loads((Path(report["source"]["bundle"]) / "manifest.json").read_text())
    pauses = [a["meta"]["pause_s"] for a in manifest["artifacts"] if a["kind"] == "stacks" and "pause_s" in a.get("meta", {})]
    windows = sorted({(a.get("meta") or {}).get("duration_s") for a in manifest["artifacts"]
                      if a["kind"] == "samples" and (a.get("meta") or {}).get("duration_s")})
    n_windows = len({a["path"].rsplit("-rank", 1)[0] for a in manifest["artifacts"]
                     if a["kind"] == "samples" and "-rank" in a["path"]})
    first = next((s["t"] for s in report["trace"] if s["action"] == "rules"), wall)
    # a kept slice that ended before its length on step evidence (doctor/live/window.py)
    ended_early = any(s["action"] == "window" and "ended after" in s["detail"] for s in report["trace"])
    top = report["findings"][0]["cause"] if report["findings"] else "-"
    last = report["trace"][-1]["t"] if report["trace"] else wall
    return {"wall": wall, "first": first, "last": last, "pauses": pauses, "top": top, "state": report["verdict"]["state"],
            "windows": n_windows, "window_s": windows, "ended_early": ended_early,
            "tree": str(tree) if tree else "current"}


def p90(xs: list[float]) -> float:
    """The 90th percentile (nearest rank): with 10 runs, the second slowest."""
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, -(-9 * len(s) // 10) - 1))]


def row(n: int, label: str, runs: list[dict[str, Any]], base: float | None, ref: str) -> str:
    walls = [r["wall"] for r in runs]
    pauses = [p for r in runs for p in r["pauses"]]
    med = statistics.median(walls)
    sampled = [r for r in runs if r["windows"]]
    win = sorted({w for r in sampled for w in r["window_s"]})
    return (f"| {n} | {label} | {med:.2f} s | {p90(walls):.2f} s | {max(walls):.2f} s | "
            f"{med / base:.2f}x {ref} | {statistics.median([r['last'] for r in runs]):.2f} s | "
            f"{statistics.median([r['first'] for r in runs]):.2f} s | "
            f"{len(sampled)}/{len(runs)}" + (f" ({', '.join(f'{w:g}' for w in win)} s)" if win else "") + " | "
            f"{statistics.median(pauses or [0]) * 1000:.0f} ms / {max(pauses or [0]) * 1000:.0f} ms | "
            f"{', '.join(sorted({r['state'] for r in runs}))} | {', '.join(sorted({r['top'] for r in runs}))} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--scenarios", nargs="+", default=["extra_collective", "healthy"])
    ap.add_argument("--baseline-tree", type=Path, default=None,
                    help="an older mldoctor copy (DIR/doctor/...) to measure alternately on the same job")
    ap.add_argument("--runs-out", type=Path, default=None, help="write every run as JSON here")
    args = ap.parse_args()
    print("| ranks | job | time to verdict, median | p90 | max | ratio | last step inside the run, median | "
          "first pass, 2 snapshots | "
          "runs with a sampling window | pause per dump median / max | verdict | top cause |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    every: list[dict[str, Any]] = []
    load0 = os.getloadavg()
    for n in args.ranks:
        base = None
        for scenario in args.scenarios:
            cur: list[dict[str, Any]] = []
            old: list[dict[str, Any]] = []
            with tempfile.TemporaryDirectory() as tmp:
                proc, log = demo.start(scenario, Path(tmp), nproc=n)
                try:
                    demo.wait_until_stuck(proc, log, scenario)
                    for i in range(args.repeat):
                        order = [None, args.baseline_tree] if i % 2 == 0 else [args.baseline_tree, None]
                        for tree in order:
                            if tree is None:
                                cur.append(once(proc.pid, Path(tmp) / f"out{i}"))
                            elif args.baseline_tree is not None:
                                old.append(once(proc.pid, Path(tmp) / f"base{i}", tree))
                finally:
                    demo.stop(proc)
            for r in cur + old:
                every.append({"ranks": n, "scenario": scenario, **r})
            med = statistics.median(r["wall"] for r in cur)
            base = med if base is None else base
            print(row(n, scenario, cur, base, "vs first job"), flush=True)
            if old:
                print(row(n, f"{scenario} (baseline tree)", old, med, "vs current"), flush=True)
                print(f"<!-- {scenario}, {n} ranks: current/baseline median ratio "
                      f"{med / statistics.median(r['wall'] for r in old):.2f} -->", flush=True)
    # The host is often shared: the load says how far the absolute figures are from a quiet one.
    print(f"<!-- load average (1, 5, 15 min) at start {', '.join(f'{x:.1f}' for x in load0)}, at the end "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}; {os.cpu_count()} cores -->", flush=True)
    if args.runs_out:
        args.runs_out.write_text(json.dumps(every, indent=1))


if __name__ == "__main__":
    main()
