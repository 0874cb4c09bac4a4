"""Stacks evidence at 16,384 ranks: parse + cross-rank analysis time and peak memory.

Run: python bench/bench_stacks.py [RANKS]
Prints medians of 3 runs, each in a fresh interpreter (so peak RSS is that run's own); nothing is
asserted. Targets: parse + analysis of 16,384 ranks < 3 s and < 2 GiB peak RSS.

The evidence is real captured dumps (tests/fixtures/evidence and tests/fixtures/stacks), replicated
to RANKS ranks with renumbered ranks and pids: most ranks are copies of the all_reduce ranks of
the extra_collective capture (py-spy text), one in 64 of its barrier rank, one in 16 a py-spy
--json dump of the dataloader_hang capture, one in 512 the --native dump of the lock_self
culprit. Three measurements:

- stacks probe only: sniff + parse every file, then build (the analysis);
- the whole facts step as `mldoctor diagnose --from DIR` runs it (every file's head read once and
  offered to the probes, the claimed ones parsed, every kind built; target < 2 s at 16,384 ranks),
  with its ratio to reading the same files whole in the same process (the I/O floor);
- the rule pack evaluated over those facts.

The stacks run also splits its time by phase (reading each file's sample, the probe's sniff, its
parse, the cross-rank build), and the facts run names the stacks kind's share (its files' reads,
dispatch and parses, and its build) against the rest (every other probe's sniff, the folder walk).

``--baseline DIR`` times a second copy of the code the same way, in the same run, interleaved
with this one (e.g. ``git archive HEAD | tar -x -C DIR``: what a change is measured against), and
prints each median as a ratio to the baseline's; ``--runs N`` sets the runs per median (default 3).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EV = ROOT / "tests" / "fixtures" / "evidence"
ST = ROOT / "tests" / "fixtures" / "stacks"


def _first(*paths: Path) -> Path:
    for p in paths:
        if p.exists():
            return p
    raise SystemExit(f"missing fixture: {paths[0]}")


def replicate(dest: Path, ranks: int) -> dict[str, int]:
    """Write RANKS real dumps with renumbered ranks (file name) and pids (content)."""
    allreduce = _first(EV / "extra_collective" / "pyspy-rank0.txt", ST / "snapshots_extra_collective" / "pyspy-rank0-snap0.json")
    barrier = _first(EV / "extra_collective" / "pyspy-rank1.txt", ST / "snapshots_extra_collective" / "pyspy-rank1-snap0.json")
    js = _first(EV / "dataloader_hang" / "pyspy-rank0.json", ST / "snapshots_extra_collective" / "pyspy-rank2-snap0.json")
    native = _first(EV / "lock_self" / "pyspy-native-rank1.txt", ST / "native_collective" / "pyspy-native-rank1.txt")
    sources = {p: p.read_text() for p in (allreduce, barrier, js, native)}
    pid_text = re.compile(r"(?m)^(Process |Thread )(\d+)")
    pid_json = re.compile(r'"(pid|os_thread_id)": (\d+)')
    kinds: dict[str, int] = {}
    for r in range(ranks):
        src = native if r % 512 == 7 else js if r % 16 == 3 else barrier if r % 64 == 1 else allreduce
        text = sources[src]
        pid = str(100000 + r)
        if src.suffix == ".json":
            text = pid_json.sub(lambda m, pid=pid: f'"{m.group(1)}": {pid if m.group(1) == "pid" else m.group(2)}', text)
        else:
            text = pid_text.sub(lambda m, pid=pid: f"{m.group(1)}{pid}" if m.group(1) == "Process " else m.group(0),
                                text, count=2)
        name = f"pyspy-rank{r}{src.suffix}" if "native" not in src.name else f"pyspy-native-rank{r}.txt"
        (dest / name).write_text(text)
        kinds[src.name] = kinds.get(src.name, 0) + 1
    return kinds


CHILD = r"""
import json, resource, sys, time
from pathlib import Path
mode, folder = sys.argv[1], Path(sys.argv[2])
from doctor.engine import facts as F
read_s = None
if mode == "facts":
    # the baseline of the same run: reading every file whole, once, warm (the files were just
    # read to warm the page cache); what the facts step costs beyond I/O is the ratio to it
    files = sorted(folder.iterdir())
    for p in files:
        p.read_bytes()
    r0 = time.perf_counter()
    for p in files:
        p.read_bytes()
    read_s = time.perf_counter() - r0
