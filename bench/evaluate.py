"""The evaluation suite: how often mldoctor is right, how fast, and against what users have otherwise.

One command regenerates docs/benchmarks.md (tables + the commands that produced them):

    . /tmp/venv/bin/activate
    python bench/evaluate.py                 # accuracy on every case of bench/cases (offline, ~1 min)
    python bench/evaluate.py --cli           # ... also times the real CLI per case (a new process each)
    python bench/evaluate.py --live          # + real jobs with injected faults, diagnosed live (minutes)
    python bench/evaluate.py --scale         # + CLI start, 1k/4k/16k-rank stacks, 1k-rank flight recorder
    python bench/evaluate.py --other         # + the other bench/*.py scripts' own output
    python bench/run_all.py                  # all of the above (the full human run)

A case is a folder ``bench/cases/<name>/`` holding ``truth.yaml`` (the label) and either the
evidence files themselves (public-thread cases) or ``evidence:`` pointing at a captured fixture
folder. The label never reaches the code under test: each case's evidence is copied into a
scratch folder without ``truth.yaml`` and README files before it is diagnosed.

Scoring, per case (the first finding is what a user acts on):
  - top-1 / top-3: the cause (or one of ``also_acceptable``) is the first / among the first three
    findings; healthy cases have no cause and are right when no finding is medium or above;
  - culprit ranks: the first finding's ranks against ``culprit_ranks`` (only where the label names
    ranks); precision and recall are summed over those cases;
  - right: top-1 and (where ranks are labelled) exactly the labelled ranks;
  - time to verdict: ``diagnose_path`` in this process (median of --repeat), and with --cli the
    wall time of ``python -m doctor.cli diagnose --from DIR --json``.

Parts not re-run keep their last results: the numbers live in a JSON block at the end of the
generated document. Timings are medians but the machine they ran on may have been busy; re-run on
a quiet machine before quoting them. Nothing here asserts timings (tests/test_evaluate.py asserts
the per-case accuracy of the cases labelled ``expect_pass: true``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import fnmatch
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
CASES = BENCH / "cases"
DOC = ROOT / "docs" / "benchmarks.md"
STATES = ("hung", "crashed", "slow", "diverging", "healthy", "unknown")
ALARM = ("critical", "high", "medium")  # "medium+" findings: a false alarm on a healthy case
NOT_EVIDENCE = ("truth.yaml", "README.md", "README")
FR_FILE = re.compile(r"^(?:_dump_|fr_rank|fr_trace_rank)(\d+)(?:\.pkl|\.json)?$")

for p in (ROOT, BENCH):  # bench/*.py are scripts, imported here by file name
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import sealed  # noqa: E402  (bench/sealed.py: the sealed split's rules)
from evaluate_doc import DATA_MARK, _f, _host, _pct, render  # noqa: E402
from scoring import KINDS, ORIGINS, _med, _said, seen_by_rules, summarize, summarize_sealed  # noqa: E402

# --------------------------------------------------------------------------- cases


@dataclass
class Case:
    """One labelled case: where its evidence is and what the right diagnosis is."""

    name: str
    folder: Path
    truth: dict[str, Any]

    @property
    def evidence(self) -> Path:
        ev = self.truth.get("evidence")
        return (ROOT / ev) if ev else self.folder

    @property
    def kind(self) -> str:
        return self.truth["kind"]

    @property
    def cause(self) -> str | None:
        return self.truth.get("cause")

    @property
    def accepted(self) -> set[str]:
        return {self.cause, *self.truth.get("also_acceptable", [])} - {None}

    @property
    def culprits(self) -> list[int]:
        return sorted(self.truth.get("culprit_ranks") or [])


def load_cases(root: Path = CASES, patterns: list[str] | None = None) -> list[Case]:
    """Every ``<root>/*/truth.yaml``, validated (a bad label is an error here, not a silent miss)."""
    from doctor.engine import taxonomy

    known = set(taxonomy.causes())
    cases = []
    for tf in sorted(root.glob("*/truth.yaml")):
        name = tf.parent.name
        if patterns and not any(fnmatch.fnmatch(name, p) for p in patterns):
            continue
        t = yaml.safe_load(tf.read_text())
        if t.get("truth_from"):  # a fixture that carries its own label (e.g. tests/fixtures/slow/*/truth.yaml)
            base = yaml.safe_load((ROOT / t["truth_from"]).read_text())
            for key in ("state", "cause", "culprit_ranks", "also_acceptable"):
                t.setdefault(key, base.get(key))
        case = Case(name, tf.parent, t)
        problems = []
        if t.get("kind") not in KINDS:
            problems.append(f"kind {t.get('kind')!r} not in {KINDS}")
        if t.get("state") not in STATES:
            problems.append(f"state {t.get('state')!r} not in {STATES}")
        if t.get("origin") not in ORIGINS:
            problems.append(f"origin {t.get('origin')!r} not in {ORIGINS}")
        for c in [t.get("cause"), *t.get("also_acceptable", [])]:
            if c is not None and c not in known:
                problems.append(f"unknown cause id {c!r}")
        if (t.get("cause") is None) != (t.get("kind") == "healthy"):
            problems.append("healthy cases (and only they) have cause: null")
        if not case.evidence.exists():
            problems.append(f"evidence {case.evidence} does not exist")
        if t.get("origin") == "public" and not str(t.get("source", "")).startswith("https://"):
            problems.append("a public case needs its thread URL in source:")
        if sealed.is_sealed(name) and not (t.get("batch") and t.get("origin") == "public"):
            problems.append("a sealed case is public and names its batch")
        if sealed.is_sealed(name) and t.get("expect_pass") is not False:
            problems.append("a sealed case is judged in aggregate only: expect_pass must be false")
        if not isinstance(t.get("expect_pass"), bool):
            problems.append("expect_pass must be true or false")
        if problems:
            raise ValueError(f"{tf.relative_to(ROOT)}: " + "; ".join(problems))
        cases.append(case)
    return cases


