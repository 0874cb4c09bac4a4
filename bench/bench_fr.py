"""Flight-recorder analysis: mldoctor vs torchfrtrace on the same dumps.

Cases: the four NVRx fault-injection cases (16 NCCL ranks, real dumps from
tests/fixtures/fr/nvrx, ground truth from their fault_injection.log), and a synthetic
1,024-rank case made by replicating one real case 64 times (ranks shifted by 16 per copy,
group names shifted by 1000 per copy, default_pg spanning all 1,024 ranks; every copy keeps
its two faulted ranks, so 128 culprits are expected).

Timed, each on the same files and in the same run:

- ``ours``: ``mldoctor diagnose --from DIR --json`` end to end (a new process: imports, every
  probe's sniff, the rules, the report), median of N runs;
- ``ours_fr``: the flight-recorder part in-process (sniff, restricted unpickle, parse, the
  cross-rank analysis), median of N;
- ``torchfrtrace``: ``python -m torch.distributed.flight_recorder.fr_trace DIR`` (torch's own
  analyzer, what the ``torchfrtrace`` script runs), median of N (fewer for the big case, see
  --tf-repeat-big), with whether it crashed and whether the ranks in its "missing ranks" lines
  include the faulted ranks (and how many other ranks they name);
- ``torchfrtrace in-process``: its ``main([DIR])`` called here with torch already imported, to
  compare the analyses without interpreter and import start-up.

    . /tmp/venv/bin/activate && python bench/bench_fr.py [--repeat 5] [--tf-repeat-big 1]

Prints a table with medians and the ratio torchfrtrace / ours. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from doctor.engine import facts as facts_mod  # noqa: E402
from doctor.evidence.unpickle import safe_loads  # noqa: E402

NVRX = ROOT / "tests" / "fixtures" / "fr" / "nvrx"
TRUTH = {"gpu_error_1st": {12, 14}, "gpu_error_2nd": {9, 14}, "lock_gil_1st": {9, 14}, "lock_gil_2nd": {10, 15}}
_MISSING = re.compile(r"missing ranks: \{([\d, ]*)\}")


def replicate(src: Path, dest: Path, copies: int) -> set[int]:
    """Write ``copies`` shifted copies of a 16-rank case; returns the expected culprits."""
    dest.mkdir(parents=True)
    n = len(list(src.glob("_dump_*")))
    world = n * copies

    def rename(name: str, k: int) -> str:
        return name if name == "0" or not k else str(int(name) + 1000 * k)

    for k in range(copies):
        for f in src.glob("_dump_*"):
            r = int(f.name.rsplit("_", 1)[1])
            d = safe_loads(f.read_bytes())
            cfg = {}
            for name, c in d["pg_config"].items():
                ranks = list(range(world)) if name == "0" else [int(x) + n * k for x in re.findall(r"\d+", c["ranks"])]
                cfg[rename(name, k)] = {**c, "name": rename(name, k), "ranks": str(ranks)}
            d["pg_config"] = cfg
            for e in d["entries"]:
                pg = e["process_group"]
                e["process_group"] = (rename(pg[0], k), pg[1])
            (dest / f"_dump_{r + n * k}").write_bytes(pickle.dumps(d, protocol=2))
    truth = TRUTH[src.name]
    return {t + n * k for k in range(copies) for t in truth}


def run_ours(folder: Path) -> tuple[float, list[int], str, bool]:
    """(seconds, top finding's ranks, its cause or the error, whether the run worked)."""
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "doctor.cli", "diagnose", "--from", str(folder), "--json"],
                         capture_output=True, text=True, timeout=900)
    dt = time.perf_counter() - t0
    try:
        rep = json.loads(res.stdout)
    except ValueError:
        return dt, [], f"rc={res.returncode} {res.stderr.strip()[:120]}", False
    top = rep["findings"][0] if rep["findings"] else {}
    return dt, top.get("ranks", []), top.get("cause", ""), True


def run_ours_inprocess(folder: Path) -> float:
    t0 = time.perf_counter()
    facts, _ = facts_mod.build(facts_mod.items_from_folder(folder), "loose")
    dt = time.perf_counter() - t0
    assert facts["flight_recorder"]["dumps"] > 0
    return dt


def run_torchfrtrace(folder: Path, timeout: float) -> tuple[float, bool, set[int], str]:
    t0 = time.perf_counter()
    try:
        res = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder)],
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - t0, True, set(), f"timed out after {timeout:.0f} s"
    dt = time.perf_counter() - t0
    named: set[int] = set()
    for m in _MISSING.finditer(res.stdout + res.stderr):
        named.update(int(x) for x in m.group(1).replace(" ", "").split(",") if x)
    crashed = res.returncode != 0
    err = ""
    if crashed:
        lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
        err = lines[-1][:120] if lines else f"rc={res.returncode}"
    return dt, crashed, named, err


