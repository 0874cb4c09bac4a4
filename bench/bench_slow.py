"""Benchmarks of the slow-job sampling (never asserted in tests; prints medians and ratios).

    . /tmp/venv/bin/activate && python bench/bench_slow.py [--repeats 3] [--skip-overhead] [--skip-analysis]

1. Overhead: a real healthy torchrun job (gloo, CPU) runs; its own throughput (rank 0's step
   markers) is counted over 10 s windows without sampling and with a 10 s sampling window of
   every rank (the samples probe's collect: py-spy record --idle --nonblocking, one per rank, at
   once), alternating in the same run. ratio = steps/s with sampling / mean of the windows
   before and after. Target: slowdown under 3%. Also the samplers' own CPU seconds.
2. Analysis: a real 8-rank job sampled 10 s at 100 Hz (the busiest rate a user would pick);
   then the offline analysis of that bundle (parse, time shares, cross-rank, all rules) is
   timed. Target: under 1 s.
"""

from __future__ import annotations

import argparse
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from doctor.probes import samples as sp  # noqa: E402

from doctor.evidence.bundle import Bundle  # noqa: E402
from doctor.evidence.contract import CollectContext  # noqa: E402
from doctor.live import demo, targets  # noqa: E402
from doctor.scenarios import STEP_LINE_RE, job_command  # noqa: E402


def start(name: str, nproc: int, work: Path) -> tuple[subprocess.Popen[bytes], Path]:
    argv, env = job_command(name, nproc=nproc, extra_env={"MLDOCTOR_SCRATCH_DIR": str(work / "scratch")})
    log = work / "job.log"
    fh = open(log, "wb")  # noqa: SIM115 - closed with the job
    proc = subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, cwd=work)
    return proc, log


def rank0_steps(log: Path) -> int:
    text = log.read_text(errors="replace")
    return max((int(m.group(2)) for m in STEP_LINE_RE.finditer(text) if m.group(1) == "0"), default=-1)


def wait_steps(proc: subprocess.Popen[bytes], log: Path, n: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while rank0_steps(log) < n:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"job did not reach step {n}; see {log}")
        time.sleep(0.3)


def sample_window(job: targets.Job, root: Path, duration: float, rate: int, rnd: int) -> Bundle:
    bundle = Bundle.create(root, {"type": "bench", "host": socket.gethostname()})
    ctx = CollectContext(bundle, job.host, job.procs, {"duration": duration, "rate": rate}, duration + 20,
                         "samples", rnd)
    sp.PROBE.collect(ctx)
    bundle.save()
    return bundle


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def overhead(nproc: int, rate: int, repeats: int, window: float) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-slow-") as tmp:
        work = Path(tmp)
        proc, log = start("healthy", nproc, work)
        try:
            wait_steps(proc, log, 30)
            job = targets.pick_job(targets.discover([proc.pid]), None)
            time.sleep(3)
            plain, sampled, cpu = [], [], []
            for i in range(repeats * 2 + 1):
                s0, t0 = rank0_steps(log), time.monotonic()
                if i % 2 == 1:
                    c0 = children_cpu()
                    sample_window(job, work / f"b{i}", window, rate, i)
                    cpu.append(children_cpu() - c0)
                else:
                    time.sleep(window)
                rate_i = (rank0_steps(log) - s0) / (time.monotonic() - t0)
                (sampled if i % 2 == 1 else plain).append(rate_i)
            ratios = [sampled[k] / statistics.mean(plain[k:k + 2]) for k in range(len(sampled))]
        finally:
            demo.stop(proc)
    med = statistics.median(ratios)
    print(f"overhead  healthy job, {nproc} rank(s), {rate} Hz, {window:.0f} s windows: "
          f"steps/s without {statistics.median(plain):.1f}, with {statistics.median(sampled):.1f}; "
          f"ratio median {med:.3f} (slowdown {100 * (1 - med):.1f}%), all {[round(r, 3) for r in ratios]}; "
          f"samplers' CPU {statistics.median(cpu):.2f} s per window for {nproc} rank(s)")


def analysis(repeats: int) -> None:
    from doctor.engine import facts as facts_mod
    from doctor.engine.diagnose import analyze

    with tempfile.TemporaryDirectory(prefix="bench-slow-an-") as tmp:
        work = Path(tmp)
        proc, log = start("healthy", 8, work)
        try:
            wait_steps(proc, log, 10, timeout=600)
            job = targets.pick_job(targets.discover([proc.pid]), None)
            bundle = sample_window(job, work / "bundle", 10, 100, 1)
        finally:
            demo.stop(proc)
        items = facts_mod.items_from_bundle(bundle)
        n_samples = 0
        times, facts_t = [], []
        for _ in range(repeats + 1):  # the first run also loads and compiles every rule
            t0 = time.perf_counter()
            rep = analyze(items, {"type": "bundle"}, "slow", list(bundle.manifest["probes"]))
            times.append(time.perf_counter() - t0)
            facts_t.append(rep.timing.get("parse.samples", 0.0) + rep.timing.get("samples", 0.0))
            n_samples = rep.facts["samples"]["samples_total"]
        cli = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "doctor.cli", "diagnose", "--from", str(work / "bundle"), "--json"],
                           capture_output=True, check=False, timeout=120)
            cli.append(time.perf_counter() - t0)
        size = sum(p.stat().st_size for p in (work / "bundle").rglob("samples-*.txt"))
    warm = times[1:]
    print(f"analysis  8 ranks x 10 s at 100 Hz ({n_samples} main-thread samples, {size / 1024:.0f} KiB raw): "
          f"in-process analysis (parse, shares, cross-rank, all rules) first {times[0] * 1000:.0f} ms (loads and "
          f"compiles the rules), then median {statistics.median(warm) * 1000:.0f} ms; samples parse+build median "
          f"{statistics.median(facts_t) * 1000:.0f} ms; 'mldoctor diagnose --from' CLI wall median "
          f"{statistics.median(cli):.2f} s (Python start and imports included)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--skip-analysis", action="store_true")
    args = ap.parse_args()
    if not args.skip_overhead:
        overhead(4, 50, args.repeats, args.window)
        overhead(4, 100, args.repeats, args.window)
        overhead(1, 50, args.repeats, args.window)
    if not args.skip_analysis:
        analysis(max(3, args.repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
