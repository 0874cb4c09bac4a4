"""Cost of the GPU probe: wall time per snapshot, NVML calls per snapshot and per second.

    python bench/bench_gpu.py --live [--reps 50] [--json OUT]   # real NVML (on a GPU host)
    python bench/bench_gpu.py [--gpus 8]                         # fake NVML: our own Python overhead,
                                                                 # plus parsing the captured fixtures

Target (issue 5): under 50 ms per snapshot for 8 GPUs. On a one-GPU machine the live number is
reported per GPU and multiplied by 8 (NVML calls are per device, so the cost is linear in GPUs).
Prints medians and ratios; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from doctor.probes import gpu  # noqa: E402

BUDGET_8_GPUS_MS = 50.0


class TimedNvml:
    """Wraps an NVML module and times every nvml* function (cumulative seconds, call count)."""

    def __init__(self, nv: Any) -> None:
        self._nv = nv
        self.spent: dict[str, float] = {}
        self.count: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        val = getattr(self._nv, name)
        if not name.startswith("nvml") or not callable(val):
            return val

        def timed(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return val(*args)
            finally:
                self.spent[name] = self.spent.get(name, 0.0) + time.perf_counter() - t0
                self.count[name] = self.count.get(name, 0) + 1

        return timed


def bench_snapshots(nv: Any, reps: int, nvlink: bool = True, fields: bool = True, cold: bool = True) -> dict[str, Any]:
    """``cold``: forget the per-process cache of static values before each snapshot, so every
    rep costs what the first snapshot of a fresh ``mldoctor`` costs."""
    walls, calls = [], []
    for _ in range(reps):
        if cold:
            gpu._STATIC.clear()
        t0 = time.perf_counter()
        doc = gpu.collect_document(nv, host="bench", samples=0, nvlink=nvlink, xid=False, fields=fields)
        walls.append(time.perf_counter() - t0)
        calls.append(doc["cost"]["calls"])
    n_gpus = max(1, len(doc["devices"]))
    med = statistics.median(walls)
    return {
        "gpus": n_gpus, "reps": reps, "wall_ms_median": round(med * 1e3, 3),
        "wall_ms_p90": round(sorted(walls)[int(0.9 * (reps - 1))] * 1e3, 3),
        "wall_ms_per_gpu": round(med * 1e3 / n_gpus, 3),
        "extrapolated_8_gpus_ms": round(med * 1e3 / n_gpus * 8, 2),
        "calls_per_snapshot": calls[-1], "calls_per_gpu": round(calls[-1] / n_gpus, 1),
        "calls_per_second": round(calls[-1] / med) if med else None,
        "failed_calls": doc["cost"]["failed_calls"],
    }


def bench_samples(nv: Any, n: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    doc = gpu.collect_document(nv, host="bench", samples=n, interval=0.0, xid=False)
    wall = time.perf_counter() - t0
    return {"samples": n, "wall_ms": round(wall * 1e3, 2), "sampling_ms": round(doc["cost"]["sampling_s"] * 1e3, 2),
            "ms_per_sample_per_gpu": round(doc["cost"]["sampling_s"] * 1e3 / n / max(1, len(doc["devices"])), 3)}


def bench_parse() -> dict[str, Any]:
    """Parse + build time of every captured fixture file (offline half of the probe)."""
    from doctor.evidence.contract import Hints, Sample  # noqa: PLC0415

    out: dict[str, Any] = {}
    for path in sorted((ROOT / "tests/fixtures/gpu").rglob("*")):
        if not path.is_file() or path.suffix in (".py", ".md", ".sh", ".log") or path.name.startswith("."):
            continue
        rel = path.relative_to(ROOT).as_posix()
        if not gpu.PROBE.sniff(Sample.read(path)):
            continue
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            try:
                p = gpu.PROBE.parse(path, rel, Hints.from_path(rel))
                gpu.PROBE.build([p], {"job": {}})
            except Exception as exc:  # noqa: BLE001 - a bench reports, it does not stop
                times = [float("nan")]
                out[rel] = f"error: {exc}"
                break
            times.append(time.perf_counter() - t0)
        if rel not in out:
            out[rel] = round(statistics.median(times) * 1e3, 3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--live", action="store_true", help="use the real NVML library")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--gpus", type=int, default=8, help="fake GPUs (without --live)")
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    args = ap.parse_args()
    result: dict[str, Any] = {}
    if args.live:
        import pynvml  # noqa: PLC0415

        pynvml.nvmlInit()
        try:
            timed = TimedNvml(pynvml)
            result["snapshot"] = bench_snapshots(timed, args.reps)
            result["snapshot_warm_cache"] = bench_snapshots(pynvml, args.reps, cold=False)
            result["snapshot_one_call_per_counter"] = bench_snapshots(pynvml, args.reps, fields=False)
            result["sampling"] = bench_samples(pynvml, 20)
            per_call = {k: round(timed.spent[k] / timed.count[k] * 1e6, 1) for k in timed.spent}
            result["us_per_call"] = dict(sorted(per_call.items(), key=lambda kv: -kv[1]))
        finally:
            pynvml.nvmlShutdown()
    else:
        from fake_nvml import FakeNvml, device  # noqa: PLC0415

        nv = FakeNvml([device() for _ in range(args.gpus)])
        result["snapshot_fake"] = bench_snapshots(nv, args.reps)
        result["snapshot_fake_warm_cache"] = bench_snapshots(nv, args.reps, cold=False)
        result["sampling_fake"] = bench_samples(nv, 20)
        result["parse_ms"] = bench_parse()
    snap = result.get("snapshot") or result.get("snapshot_fake")
    warm = result.get("snapshot_warm_cache") or result.get("snapshot_fake_warm_cache")
    print(json.dumps(result, indent=1))
    print(f"\nper snapshot: {snap['wall_ms_median']} ms for {snap['gpus']} GPU(s) = {snap['wall_ms_per_gpu']} ms/GPU; "
          f"8 GPUs ~ {snap['extrapolated_8_gpus_ms']} ms vs budget {BUDGET_8_GPUS_MS} ms "
          f"(ratio {snap['extrapolated_8_gpus_ms'] / BUDGET_8_GPUS_MS:.2f}); {snap['calls_per_gpu']} NVML calls/GPU, "
          f"{snap['calls_per_second']} calls/s while snapshotting; repeated snapshots (static values cached): "
          f"{warm['wall_ms_per_gpu']} ms/GPU")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