def stage(case: Case, dest: Path) -> Path:
    """Copy the case's evidence (never its label or README) to ``dest``; returns what to diagnose."""
    src = case.evidence
    if src.is_file():
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dest / src.name)
        return dest / src.name
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns(*NOT_EVIDENCE))
    return dest


# --------------------------------------------------------------------------- running mldoctor


@dataclass
class Outcome:
    """What mldoctor said about one case, and how long it took."""

    state: str = "unknown"
    top: list[dict[str, Any]] = field(default_factory=list)  # first 3 findings: cause, severity, ranks
    alarms: int = 0  # findings of medium or above
    kinds: list[str] = field(default_factory=list)
    seconds: float = float("nan")
    cli_seconds: float | None = None
    error: str = ""


def _summarize(rep: dict[str, Any]) -> Outcome:
    fs = rep.get("findings", [])
    return Outcome(
        state=rep.get("verdict", {}).get("state", "unknown"),
        top=[{"cause": f["cause"], "severity": f["severity"], "ranks": sorted(f.get("ranks") or [])} for f in fs[:3]],
        alarms=sum(f["severity"] in ALARM for f in fs),
        kinds=list(rep.get("evidence", {}).get("kinds", [])),
    )


def diagnose_inprocess(path: Path, repeat: int = 1) -> Outcome:
    from doctor.engine.diagnose import diagnose_path
    from doctor.evidence.errors import RuleError, UserError

    times, rep = [], None
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        try:
            rep = diagnose_path(path).to_json()
        except (UserError, RuleError) as exc:
            return Outcome(error=str(exc), seconds=time.perf_counter() - t0)
        times.append(time.perf_counter() - t0)
    out = _summarize(rep or {})
    out.seconds = statistics.median(times)
    return out


