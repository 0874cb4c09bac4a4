"""Throughput and memory of the log scanner (probes/logs/scan.py). Prints, never asserts.

Two inputs, both made of real lines from tests/fixtures/logs and tests/fixtures/evidence:
a dense log (the fixtures' lines repeated up to --mib MiB: step lines, NCCL INFO, recompile
warnings, tracebacks) and a sparse one (real lines, a NUL hole of --hole-gib GiB, real lines).
Each is scanned --runs times in a fresh child process; the medians of wall time, CPU time and
peak RSS are printed with the rates (CPU time: on a shared machine wall time measures the load).

    python bench/bench_logs.py [--mib 64] [--hole-gib 2] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [
    "tests/fixtures/evidence/healthy/torchrun.log", "tests/fixtures/logs/nccl_healthy/torchrun.log",
    "tests/fixtures/logs/recompile/torchrun.log", "tests/fixtures/logs/worker_kill/torchrun.log",
    "tests/fixtures/logs/nccl_shared_gpu/torchrun.log",
]
CHILD = """
import json, resource, sys, time
from pathlib import Path
from doctor.probes.logs import scan
scan.library()
t, c = time.perf_counter(), time.process_time()
s = scan.scan_file(Path(sys.argv[1]), "bench.log")
print(json.dumps({"s": time.perf_counter() - t, "cpu": time.process_time() - c, "lines": s.lines,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run(path: Path, runs: int) -> dict:
    out = []
    for _ in range(runs):
        res = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True,
                             check=True, cwd=ROOT)
        out.append(json.loads(res.stdout))
    return {"s": statistics.median(o["s"] for o in out), "cpu": statistics.median(o["cpu"] for o in out),
            "lines": out[0]["lines"],
            "rss_mib": statistics.median(o["rss_mib"] for o in out)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--hole-gib", type=float, default=2.0)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    blob = b"".join((ROOT / s).read_bytes() for s in SOURCES if (ROOT / s).exists())
    with tempfile.TemporaryDirectory(prefix="mldoctor-bench-logs-") as tmp:
        dense = Path(tmp) / "dense.log"
        with open(dense, "wb") as fh:
            written = 0
            while written < args.mib * 2**20:
                fh.write(blob)
                written += len(blob)
        sparse = Path(tmp) / "sparse.log"
        with open(sparse, "wb") as fh:
            fh.write(blob)
            fh.truncate(int(args.hole_gib * 2**30))
            fh.seek(0, 2)
            fh.write(b"\n" + blob)
        for name, path in (("dense", dense), ("sparse", sparse)):
            r = run(path, args.runs)
            size = path.stat().st_size / 2**20
            print(f"{name:6s} {size:8.0f} MiB {r['lines']:>9d} lines  median {r['s']:6.2f} s "
                  f"(CPU {r['cpu']:.2f} s)  "
                  f"{size / r['s']:7.1f} MiB/s  {r['lines'] / r['s'] / 1e3:7.1f} k lines/s  "
                  f"peak RSS {r['rss_mib']:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