def run_torchfrtrace_inprocess(folder: Path) -> float:
    """torch's analyzer in this process (torch already imported): its read + match only."""
    import contextlib
    import io
    import logging

    from torch.distributed.flight_recorder.fr_trace import main as fr_main

    sink = io.StringIO()
    # Its logger's StreamHandler holds the real stderr: point it at the sink (it still formats
    # every line, as it does in a terminal), and restore it afterwards.
    handlers = [h for h in logging.getLogger("Flight Recorder").handlers if isinstance(h, logging.StreamHandler)]
    old = [h.setStream(sink) for h in handlers]
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            fr_main([str(folder)])
    except (Exception, SystemExit):  # its crash is recorded by the subprocess run
        pass
    finally:
        dt = time.perf_counter() - t0
        for h, stream in zip(handlers, old, strict=True):
            h.setStream(stream)
    return dt


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tf-repeat-big", type=int, default=1, help="torchfrtrace runs on the 1,024-rank case")
    ap.add_argument("--copies", type=int, default=64)
    ap.add_argument("--big-from", default="lock_gil_2nd", choices=sorted(TRUTH))
    ap.add_argument("--tf-timeout", type=float, default=600)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-fr-"))
    try:
        cases: list[tuple[str, Path, set[int], int]] = []
        for name in sorted(TRUTH):
            dest = work / name
            dest.mkdir()
            for f in (NVRX / name).glob("_dump_*"):
                shutil.copy(f, dest / f.name)
            cases.append((name, dest, TRUTH[name], args.repeat))
        big = work / f"{args.big_from}_x{args.copies}"
        truth = replicate(NVRX / args.big_from, big, args.copies)
        cases.append((f"{args.big_from} x{args.copies} ({16 * args.copies} ranks)", big, truth, args.tf_repeat_big))

        rows = []
        for name, folder, truth, tf_rep in cases:
            ours = [run_ours(folder) for _ in range(args.repeat)]
            good = [o for o in ours if o[3]] or ours  # a failed run (e.g. a broken rule file) is not timed
            inproc = [run_ours_inprocess(folder) for _ in range(args.repeat)]
            tf = [run_torchfrtrace(folder, args.tf_timeout) for _ in range(tf_rep)]
            tf_in = [run_torchfrtrace_inprocess(folder) for _ in range(tf_rep)]
            o_ranks = set(good[-1][1])
            t_named = tf[-1][2]
            rows.append({
                "case": name, "ranks": len(list(folder.iterdir())),
                "ours_s": median([o[0] for o in good]), "ours_fr_s": median(inproc),
                "ours_runs": f"{sum(o[3] for o in ours)}/{len(ours)}",
                "tf_s": median([t[0] for t in tf]), "tf_runs": tf_rep, "tf_in_s": median(tf_in),
                "ours_ok": o_ranks == truth, "ours_cause": good[-1][2], "ours_extra": len(o_ranks - truth),
                "tf_crash": tf[-1][1], "tf_err": tf[-1][3],
                "tf_all": truth <= t_named, "tf_found": len(truth & t_named), "tf_extra": len(t_named - truth),
                "truth": len(truth),
            })
            r = rows[-1]
            print(f"... {name}: ours {r['ours_s']:.2f} s (FR part {r['ours_fr_s']:.3f} s), "
                  f"torchfrtrace {r['tf_s']:.2f} s (in-process {r['tf_in_s']:.3f} s)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print()
    print("| case | dumps | mldoctor diagnose (s) | torchfrtrace (s) | ratio | mldoctor FR in-process (s) | "
          "torchfrtrace in-process (s) | ratio | mldoctor top finding = faulted ranks | torchfrtrace crashed | "
          "torchfrtrace 'missing ranks' cover faulted | other ranks it names |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ok = f"yes ({r['ours_cause']})" if r["ours_ok"] else f"no ({r['ours_cause']}, {r['ours_extra']} extra)"
        crash = f"yes: {r['tf_err']}" if r["tf_crash"] else "no"
        print(f"| {r['case']} | {r['ranks']} | {r['ours_s']:.2f} (ok {r['ours_runs']}) | {r['tf_s']:.2f} (n={r['tf_runs']}) | "
              f"{r['tf_s'] / r['ours_s']:.1f}x | {r['ours_fr_s']:.3f} | {r['tf_in_s']:.3f} | "
              f"{r['tf_in_s'] / r['ours_fr_s']:.1f}x | {ok} | {crash} | "
              f"{'yes' if r['tf_all'] else 'no'} ({r['tf_found']}/{r['truth']}) | {r['tf_extra']} |")
    print(f"\nmedians of {args.repeat} runs (torchfrtrace: n as shown); ratio = torchfrtrace / mldoctor; "
          f"python {sys.version.split()[0]}, {os.cpu_count()} cpus")


if __name__ == "__main__":
    main()