def diagnose_cli(path: Path, repeat: int = 1, timeout: float = 300) -> tuple[float, dict[str, Any] | None, str]:
    """The real CLI in a new process: (median wall seconds, its JSON report, error)."""
    times, rep, err = [], None, ""
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "doctor.cli", "diagnose", "--from", str(path), "--json"],
                             capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        times.append(time.perf_counter() - t0)
        try:
            rep = json.loads(res.stdout)
        except ValueError:
            err = f"rc={res.returncode}: {(res.stderr.strip().splitlines() or [''])[-1][:160]}"
    return statistics.median(times), rep, err


def score(case: Case, out: Outcome) -> dict[str, Any]:
    """Right or wrong, per the module docstring."""
    causes = [f["cause"] for f in out.top]
    s: dict[str, Any] = {"state_ok": out.state == case.truth["state"]}
    if case.cause is None:
        s.update(top1=None, top3=None, false_alarm=out.alarms > 0, right=out.alarms == 0 and not out.error)
    else:
        s["top1"] = bool(causes) and causes[0] in case.accepted
        s["top3"] = any(c in case.accepted for c in causes)
        s["false_alarm"] = None
        s["right"] = s["top1"]
    got = set(out.top[0]["ranks"]) if out.top else set()
    want = set(case.culprits)
    if want:
        s.update(tp=len(got & want), fp=len(got - want), fn=len(want - got), ranks_ok=got == want)
        s["right"] = bool(s["right"]) and s["ranks_ok"]
    else:
        s.update(tp=0, fp=0, fn=0, ranks_ok=None)
    return s


# --------------------------------------------------------------------------- alternatives


_PROC = re.compile(r"^Process \d+:", re.M)
_THREAD = re.compile(r'^Thread (\S+) \((\w+)\)(?:: "([^"]*)")?')


def pyspy_main_stacks(folder: Path) -> list[tuple[str, ...]]:
    """The main-thread stack of every process in the raw py-spy dumps under ``folder`` (text and
    --json), read independently of mldoctor's parser: what a human has to read without it."""
    stacks: list[tuple[str, ...]] = []
    for p in sorted(folder.rglob("*")):
        if not p.is_file() or p.name in NOT_EVIDENCE or p.stat().st_size > 32 * 2**20:
            continue
        text = p.read_text(errors="replace")
        if p.suffix == ".json" and text.lstrip().startswith("["):
            with contextlib.suppress(ValueError, TypeError, KeyError):
                threads = json.loads(text)
                main = next((t for t in threads if t.get("thread_name") == "MainThread"), None)
                if main is not None:
                    stacks.append(tuple(f"{f['name']} ({f.get('short_filename') or f['filename']}:{f['line']})"
                                        for f in main["frames"]))
            continue
        if "Thread " not in text or '"MainThread"' not in text:
            continue
        blocks = _PROC.split(text) if _PROC.search(text) else [text]
        for block in blocks:
            frames: list[str] | None = None
            for line in block.splitlines():
                m = _THREAD.match(line)
                if m:
                    if frames is not None:
                        break
                    if m.group(3) == "MainThread":
                        frames = []
                    continue
                if frames is not None:
                    if line.startswith("    ") and not line.startswith("        "):
                        frames.append(line.strip())
                    elif line.strip() and not line.startswith(" "):
                        break
            if frames:
                stacks.append(tuple(frames))
    return stacks


def fr_files(folder: Path) -> dict[int, Path]:
    return {int(m.group(1)): p for p in folder.rglob("*") if p.is_file() and (m := FR_FILE.match(p.name))}


