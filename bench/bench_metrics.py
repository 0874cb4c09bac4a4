"""Benchmark: a 10-million-row metrics CSV through ``mldoctor diagnose`` (parse, detectors, rules).

Target (issue 7): under 5 s and 2 GiB on a 2-core machine. The file is generated into /tmp
(a loss curve with noise, one spike, a learning-rate jump and a NaN tail, so every detector has
work), analysed three times in fresh processes, and deleted. Prints the median time, the median
peak RSS and their ratio to the target; never asserted anywhere.

    python bench/bench_metrics.py [--rows 10000000] [--file EXISTING.csv (not generated, kept)]
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

TARGET_S = 5.0
TARGET_MIB = 2048.0
CHUNK = 1_000_000


def _chunk(args: tuple[str, int, int, int]) -> str:
    """Write rows [start, start+n) of the synthetic run to their own file."""
    import numpy as np
    import pandas as pd

    path, start, n, total = args
    rng = np.random.default_rng(start)
    step = np.arange(start + 1, start + n + 1)
    loss = 2.0 + 3.0 * np.exp(-step / (total / 20)) + 0.05 * rng.standard_normal(n)
    gn = 0.5 + 0.05 * rng.standard_normal(n)
    lr = np.where(step < total * 0.7, 3e-4, 3e-3)  # a 10x LR jump at 70%
    loss[(step == int(total * 0.4))] += 3.0  # one spike at 40%
    tail = step > total - 1000
    loss[tail] = np.nan  # the last 1000 steps are NaN
    gn[tail] = np.nan
    df = pd.DataFrame({"step": step, "loss": loss, "grad_norm": gn, "lr": lr,
                       "step_time": 0.25 + 0.01 * rng.random(n), "data_time": 0.01 * rng.random(n)})
    df.to_csv(path, index=False, header=start == 0, float_format="%.6g", na_rep="nan")
    return path


def generate(path: Path, rows: int) -> float:
    t0 = time.perf_counter()
    parts = [(f"{path}.part{i}", s, min(CHUNK, rows - s), rows) for i, s in enumerate(range(0, rows, CHUNK))]
    with Pool(min(2, os.cpu_count() or 1)) as pool:
        files = pool.map(_chunk, parts)
    with open(path, "wb") as out:
        for f in files:
            with open(f, "rb") as fh:
                shutil.copyfileobj(fh, out, 16 * 2**20)
            os.unlink(f)
    return time.perf_counter() - t0


def child(path: str) -> None:
    """One analysis in this fresh process; prints seconds and peak RSS as JSON."""
    t0, c0 = time.perf_counter(), time.process_time()
    from doctor.engine import ruleset as engine
    from doctor.engine.diagnose import diagnose_path

    engine.load_ruleset()  # every helper's YAML rules, parsed once (cached for the diagnosis)
    rules_cpu = time.process_time() - c0
    rep = diagnose_path(Path(path))
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    m = rep.facts.get("metrics", {})
    print(json.dumps({"seconds": dt, "cpu": cpu, "imports_rules_cpu": rules_cpu, "rss_mib": rss, "rows": (m.get("loss") or {}).get("rows"),
                      "first_nan_step": m.get("first_nan_step"), "spikes": len(m.get("spikes", [])),
                      "top": rep.findings[0].cause if rep.findings else None,
                      "parse_s": rep.timing.get("parse.metrics"), "errors": rep.facts["evidence"]["errors"]}))


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return
    rows = int(sys.argv[sys.argv.index("--rows") + 1]) if "--rows" in sys.argv else 10_000_000
    given = Path(sys.argv[sys.argv.index("--file") + 1]) if "--file" in sys.argv else None
    tmp = Path(tempfile.mkdtemp(prefix="mldoctor_bench_metrics_"))
    path = given or tmp / "metrics.csv"
    try:
        if given is None:
            gen_s = generate(path, rows)
            print(f"generated {rows:,} rows, {path.stat().st_size / 2**20:.0f} MiB in {gen_s:.1f} s")
        # Reference on the same machine and moment: pandas alone reading the file.
        ref = subprocess.run([sys.executable, "-c", "import time, pandas as pd; c = time.process_time(); "
                              f"pd.read_csv({str(path)!r}); print(time.process_time() - c)"],
                             capture_output=True, text=True, check=True)
        print(f"reference: pandas.read_csv alone takes {float(ref.stdout):.2f} s CPU on this file now")
        runs = []
        for i in range(3):
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, __file__, "--child", str(path)], capture_output=True,
                                 text=True, check=True)
            wall = time.perf_counter() - t0
            r = json.loads(out.stdout.strip().splitlines()[-1])
            r["wall"] = wall
            runs.append(r)
            print(f"run {i + 1}: analysis {r['seconds']:.2f} s wall, {r['cpu']:.2f} s CPU of which imports and rule "
                  f"loading {r['imports_rules_cpu']:.2f} s (process wall {wall:.2f} s, metrics parse+build "
                  f"{r['parse_s'] or 0:.2f} s), peak RSS {r['rss_mib']:.0f} MiB; loss rows {r['rows']:,}, "
                  f"first NaN step {r['first_nan_step']}, spikes {r['spikes']}, top finding {r['top']}")
        med_s = statistics.median(r["seconds"] for r in runs)
        med_w = statistics.median(r["wall"] for r in runs)
        med_m = statistics.median(r["rss_mib"] for r in runs)
        med_c = statistics.median(r["cpu"] for r in runs)
        load = os.getloadavg()[0]
        print(f"median analysis {med_s:.2f} s wall ({med_s / TARGET_S:.2f}x of the {TARGET_S:.0f} s target), "
              f"{med_c:.2f} s CPU ({med_c / TARGET_S:.2f}x), process wall {med_w:.2f} s, peak RSS {med_m:.0f} MiB "
              f"({med_m / TARGET_MIB:.2f}x of 2 GiB); load average {load:.1f} on {os.cpu_count()} cores "
              "(wall exceeds CPU when other work shares the cores)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
