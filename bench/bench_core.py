"""Core benchmarks: CLI start time and rule evaluation at scale.

Run: python bench/bench_core.py
Prints medians; nothing is asserted (targets: `mldoctor --help` < 0.25 s wall median without
importing torch/pandas/textual; 200 rules over a 1,024-rank job's facts < 50 ms).

The 200 rules are the shipped rule pack copied under new ids until there are 200 (so they are
real conditions, not trivial ones); the facts are built by the real parsers from real captured
evidence (the rank env dumps and, where present, the stack dumps of tests/fixtures/evidence)
replicated to 1,024 ranks with renumbered ranks.
"""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def bench_help(n: int = 11) -> None:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "doctor.cli", "--help"], capture_output=True, check=True)
        times.append(time.perf_counter() - t0)
    base = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], capture_output=True, check=True)
        base.append(time.perf_counter() - t0)
    code = ("import sys; sys.argv=['mldoctor','--help']\nfrom doctor import cli\n"
            "try:\n    cli.app()\nexcept SystemExit:\n    pass\n"
            "print([m for m in ('torch','pandas','textual') if m in sys.modules])")
    heavy = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    med, bmed = statistics.median(times), statistics.median(base)
    print(f"mldoctor --help: median {med * 1000:.0f} ms over {n} runs (bare python: {bmed * 1000:.0f} ms, "
          f"ratio {med / bmed:.1f}x); heavy modules imported: {heavy}")


def replicate_evidence(dest: Path, ranks: int) -> None:
    """Copy real per-rank evidence files to ``ranks`` ranks, renumbering rank in name and content."""
    sources = sorted((ROOT / "tests/fixtures/env_capture/slow_transport").glob("environ-rank*"))
    stacks = sorted((ROOT / "tests/fixtures/evidence/extra_collective").glob("pyspy-rank*.txt"))
    for r in range(ranks):
        src = sources[r % len(sources)]
        data = re.sub(rb"(?m)(^|\x00)RANK=\d+", rb"\1RANK=" + str(r).encode(), src.read_bytes())
        data = re.sub(rb"WORLD_SIZE=\d+", b"WORLD_SIZE=" + str(ranks).encode(), data)
        (dest / f"environ-rank{r}").write_bytes(data)
        if stacks:
            shutil.copy(stacks[r % len(stacks)], dest / f"pyspy-rank{r}.txt")


def make_rules(dest: Path, count: int) -> dict[str, str]:
    """Copy the shipped rules under new ids until there are ``count``; returns copy id -> original id."""
    files = sorted(p for p in (ROOT / "rules").rglob("*.yaml") if not p.name.endswith(".test.yaml"))
    origin: dict[str, str] = {}
    while len(origin) < count:
        for f in files:
            if len(origin) >= count:
                break
            rid = f"BEN{len(origin):03d}"
            text = re.sub(r"(?m)^id: \S+", f"id: {rid}", f.read_text())
            (dest / f"{rid}.yaml").write_text(text)
            origin[rid] = f.stem
    return origin


def bench_rules(ranks: int = 1024, count: int = 200, repeat: int = 5) -> None:
    from doctor.engine import celexpr
    from doctor.engine import facts as facts_mod
    from doctor.engine import ruleset as engine
    from doctor.engine.rule import evaluate, load_rules

    with tempfile.TemporaryDirectory() as tmp:
        ev, rd = Path(tmp) / "ev", Path(tmp) / "rules"
        ev.mkdir()
        rd.mkdir()
        replicate_evidence(ev, ranks)
        t0 = time.perf_counter()
        facts, _ = facts_mod.build(facts_mod.items_from_folder(ev), "loose")
        t_facts = time.perf_counter() - t0
        schema = facts_mod.schema()
        ns = engine.namespaces_of(schema)
        origin = make_rules(rd, count)
        n = len(origin)
        t0 = time.perf_counter()
        rules = load_rules([rd], schema, ns)
        t_load = time.perf_counter() - t0
        used = engine.used_keys(rules, ns)
        times, ctx_times = [], []
        for _ in range(repeat):
            t0 = time.perf_counter()
            ctx = celexpr.context(facts, ns, used)
            ctx_times.append(time.perf_counter() - t0)
            results = [evaluate(r, ctx, facts) for r in rules]
            times.append(time.perf_counter() - t0)
        fired = sum(r.status == "fired" for r in results)
        per_rule = []
        for r in rules:
            t0 = time.perf_counter()
            evaluate(r, ctx, facts)
            per_rule.append((time.perf_counter() - t0, r.id, origin[r.id]))
        slow = sorted(per_rule, reverse=True)[:3]
        print(f"rules: {n} rules over the facts of {ranks} ranks ({facts['evidence']['files']} files, "
              f"kinds {facts['evidence']['kinds']}): median {statistics.median(times) * 1000:.1f} ms "
              f"per full evaluation, of which {statistics.median(ctx_times) * 1000:.1f} ms building the CEL "
              f"context ({fired} fired); facts built in {t_facts:.2f} s; rules loaded and compiled in "
              f"{t_load * 1000:.0f} ms; slowest: "
              + ", ".join(f"{rid} (copy of {name}) {t * 1000:.2f} ms" for t, rid, name in slow))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    bench_help()
    bench_rules()