def torchfrtrace(case: Case, staged: Path, timeout: float = 300) -> dict[str, Any] | None:
    """torch's own flight-recorder analyzer on the case's dumps (renamed ``_dump_<rank>``, the
    naming its help asks for): time, crash, and whether its "missing ranks" name the culprits."""
    from bench_fr import run_torchfrtrace

    dumps = fr_files(staged if staged.is_dir() else staged.parent)
    if not dumps:
        return None
    with tempfile.TemporaryDirectory(prefix="mldoctor-eval-fr-") as tmp:
        for rank, p in dumps.items():
            shutil.copy(p, Path(tmp) / f"_dump_{rank}")
        res = run_torchfrtrace(Path(tmp), timeout)  # (seconds, crashed, named ranks, error)
        secs, crashed, named, err = res[0], res[1], res[2], res[3]
    want = set(case.culprits)
    return {"seconds": secs, "dumps": len(dumps), "crashed": crashed, "error": err, "named": sorted(named),
            "names_culprits": bool(want) and want <= named, "extra": len(named - want)}


# --------------------------------------------------------------------------- the accuracy run


def evaluate(cases: list[Case], repeat: int = 1, cli: bool = False, alternatives: bool = True,
             progress: bool = False, cli_repeat: int = 1) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="mldoctor-eval-") as tmp:
        for i, case in enumerate(cases):
            path = stage(case, Path(tmp) / case.name)
            out = diagnose_inprocess(path, repeat)
            if cli:
                out.cli_seconds, rep, err = diagnose_cli(path, cli_repeat)
                if rep is not None and not out.error and _summarize(rep).top != out.top:
                    out.error = "the CLI's findings differ from the in-process run"
                out.error = out.error or err
            row: dict[str, Any] = {
                "case": case.name, "kind": case.kind, "origin": case.truth["origin"],
                "sealed": sealed.is_sealed(case.name), "batch": case.truth.get("batch", ""),
                "ticket": bool(case.truth.get("ticket")), "red_herring": bool(case.truth.get("red_herring")),
                "truth": {"state": case.truth["state"], "cause": case.cause, "evidence": case.truth.get("evidence", ""),
                          "also": case.truth.get("also_acceptable", []), "ranks": case.culprits},
                "source": case.truth.get("source", ""), "expect_pass": case.truth["expect_pass"],
                "note": case.truth.get("note", ""), "diagnosis": case.truth.get("diagnosis", ""),
                "seen_by_rules": case.truth["origin"] == "public" and seen_by_rules(case.truth.get("source", ""),
                                                                                    case.truth.get("evidence", "")),
                "got": {"state": out.state, "top": out.top, "alarms": out.alarms, "kinds": out.kinds},
                "seconds": out.seconds, "cli_seconds": out.cli_seconds, "error": out.error,
                **score(case, out),
            }
            if alternatives:
                groups = pyspy_main_stacks(path if path.is_dir() else path.parent)
                row["pyspy"] = {"dumps": len(groups), "groups": len(set(groups))} if groups else None
                row["torchfrtrace"] = torchfrtrace(case, path)
            rows.append(row)
            if progress and row["sealed"]:  # aggregate only: a sealed miss is not to be looked up
                print(f"[{i + 1}/{len(cases)}] (sealed case)", file=sys.stderr, flush=True)
            elif progress:
                mark = "ok " if row["right"] else "MISS"
                print(f"[{i + 1}/{len(cases)}] {mark} {case.name}: {_said(row)} ({out.seconds:.2f} s)",
                      file=sys.stderr, flush=True)
    return rows