t0 = time.perf_counter()
c0 = time.process_time()
if mode == "stacks":
    from doctor.evidence.contract import Hints, Sample
    from doctor.probes.stacks import PROBE
    clock = time.perf_counter
    parsed = []
    t_read = t_sniff = 0.0
    for p in sorted(folder.iterdir()):
        rel = p.name
        a = clock()
        sample = Sample.read(p)
        b = clock()
        ok = PROBE.sniff(sample)
        t_read += b - a
        t_sniff += clock() - b
        if ok:
            parsed.extend(PROBE.parse(p, rel, Hints.from_path(rel)))
    t_parse = time.perf_counter() - t0
    facts = F.empty_facts("loose", None)
    t1 = time.perf_counter()
    PROBE.build(parsed, facts)
    t_build = time.perf_counter() - t1
    out = {"parse_s": t_parse, "build_s": t_build, "read_sample_s": t_read, "sniff_s": t_sniff,
           "parse_only_s": t_parse - t_read - t_sniff}
elif mode == "phases":
    # the facts step again, each phase's CPU time summed through wrappers (they add about a
    # microsecond per call, so this total runs above the facts run's): where the step goes
    from collections import Counter
    from doctor.evidence import plugins, ticket
    acc = Counter()
    cpu = time.process_time
    def wrap(obj, attr, key):
        f = getattr(obj, attr)
        def timed(*a, **k):
            c = cpu()
            try:
                return f(*a, **k)
            finally:
                acc[key] += cpu() - c
        setattr(obj, attr, timed)
    probes = plugins.probes()
    acc["import probes"] = time.process_time() - c0
    for p in probes:
        wrap(p, "sniff", "sniff " + ("stacks" if p.name == "stacks" else "others"))
        if getattr(p, "also_sniff", None):
            wrap(p, "also_sniff", "sniff others")
        wrap(p, "parse", "parse " + p.name)
        wrap(p, "build", "build " + p.name)
    wrap(ticket, "is_document", "sniff others")
    wrap(F.Sample, "read", "Sample.read")
    c1 = cpu()
    items = F.items_from_folder(folder)
    acc["items_from_folder"] = cpu() - c1
    c1 = cpu()
    facts, _ = F.build(items, "loose")
    acc["dispatch loop"] = cpu() - c1 - sum(v for k, v in acc.items() if k not in ("import probes", "items_from_folder"))
    out = {f"{k.replace(' ', '_').replace('.', '_')}_s": v for k, v in acc.most_common()}
else:
    facts, timing = F.build(F.items_from_folder(folder), "loose")
    out = {"facts_s": time.perf_counter() - t0}
    if read_s is not None:
        out["read_s"] = read_s
        out["stacks_kind_s"] = timing.get("stacks", 0.0)
        out["other_s"] = out["facts_s"] - out["stacks_kind_s"]
    if mode == "rules":
        from doctor.engine import ruleset as engine
        rs = engine.load_ruleset()
        t1 = time.perf_counter()
        results, _ = engine.evaluate_all(rs, facts)
        out["rules_s"] = time.perf_counter() - t1
        out["fired"] = sorted(r.rule.id for r in results if r.status == "fired")
