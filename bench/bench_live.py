"""Time to verdict on a live hung job, and how long each rank is paused by a stack dump.

Run: python bench/bench_live.py [--ranks 4 8] [--repeat 3]
For each rank count it starts the real extra_collective scenario (torchrun, gloo, CPU), waits
until it hangs, then runs `mldoctor diagnose --pid <launcher> --json` REPEAT times and prints
the median wall time, the first-pass time (two snapshots, before any follow-up), and the median
and max py-spy pause per rank read from the bundle (each dump's wall time: an upper bound on
the pause, since it includes starting py-spy). Targets: < 3 s for 8 ranks with two snapshots;
< 50 ms median pause. Nothing is asserted.
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


def once(pid: int, out: Path) -> tuple[float, float, list[float], str]:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "doctor.cli", "diagnose", "--pid", str(pid), "--json",
                          "--out", str(out)], capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - t0
    report = json.loads(res.stdout)
    manifest = json.loads((out / "bundle" / "manifest.json").read_text())
    pauses = [a["meta"]["pause_s"] for a in manifest["artifacts"] if a["kind"] == "stacks" and "pause_s" in a.get("meta", {})]
    first = next((s["t"] for s in report["trace"] if s["action"] == "rules"), wall)
    top = report["findings"][0]["cause"] if report["findings"] else "-"
    return wall, first, pauses, top


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print("| ranks | time to verdict (median) | first pass, 2 snapshots | pause per dump median / max | top cause |")
    print("| --- | --- | --- | --- | --- |")
    for n in args.ranks:
        with tempfile.TemporaryDirectory() as tmp:
            proc, log = demo.start("extra_collective", Path(tmp), nproc=n)
            try:
                demo.wait_until_stuck(proc, log, "extra_collective")
                walls, firsts, pauses, tops = [], [], [], []
                for i in range(args.repeat):
                    w, f, p, top = once(proc.pid, Path(tmp) / f"out{i}")
                    walls.append(w)
                    firsts.append(f)
                    pauses += p
                    tops.append(top)
            finally:
                demo.stop(proc)
        print(f"| {n} | {statistics.median(walls):.2f} s | {statistics.median(firsts):.2f} s | "
              f"{statistics.median(pauses) * 1000:.0f} ms / {max(pauses) * 1000:.0f} ms | {', '.join(sorted(set(tops)))} |")


if __name__ == "__main__":
    main()