def record_first_run(cases: list[Case]) -> str:
    """Run mldoctor once on each sealed case that has no ``first_run`` yet and append what it said
    to the case's truth.yaml (as text: the label above stays exactly as written). Returns a
    one-line aggregate; the per-case answers stay in the files."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "doctor", "probes", "rules", "playbooks"],
                           cwd=ROOT, capture_output=True, text=True).stdout.strip()
    commit = head[:12] + (" + uncommitted changes" if dirty else "")
    done = []
    with tempfile.TemporaryDirectory(prefix="mldoctor-first-run-") as tmp:
        for case in cases:
            if not sealed.is_sealed(case.name) or case.truth.get("first_run"):
                continue
            out = diagnose_inprocess(stage(case, Path(tmp) / case.name))
            sc = score(case, out)
            block = {"date": dt.date.today().isoformat(), "commit": commit, "state": out.state,
                     "top": [f["cause"] for f in out.top], "top1": sc["top1"], "top3": sc["top3"],
                     "right": bool(sc["right"])}
            text = (case.folder / "truth.yaml").read_text()
            text = text.rstrip("\n") + "\n# recorded by bench/evaluate.py --record-first-run when the case was added; never edit\n"
            text += yaml.safe_dump({"first_run": block}, sort_keys=False, default_flow_style=None)
            (case.folder / "truth.yaml").write_text(text)
            done.append(sc)
    faults = [d for d in done if d["top1"] is not None]
    return (f"recorded {len(done)} first runs: top-1 {sum(bool(d['top1']) for d in faults)}/{len(faults)}, "
            f"top-3 {sum(bool(d['top3']) for d in faults)}/{len(faults)}, right {sum(bool(d['right']) for d in done)}/{len(done)}")


# --------------------------------------------------------------------------- live and scale


def _rank_pids(launcher: int) -> dict[int, int]:
    """Rank -> pid of a running torchrun job (a process whose parent is a rank is a worker)."""
    from doctor.evidence import procfs
    from doctor.live import demo

    ranks: dict[int, int] = {}
    for pid in demo.descendants(launcher):
        env, stat = procfs.environ(pid) or {}, procfs.stat(pid)
        rank = env.get("RANK", "")
        if rank.isdigit() and stat and int(stat[1]) not in ranks.values():
            ranks.setdefault(int(rank), pid)
    return ranks


LIVE_SCENARIOS = ("extra_collective", "lock_self", "checkpoint_io", "dataloader_hang", "init_hang",
                  "rank0_exclusive", "slow_rank", "cpu_oversubscription", "healthy")


def live(scenarios: tuple[str, ...] = LIVE_SCENARIOS, ranks: list[int] | None = None, repeat: int = 3) -> dict[str, Any]:
    """Real jobs with injected faults: mldoctor live vs py-spy alone, then time to verdict at scale."""
    import bench_live

    from doctor.live import demo
    from doctor.scenarios import SCENARIOS

    rows = []
    for name in scenarios:
        sc = SCENARIOS[name]
        with tempfile.TemporaryDirectory(prefix="mldoctor-eval-live-") as tmp:
            proc, log = demo.start(name, Path(tmp))
            row: dict[str, Any] = {"scenario": name, "state": sc.state, "cause": sc.cause,
                                   "culprits": list(sc.culprit_ranks)}
            try:
                row["job"] = demo.wait_until_stuck(proc, log, name)
                # what a human gets from py-spy alone: one dump per rank, read by eye
                pids = _rank_pids(proc.pid)
                t0 = time.perf_counter()
                dumps = Path(tmp) / "pyspy"
                dumps.mkdir()
                for rank, pid in sorted(pids.items()):
                    res = subprocess.run(["py-spy", "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
                    (dumps / f"pyspy-rank{rank}.txt").write_text(res.stdout)
                row["pyspy_s"] = time.perf_counter() - t0
                groups = pyspy_main_stacks(dumps)
                row["pyspy_groups"] = len(set(groups))
                row["pyspy_dumps"] = len(groups)
                t0 = time.perf_counter()
                res = subprocess.run([sys.executable, "-m", "doctor.cli", "diagnose", "--pid", str(proc.pid), "--json",
                                      "--logs", str(log)], capture_output=True, text=True, timeout=300, cwd=ROOT)
                row["seconds"] = time.perf_counter() - t0
                try:
                    out = _summarize(json.loads(res.stdout))
                    row.update(got_state=out.state, top=out.top, alarms=out.alarms)
                except ValueError:
                    row.update(got_state="error", top=[], alarms=0, error=res.stderr.strip()[-200:])
            finally:
                demo.stop(proc)
            top = row.get("top") or []
            accepted = {sc.cause, *sc.also_acceptable} - {None}
            if sc.cause is None:
                row["right"] = row.get("alarms", 0) == 0
            else:
                row["right"] = bool(top) and top[0]["cause"] in accepted and (
                    not sc.culprit_ranks or set(top[0]["ranks"]) == set(sc.culprit_ranks))
            rows.append(row)
            print(f"live {name}: {'ok' if row['right'] else 'MISS'} {row.get('top')}", file=sys.stderr, flush=True)
    scaling = ""
    if ranks:
        buf = io.StringIO()
        old = sys.argv
        sys.argv = ["bench_live.py", "--ranks", *map(str, ranks), "--repeat", str(repeat)]
        try:
            with contextlib.redirect_stdout(buf):
                bench_live.main()
        except Exception as exc:  # a failed scaling run is reported, the accuracy rows are kept
            buf.write(f"\nbench_live failed: {type(exc).__name__}: {exc}\n")
        finally:
            sys.argv = old
        scaling = buf.getvalue()
    return {"rows": rows, "scaling": scaling, "scaling_ranks": ranks or []}


_RSS_WRAP = ("import resource, subprocess, sys\n"
             "r = subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
             "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n"
             "sys.exit(r.returncode)\n")


def measured(cmd: list[str], timeout: float = 900) -> tuple[float, float, int]:
    """(wall seconds, peak RSS MiB, exit code) of a command run in a fresh process."""
    with tempfile.NamedTemporaryFile(prefix="mldoctor-rss-", delete=False) as fh:
        out = fh.name
    try:
        t0 = time.perf_counter()
        try:
            rc = subprocess.run([sys.executable, "-c", _RSS_WRAP, out, *cmd], timeout=timeout, cwd=ROOT).returncode
        except subprocess.TimeoutExpired:
            return time.perf_counter() - t0, float("nan"), 124
        secs = time.perf_counter() - t0
        rss = int(Path(out).read_text() or 0) / 1024
        return secs, rss, rc
    finally:
        os.unlink(out)


def scale(repeat: int = 3, stack_ranks: tuple[int, ...] = (1024, 4096, 16384), fr_copies: int = 64) -> dict[str, Any]:
    """CLI start; offline analysis of replicated real evidence at scale, with memory peaks."""
    import bench_core
    import bench_fr
    import bench_stacks

    res: dict[str, Any] = {}
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        bench_core.bench_help(max(5, repeat * 2 + 1))
    res["cli_start"] = buf.getvalue().strip()

    stacks = []
    for n in stack_ranks:
        with tempfile.TemporaryDirectory(prefix="mldoctor-eval-stacks-") as tmp:
            folder = Path(tmp)
            bench_stacks.replicate(folder, n)
            mib = sum(p.stat().st_size for p in folder.iterdir()) / 2**20
            inner = [bench_stacks.run("rules", folder) for _ in range(repeat)]
            cli = [measured([sys.executable, "-m", "doctor.cli", "diagnose", "--from", str(folder), "--json"])
                   for _ in range(repeat)]
            raw = pyspy_main_stacks(folder)
            stacks.append({
                "ranks": n, "mib": mib, "facts_s": _med([r["facts_s"] for r in inner]),
                "rules_s": _med([r["rules_s"] for r in inner]), "inner_rss": _med([r["rss_mib"] for r in inner]),
                "cli_s": _med([c[0] for c in cli]), "cli_rss": _med([c[1] for c in cli]),
                "cli_rc": cli[-1][2], "groups": len(inner[0]["groups"]), "raw_groups": len(set(raw)),
            })
            print(f"scale stacks {n}: {stacks[-1]}", file=sys.stderr, flush=True)
    res["stacks"] = stacks

    fr = []
    with tempfile.TemporaryDirectory(prefix="mldoctor-eval-fr-") as tmp:
        cases = [(name, bench_fr.NVRX / name, bench_fr.TRUTH[name]) for name in sorted(bench_fr.TRUTH)]
        big = Path(tmp) / "big"
        truth = bench_fr.replicate(bench_fr.NVRX / "lock_gil_2nd", big, fr_copies)
        cases.append((f"lock_gil_2nd x{fr_copies}", big, truth))
        for name, folder, want in cases:
            ours = [measured([sys.executable, "-m", "doctor.cli", "diagnose", "--from", str(folder), "--json"])
                    for _ in range(repeat)]
            ours_fr = [bench_fr.run_ours_inprocess(folder) for _ in range(repeat)]
            tf_runs = 1 if folder == big else repeat  # as bench_fr.py: torchfrtrace is slow at 1k ranks
            theirs = [measured([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder)])
                      for _ in range(tf_runs)]
            tf = bench_fr.run_torchfrtrace(folder, 900)  # (seconds, crashed, named ranks, error)
            crashed, named, err = tf[1], tf[2], tf[3]
            ours_run = bench_fr.run_ours(folder)  # (seconds, top ranks, top cause or error, ...)
            o_ranks, o_cause = ours_run[1], ours_run[2]
            fr.append({
                "case": name, "ranks": len(list(folder.glob("_dump_*"))), "culprits": len(want),
                "ours_s": _med([o[0] for o in ours]), "ours_rss": _med([o[1] for o in ours]),
                "ours_fr_s": _med(ours_fr), "ours_ok": set(o_ranks) == want, "ours_cause": o_cause,
                "tf_s": _med([t[0] for t in theirs]), "tf_rss": _med([t[1] for t in theirs]),
                "tf_runs": tf_runs, "tf_crashed": crashed, "tf_error": err, "tf_names": len(want & named), "tf_extra": len(named - want),
            })
            print(f"scale fr {name}: {fr[-1]}", file=sys.stderr, flush=True)
    res["fr"] = fr
    return res


OTHER = [("bench_core.py", []), ("bench_logs.py", ["--mib", "32", "--runs", "3"]), ("bench_metrics.py", []),
         ("bench_gpu.py", []), ("bench_tui.py", []), ("bench_traindoctor.py", []),
         ("bench_slow.py", ["--repeats", "3"]), ("bench_stacks.py", ["16384"]),
         ("bench_ticket.py", ["--runs", "5"])]


def other_benches(timeout: float = 900) -> list[dict[str, Any]]:
    """The other bench scripts, run as their authors wrote them; their printed output is kept."""
    out = []
    for script, args in OTHER:
        path = BENCH / script
        if not path.exists():
            out.append({"script": script, "missing": True, "output": ""})
            continue
        t0 = time.perf_counter()
        try:
            res = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
            text = res.stdout.strip() + (f"\n(exit {res.returncode}: {res.stderr.strip()[-300:]})" if res.returncode else "")
        except subprocess.TimeoutExpired:
            text = f"(timed out after {timeout:.0f} s)"
        out.append({"script": script, "args": args, "seconds": time.perf_counter() - t0, "output": text})
        print(f"other {script}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return out


def load_data(path: Path = DOC) -> dict[str, Any]:
    """The results of the last runs, kept in the document's data block."""
    if not path.exists():
        return {}
    m = re.search(r"<!-- " + DATA_MARK + r"\n(.*?)\n-->", path.read_text(), re.S)
    if not m:
        return {}
    try:
        return json.loads(m.group(1))
    except ValueError:
        return {}


