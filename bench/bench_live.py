"""Time to verdict on live jobs (a hung one and a healthy one), and how long each rank is paused
by a stack dump.

Run: python bench/bench_live.py [--ranks 4 8] [--repeat 3] [--scenarios extra_collective healthy]
For each rank count and scenario it starts the real job (torchrun, gloo, CPU), waits until it
hangs (or runs), then runs `mldoctor diagnose --pid <launcher> --json` REPEAT times and prints
the median wall time, the first-pass time (two snapshots, before any follow-up), the median and
max py-spy pause per rank read from the bundle (each dump's wall time: an upper bound on the
pause, since it includes starting py-spy), the verdict, and the ratio of the median to the hung
job's median measured in the same run (the machine's load cancels out of the ratio). Targets:
< 3 s for a hung job of 8 ranks; a healthy job of 8 ranks < 5 s; < 50 ms median pause. Nothing
is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from doctor.live import demo  # noqa: E402


def once(pid: int, out: Path) -> tuple[float, float, list[float], str, str]:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "doctor.cli", "diagnose", "--pid", str(pid), "--json",
                          "--out", str(out)], capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - t0
    report = json.loads(res.stdout)
    manifest = json.loads((Path(report["source"]["bundle"]) / "manifest.json").read_text())
    pauses = [a["meta"]["pause_s"] for a in manifest["artifacts"] if a["kind"] == "stacks" and "pause_s" in a.get("meta", {})]
    first = next((s["t"] for s in report["trace"] if s["action"] == "rules"), wall)
    top = report["findings"][0]["cause"] if report["findings"] else "-"
    return wall, first, pauses, top, report["verdict"]["state"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--scenarios", nargs="+", default=["extra_collective", "healthy"])
    args = ap.parse_args()
    print("| ranks | job | time to verdict (median, min-max) | vs hung job | first pass, 2 snapshots | "
          "pause per dump median / max | verdict | top cause |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in args.ranks:
        base = None
        for scenario in args.scenarios:
            with tempfile.TemporaryDirectory() as tmp:
                proc, log = demo.start(scenario, Path(tmp), nproc=n)
                try:
                    demo.wait_until_stuck(proc, log, scenario)
                    walls, firsts, pauses, tops, states = [], [], [], [], []
                    for i in range(args.repeat):
                        w, f, p, top, state = once(proc.pid, Path(tmp) / f"out{i}")
                        walls.append(w)
                        firsts.append(f)
                        pauses += p
                        tops.append(top)
                        states.append(state)
                finally:
                    demo.stop(proc)
            med = statistics.median(walls)
            base = med if base is None else base
            print(f"| {n} | {scenario} | {med:.2f} s ({min(walls):.1f}-{max(walls):.1f}) | {med / base:.2f}x | "
                  f"{statistics.median(firsts):.2f} s | "
                  f"{statistics.median(pauses or [0]) * 1000:.0f} ms / {max(pauses or [0]) * 1000:.0f} ms | "
                  f"{', '.join(sorted(set(states)))} | {', '.join(sorted(set(tops)))} |", flush=True)


if __name__ == "__main__":
    main()