st = facts["stacks"]
out["total_s"] = time.perf_counter() - t0
out["cpu_s"] = time.process_time() - c0
out["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
out["n_ranks"] = st["n_ranks"]
out["groups"] = [(g["state"], g["op"], g["size"]) for g in st["groups"]]
print(json.dumps(out))
"""


def run(mode: str, folder: Path, code: Path = ROOT) -> dict:
    """One measurement in a fresh interpreter; ``code`` is the source tree whose doctor package
    runs (this checkout, or a baseline copy: it goes first on the path, and is the working
    directory)."""
    env = None
    if code != ROOT:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-c", CHILD, mode, str(folder)], capture_output=True, text=True, cwd=code, env=env)
    if r.returncode != 0:
        raise SystemExit(f"{mode} run failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _link_baseline(base: Path) -> None:
    """The installed package maps probes/, rules/ and playbooks/ under doctor/; a plain copy of
    the tree needs the same names to import as a package from its path."""
    for sub in ("probes", "rules", "playbooks"):
        link = base / "doctor" / sub
        if not link.exists() and (base / sub).is_dir():
            link.symlink_to(Path("..") / sub)


def _medians(runs: list[dict]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0] if k.endswith(("_s", "_mib"))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ranks", nargs="?", type=int, default=16384)
    ap.add_argument("--runs", type=int, default=3, help="runs per median (each in a fresh interpreter)")
    ap.add_argument("--baseline", type=Path, help="a copy of the code to time the same way, interleaved")
    ap.add_argument("--modes", default="stacks,facts,rules", help="comma-separated: stacks, facts, rules")
    args = ap.parse_args()
    base = args.baseline.resolve() if args.baseline else None
    if base is not None:
        _link_baseline(base)
    with tempfile.TemporaryDirectory(prefix="mldoctor-bench-stacks-") as tmp:
        folder = Path(tmp)
        kinds = replicate(folder, args.ranks)
        size = sum(p.stat().st_size for p in folder.iterdir()) / 2**20
        print(f"{args.ranks} ranks of replicated real dumps ({size:.0f} MiB): {kinds}")
        for mode in args.modes.split(","):
            runs, base_runs = [], []
            for _ in range(args.runs):  # interleaved: load on the machine hits both alike
                runs.append(run(mode, folder))
                if base is not None:
                    base_runs.append(run(mode, folder, base))
            med = _medians(runs)
            line = ", ".join(f"{k} {v:.2f}" for k, v in med.items())
            if "read_s" in med:
                line += f"; facts / raw read {med['facts_s'] / med['read_s']:.1f}x"
            print(f"{mode:6s} median of {args.runs}: {line}; n_ranks {runs[0]['n_ranks']}; "
                  f"groups {runs[0]['groups']}" + (f"; fired {runs[0]['fired']}" if "fired" in runs[0] else ""))
            if base_runs:
                bmed = _medians(base_runs)
                ratios = ", ".join(f"{k} {bmed[k]:.2f} -> {med[k]:.2f} ({med[k] / bmed[k]:.2f}x)"
                                   for k in med if k in bmed and bmed[k] > 0 and not k.endswith("_mib"))
                same = "same" if (base_runs[0]["groups"], base_runs[0].get("fired")) == (runs[0]["groups"], runs[0].get("fired")) \
                    else f"DIFFERENT: {base_runs[0]['groups']} {base_runs[0].get('fired')}"
                print(f"{'':6s} baseline {base} median of {args.runs}: {ratios}; groups and fired rules {same}")
        load = f"{os.getloadavg()[0]:.2f}"  # the one-minute figure, as procfs.loadavg prints it
        print(f"targets: stacks total < 3 s, facts step < 2 s, rss < 2048 MiB (read_s: every file read "
              f"whole once more, warm, in the same process just before the facts step; stacks_kind_s: the "
              f"stacks files' reads, dispatch and parses plus its build, other_s the rest of the facts step; "
              f"the stacks run's read_sample_s, sniff_s and parse_only_s split its parse_s; the phases run "
              f"(--modes phases) sums CPU per phase through wrappers; cpu_s is the "
              f"process's CPU time; load average now {load} on {os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