def _stamp(command: str) -> dict[str, str]:
    return {"command": command, "when": dt.datetime.now().strftime("%Y-%m-%d %H:%M"), "host": _host()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="*", help="only cases whose folder name matches these glob patterns")
    ap.add_argument("--repeat", type=int, default=1, help="runs per case (median), and per scale measurement (default 3 there)")
    ap.add_argument("--cli", action="store_true", help="also time the real CLI per case (a new process each)")
    ap.add_argument("--cli-repeat", type=int, default=1, help="CLI runs per case with --cli (median)")
    ap.add_argument("--no-alternatives", action="store_true", help="skip py-spy stack counts and torchfrtrace")
    ap.add_argument("--live", action="store_true", help="run the live scenarios and bench_live's 4/8/16-rank timing")
    ap.add_argument("--live-ranks", type=int, nargs="*", default=[4, 8, 16])
    ap.add_argument("--scale", action="store_true", help="CLI start, 1k/4k/16k-rank stacks, 1k-rank flight recorder")
    ap.add_argument("--other", action="store_true", help="run the other bench/*.py scripts and keep their output")
    ap.add_argument("--skip-accuracy", action="store_true", help="keep the last accuracy results (with --live/--scale/--other)")
    ap.add_argument("--out", type=Path, default=DOC, help="the document to (re)write (default docs/benchmarks.md)")
    ap.add_argument("--json", type=Path, help="also write this run's accuracy rows as JSON here")
    ap.add_argument("--record-first-run", action="store_true",
                    help="run once on the (matching) sealed cases without a first_run and record it in their truth.yaml")
    args = ap.parse_args(argv)

    cmd = "python bench/evaluate.py " + " ".join(argv if argv is not None else sys.argv[1:])
    data = load_data(args.out)
    if args.record_first_run:
        print(record_first_run(load_cases(patterns=args.cases)), file=sys.stderr)
        return 0
    if not args.skip_accuracy:
        cases = load_cases(patterns=args.cases)
        rows = evaluate(cases, args.repeat, args.cli, not args.no_alternatives, progress=True, cli_repeat=args.cli_repeat)
        dev = [r for r in rows if not r["sealed"]]
        sealed_summary = summarize_sealed([r for r in rows if r["sealed"]], [c for c in cases if sealed.is_sealed(c.name)])
        summary = summarize(dev)
        if args.cases:  # a partial run: show it, keep the document's full results
            print(json.dumps({"dev": summary, "sealed": sealed_summary}, indent=1))
        else:
            import ticket_parity  # the same tickets with their blocks as files (bench/ticket_parity.py)

            prow = ticket_parity.run(None)
            parity = {"dev": ticket_parity.summarize([r for r in prow if not r["sealed"]]),
                      "sealed": ticket_parity.summarize([r for r in prow if r["sealed"]])}
            data["accuracy"] = {**_stamp(cmd.strip()), "rows": dev, "summary": summary, "sealed": sealed_summary,
                                "ticket_parity": parity}
        if args.json:
            args.json.write_text(json.dumps({"rows": dev, "summary": summary, "sealed": sealed_summary}, indent=1))
        if sealed_summary["n"]:
            ss = sealed_summary
            print(f"sealed: top-1 {_pct(ss['top1'])}, top-3 {_pct(ss['top3'])}, right {_pct(ss['right'])}, "
                  f"false alarms {_pct(ss['false_alarms'])} on {ss['n']} cases", file=sys.stderr)
        s = summary
        print(f"top-1 {_pct(s['top1'])}, top-3 {_pct(s['top3'])}, right {_pct(s['right'])}, "
              f"false alarms {_pct(s['false_alarms'])}, culprit P/R {_f(s['culprit_precision'])}/{_f(s['culprit_recall'])}; "
              f"regressions: {s['expect_pass_failing'] or 'none'}", file=sys.stderr)
    if args.live:
        data["live"] = {**_stamp(cmd.strip()), "results": live(ranks=args.live_ranks, repeat=max(args.repeat, 3))}
    if args.scale:
        data["scale"] = {**_stamp(cmd.strip()), "results": scale(repeat=max(args.repeat, 3))}
    if args.other:
        data["other"] = {**_stamp(cmd.strip()), "results": other_benches()}
    if not args.cases or args.live or args.scale or args.other:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(render(data))
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
