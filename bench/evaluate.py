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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_tables import render_checks  # noqa: E402 - the bench folder is not a package

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
CASES = BENCH / "cases"
DOC = ROOT / "docs" / "benchmarks.md"
KINDS = ("hang", "crash", "slow", "diverge", "healthy", "health-check")
STATES = ("hung", "crashed", "slow", "diverging", "healthy", "unknown")
ORIGINS = ("captured", "external", "public")
ALARM = ("critical", "high", "medium")  # "medium+" findings: a false alarm on a healthy case
NOT_EVIDENCE = ("truth.yaml", "README.md", "README")
DATA_MARK = "mldoctor-bench-data"
FR_FILE = re.compile(r"^(?:_dump_|fr_rank|fr_trace_rank)(\d+)(?:\.pkl|\.json)?$")

for p in (ROOT, BENCH):  # bench/*.py are scripts, imported here by file name
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import sealed  # noqa: E402  (bench/sealed.py: the sealed split's rules)

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


def seen_by_rules(url: str, evidence: str = "") -> bool:
    """Whether a public case was seen while the rules were written: its thread URL is cited in the
    rules, signatures, probes or playbooks, or its evidence file is a rule's test case."""
    needles = [n for n in (url.rstrip("/") if url.startswith("https://") else "", Path(evidence).name if evidence else "") if n]
    if not needles:
        return False
    for folder in ("rules", "probes/logs/patterns", "probes", "playbooks"):
        for p in (ROOT / folder).rglob("*"):
            if p.is_file() and p.suffix in (".yaml", ".py", ".md", ".txt", ".json"):
                with contextlib.suppress(OSError):
                    text = p.read_text(errors="replace")
                    if any(n in text for n in needles):
                        return True
    return False


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


def _said(row: dict[str, Any]) -> str:
    top = row["got"]["top"]
    if row.get("error") and not top:
        return f"error: {row['error']}"
    if not top:
        return "nothing wrong"
    return "; ".join(f"{f['cause']} ({f['severity']}{', ranks ' + _ranks(f['ranks']) if f['ranks'] else ''})"
                     for f in top)


def _ranks(r: list[int]) -> str:
    if not r:
        return "-"
    if len(r) > 6:
        return f"{','.join(map(str, r[:4]))},... ({len(r)})"
    return ",".join(map(str, r))


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    faults = [r for r in rows if r["truth"]["cause"] is not None]
    healthy = [r for r in rows if r["truth"]["cause"] is None]
    tp, fp, fn = (sum(r[k] for r in rows) for k in ("tp", "fp", "fn"))
    secs = [r["seconds"] for r in rows if r["seconds"] == r["seconds"]]

    def frac(xs: list[dict[str, Any]], key: str) -> tuple[int, int]:
        return sum(bool(r[key]) for r in xs), len(xs)

    by_kind = {}
    for kind in KINDS:
        ks = [r for r in rows if r["kind"] == kind]
        if ks:
            by_kind[kind] = {"n": len(ks), "right": frac(ks, "right")[0],
                             "top1": frac([r for r in ks if r["top1"] is not None], "top1"),
                             "top3": frac([r for r in ks if r["top3"] is not None], "top3")}
    by_origin = {}
    for origin in ORIGINS:
        os_ = [r for r in rows if r["origin"] == origin]
        if os_:
            by_origin[origin] = {"n": len(os_), "right": frac(os_, "right")[0]}
    unseen = [r for r in rows if r["origin"] == "public" and not r["seen_by_rules"]]
    return {
        "n": len(rows), "faults": len(faults), "healthy": len(healthy),
        "top1": frac(faults, "top1"), "top3": frac(faults, "top3"), "right": frac(rows, "right"),
        "culprit_precision": tp / (tp + fp) if tp + fp else None,
        "culprit_recall": tp / (tp + fn) if tp + fn else None,
        "culprit_cases": sum(bool(r["truth"]["ranks"]) for r in rows),
        "false_alarms": frac(healthy, "false_alarm"),
        "unseen_public": {"n": len(unseen), "right": frac(unseen, "right")[0],
                          "top1": frac([r for r in unseen if r["top1"] is not None], "top1")},
        "by_kind": by_kind, "by_origin": by_origin,
        "seconds_median": statistics.median(secs) if secs else None, "seconds_max": max(secs) if secs else None,
        "cli_median": (statistics.median(c) if (c := [r["cli_seconds"] for r in rows if r.get("cli_seconds")]) else None),
        "expect_pass_failing": [r["case"] for r in rows if r["expect_pass"] and not r["right"]],
        "unexpected_pass": [r["case"] for r in rows if not r["expect_pass"] and r["right"]],
    }


def summarize_sealed(rows: list[dict[str, Any]], cases: list[Case]) -> dict[str, Any]:
    """The sealed split in aggregate only (bench/sealed.py says why), with the first-sight figures
    each batch recorded when it was added next to today's."""
    s = summarize(rows)
    out = {k: s[k] for k in ("n", "faults", "healthy", "top1", "top3", "right", "false_alarms", "by_kind")}
    out["state_ok"] = [sum(bool(r["state_ok"]) for r in rows), len(rows)]
    tickets = [r for r in rows if r["ticket"] and r["top1"] is not None]
    out["tickets_top1"] = [sum(bool(r["top1"]) for r in tickets), len(tickets)]
    herrings = [r for r in rows if r["red_herring"]]
    out["red_herrings_alarmed"] = [sum(r["got"]["alarms"] > 0 for r in herrings if r["truth"]["cause"] is None), len(herrings)]
    batches: dict[str, dict[str, Any]] = {}
    for case in cases:
        fr = case.truth.get("first_run") or {}
        b = batches.setdefault(str(case.truth.get("batch", "?")), {"n": 0, "top1": [0, 0], "top3": [0, 0], "right": [0, 0]})
        b["n"] += 1
        for key in ("top1", "top3", "right"):
            if fr.get(key) is not None:
                b[key][0] += bool(fr[key])
                b[key][1] += 1
    out["batches_first_sight"] = batches
    out["miss_shapes"] = miss_shapes(rows)
    return out


def miss_shapes(rows: list[dict[str, Any]]) -> dict[str, int]:
    """How the wrong answers look, counted over the split: whether mldoctor read nothing at all,
    read evidence but named no cause, or named the wrong one. Aggregate only, so it guides general
    reading work (the first two are gaps in breadth, the last in reasoning) without pointing at a
    single case."""
    shapes = {"nothing_read": 0, "read_no_finding": 0, "wrong_cause": 0, "alarm_on_healthy": 0}
    for r in rows:
        if r["right"]:
            continue
        got = r["got"]
        if r["truth"]["cause"] is None:
            shapes["alarm_on_healthy"] += 1
        elif not got["kinds"]:
            shapes["nothing_read"] += 1
        elif not got["top"]:
            shapes["read_no_finding"] += 1
        else:
            shapes["wrong_cause"] += 1
    return shapes


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


def _med(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


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


# --------------------------------------------------------------------------- the document


def _pct(pair: tuple[int, int] | list[int]) -> str:
    a, b = pair
    return f"{a}/{b} ({100 * a / b:.0f} %)" if b else "-"


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None or x != x else fmt.format(x)


def _cell(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _host() -> str:
    from doctor.evidence import procfs

    load = procfs.loadavg()
    return f"{os.cpu_count()} cores, load average {load} when it started, Python {sys.version.split()[0]}"


def render(data: dict[str, Any]) -> str:
    acc = data.get("accuracy")
    L = ["# Benchmarks", "",
         "<!-- GENERATED by `python bench/evaluate.py` (see bench/evaluate.py); edit the generator, not this file. -->", "",
         "How often mldoctor is right, how fast, and next to what users would use otherwise, on the same inputs "
         "in the same run. Every number below comes from the command shown above its table; the machine was a "
         "shared, busy 2-core VM, so **timings are noisy: re-run on a quiet machine before quoting them** "
         "(accuracy does not depend on the machine).", "",
         "| part | command | last run |", "| --- | --- | --- |"]
    for key, cmd in (("accuracy", "python bench/evaluate.py [--cli]"), ("live", "python bench/evaluate.py --live"),
                     ("scale", "python bench/evaluate.py --scale"), ("other", "python bench/evaluate.py --other")):
        part = data.get(key)
        L.append(f"| {key} | `{part['command'] if part else cmd}` | "
                 f"{(part['when'] + ', ' + part['host']) if part else 'not run yet'} |")
    L += ["", "The full human run is `python bench/run_all.py` (all parts). CI runs the offline cases only "
          "(`tests/test_evaluate.py`): it fails when a case labelled `expect_pass: true` stops being right, never on timings.", ""]
    if acc:
        L += _render_accuracy(acc)
    if data.get("live"):
        L += _render_live(data["live"])
    if data.get("scale"):
        L += _render_scale(data["scale"])
    if data.get("other"):
        L += ["## Other bench scripts", "", f"`{data['other']['command']}` ran each script as its author wrote it:", ""]
        for o in data["other"]["results"]:
            if o.get("missing"):
                L += [f"### {o['script']}", "", "not in this tree yet (written by another engineer); re-run when it lands.", ""]
            else:
                L += [f"### {o['script']} {' '.join(o.get('args', []))}", "", "```", o["output"] or "(no output)", "```", ""]
    L += _render_coverage()
    L += render_checks()
    L += ["<!-- " + DATA_MARK, json.dumps(data, sort_keys=True), "-->", ""]
    return "\n".join(L)


def _render_coverage() -> list[str]:
    """Signature coverage of the harvested upstream message families, recomputed at every render
    (it depends only on the tree, not on a run): the same table `mldoctor rules coverage` prints."""
    from doctor.cli.main import coverage_table
    from doctor.evidence import plugins

    rows = [row for p in plugins.probes() for row in p.coverage()]
    if not rows:
        return []
    return ["## Signature coverage of the upstream message families", "",
            "Each family's message templates are harvested from its primary source (the upstream code or "
            "the vendor's documentation, `probes/logs/templates/*.yaml`, each with its `source:` and a "
            "concrete example line). A fault template counts as covered when its example, read by the "
            "real log scanner, yields an event of a specific (not catch-all) signature. Command: "
            "`mldoctor rules coverage` (`--missing` lists the uncovered templates, `--json` everything).", "",
            coverage_table(rows), ""]


def _render_accuracy(acc: dict[str, Any]) -> list[str]:
    rows = acc["rows"]
    for r in rows:  # recomputed: a rule written since the run may cite a case's thread now
        if r["origin"] == "public":
            r["seen_by_rules"] = seen_by_rules(r["source"], r["truth"].get("evidence", ""))
    s = acc["summary"] = summarize(rows)
    L = ["## Accuracy", "",
         f"`{acc['command']}` on {s['n']} cases of `bench/cases/` ({s['faults']} with a fault, {s['healthy']} healthy). "
         "Each case is a folder with its label (`truth.yaml`: cause, acceptable alternatives, culprit ranks, state, "
         "source) and its evidence, or a pointer to a captured fixture; the label is never copied next to the "
         "evidence mldoctor reads. Top-1/top-3 count fault cases; culprit precision/recall use the first finding's "
         "ranks on cases whose label names ranks; a false alarm is a medium-or-higher finding on a healthy case.", "",
         "| measure | value |", "| --- | --- |",
         f"| top-1 accuracy | {_pct(s['top1'])} |", f"| top-3 accuracy | {_pct(s['top3'])} |",
         f"| right (top-1 and exact culprit ranks; healthy: no alarm) | {_pct(s['right'])} |",
         f"| culprit-rank precision / recall ({s['culprit_cases']} cases with ranks) | "
         f"{_f(s['culprit_precision'], '{:.2f}')} / {_f(s['culprit_recall'], '{:.2f}')} |",
         f"| false alarms on healthy cases | {_pct(s['false_alarms'])} |",
         f"| public-thread cases not seen while writing rules | right {s['unseen_public']['right']}/{s['unseen_public']['n']}, "
         f"top-1 {_pct(s['unseen_public']['top1'])} |",
         f"| time to verdict, in-process, warm (median / max over cases) | {_f(s['seconds_median'])} s / {_f(s['seconds_max'])} s |",
         f"| time to verdict, CLI end to end (median) | {_f(s['cli_median'])} s |" if s.get("cli_median") else
         "| time to verdict, CLI end to end | run with `--cli` |", "",
         "| kind | cases | right | top-1 | top-3 |", "| --- | --- | --- | --- | --- |"]
    for kind, k in s["by_kind"].items():
        L.append(f"| {kind} | {k['n']} | {k['right']} | {_pct(k['top1']) if k['top1'][1] else '-'} | "
                 f"{_pct(k['top3']) if k['top3'][1] else '-'} |")
    L += ["", "| origin | cases | right |", "| --- | --- | --- |"]
    L += [f"| {o} | {v['n']} | {v['right']} |" for o, v in s["by_origin"].items()]
    L += ["", "Origins: *captured* = real jobs run for this project (CPU gloo jobs, one H200, a local SLURM "
          "cluster); *external* = NVIDIA's fault-injection flight-recorder dumps (labels from their "
          "`fault_injection.log`); *public* = evidence lines that reporters posted in public issue threads, "
          "labelled with the diagnosis given there (URL per case). A public case counts as *seen while writing rules* "
          "(\"cited by a rule\" below) when its URL appears in rules/, probes/logs/patterns/, probes/ or playbooks/, or its "
          "evidence file is a rule's test case.", ""]
    L += _render_sealed(acc.get("sealed") or {})
    misses = [r for r in rows if not r["right"]]
    L += ["### Misses", ""]
    if not misses:
        L += ["None.", ""]
    else:
        L += ["| case | label | mldoctor said | why (from the label's note) | expect_pass |", "| --- | --- | --- | --- | --- |"]
        for r in misses:
            t = r["truth"]
            label = (t["cause"] or "healthy") + (f" on {_ranks(t['ranks'])}" if t["ranks"] else "")
            L.append(f"| {r['case']} | {label} | {_cell(_said(r))} | {_cell(r['note'])} | {r['expect_pass']} |")
        L.append("")
    if s["expect_pass_failing"]:
        L += [f"**Regressions** (labelled expect_pass: true, wrong now): {', '.join(s['expect_pass_failing'])}", ""]
    if s["unexpected_pass"]:
        L += [f"Now right although labelled expect_pass: false (update the label): {', '.join(s['unexpected_pass'])}", ""]
    L += ["### Per case", "",
          "Top-3 causes with severity and ranks; `✓` right, `✗` wrong; state = the verdict's job state (label in "
          "brackets when it differs); time = in-process time to verdict "
          "(`diagnose_path`: parse, facts, rules, report; in one warm process, so rules are compiled once; median of "
          "--repeat runs)" + (", CLI = end to end in a new process" if s.get("cli_median") else "") + ".", "",
          "| case | kind | label (cause, ranks) | mldoctor top-3 | top-1 | top-3 | ranks | state | time (s) |"
          + (" CLI (s) |" if s.get("cli_median") else ""),
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if s.get("cli_median") else "")]
    mark = {True: "✓", False: "✗", None: "-"}
    for r in rows:
        t = r["truth"]
        label = (t["cause"] or "healthy") + (f", {_ranks(t['ranks'])}" if t["ranks"] else "")
        state = r["got"]["state"] + ("" if r["state_ok"] else f" [{t['state']}]")
        top1 = mark[r["top1"]] if r["top1"] is not None else ("✓ no alarm" if r["right"] else "✗ alarm")
        line = (f"| {r['case']} | {r['kind']} | {_cell(label)} | {_cell(_said(r))} | {top1} | {mark[r['top3']]} | "
                f"{mark[r['ranks_ok']]} | {state} | {_f(r['seconds'])} |")
        if s.get("cli_median"):
            line += f" {_f(r.get('cli_seconds'))} |"
        L.append(line)
    L += ["", "### Sources of the public cases", "", "| case | thread | diagnosis there | cited by a rule |", "| --- | --- | --- | --- |"]
    for r in rows:
        if r["origin"] == "public":
            L.append(f"| {r['case']} | {r['source']} | {_cell(r.get('diagnosis', ''))} | {'yes' if r['seen_by_rules'] else 'no'} |")
    L += [""]
    L += _render_alternatives(rows)
    return L


def _render_sealed(ss: dict[str, Any]) -> list[str]:
    L = ["### Sealed split", "",
         "Cases collected blind (label written before mldoctor ran, first answer recorded in the case and never "
         "edited), never cited by any rule, signature, test, fixture or doc (a CI check, `tests/test_sealed.py`). "
         "They are reported in aggregate only and are not part of the figures above; `bench/sealed.py` says how "
         "the split is kept sealed.", ""]
    if not ss.get("n"):
        return L + ["No sealed case yet.", ""]
    L += ["| measure | sealed |", "| --- | --- |",
          f"| cases (fault / healthy) | {ss['n']} ({ss['faults']} / {ss['healthy']}) |",
          f"| top-1 accuracy | {_pct(ss['top1'])} |", f"| top-3 accuracy | {_pct(ss['top3'])} |",
          f"| right (top-1 and exact culprit ranks; healthy: no alarm) | {_pct(ss['right'])} |",
          f"| job state right | {_pct(ss['state_ok'])} |",
          f"| top-1 on cases kept as the whole ticket | {_pct(ss['tickets_top1'])} |",
          f"| false alarms on healthy cases | {_pct(ss['false_alarms'])} |", "",
          "| batch | cases | first sight top-1 | first sight top-3 | first sight right |", "| --- | --- | --- | --- | --- |"]
    for name, b in sorted(ss.get("batches_first_sight", {}).items()):
        L.append(f"| {name} | {b['n']} | {_pct(b['top1'])} | {_pct(b['top3'])} | {_pct(b['right'])} |")
    shapes = ss.get("miss_shapes")
    if shapes:
        L += ["", "What today's wrong answers look like (counts over the split): "
              f"nothing read at all {shapes['nothing_read']}, evidence read but no cause named "
              f"{shapes['read_no_finding']}, a wrong cause named {shapes['wrong_cause']}, "
              f"an alarm on a healthy case {shapes['alarm_on_healthy']}."]
    return L + [""]


def _render_alternatives(rows: list[dict[str, Any]]) -> list[str]:
    L = ["## Side by side with the usual tools (same inputs, same run)", "",
         "**py-spy alone.** Without mldoctor a user reads the raw dumps. The count below is the number of "
         "distinct main-thread stacks in the case's raw py-spy dumps (exact frames as printed; a simple reader "
         "of the text and --json formats, independent of mldoctor's parser): the stack groups a human has to "
         "read and compare to find the odd rank.", "",
         "| case | dumps | distinct main-thread stacks to read | mldoctor's answer | right |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        if r.get("pyspy"):
            L.append(f"| {r['case']} | {r['pyspy']['dumps']} | {r['pyspy']['groups']} | {_cell(_said(r))} | "
                     f"{'✓' if r['right'] else '✗'} |")
    fr = [r for r in rows if r.get("torchfrtrace")]
    L += ["", "**torchfrtrace** (`python -m torch.distributed.flight_recorder.fr_trace DIR`, torch's own analyzer, "
          "reused from bench/bench_fr.py) on every case with flight-recorder dumps, renamed `_dump_<rank>` as its "
          "help asks. \"Names the culprits\": the ranks in its `missing ranks` lines include every labelled culprit.", "",
          "| case | dumps | torchfrtrace (s) | crashed | names the culprits | other ranks it names | mldoctor (s, in-process) | mldoctor right |",
          "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in fr:
        t = r["torchfrtrace"]
        crash = f"yes: {_cell(t['error'][:90])}" if t["crashed"] else "no"
        names = "n/a (no culprit ranks)" if not r["truth"]["ranks"] else ("yes" if t["names_culprits"] else "no")
        L.append(f"| {r['case']} | {t['dumps']} | "
                 f"{_f(t['seconds'])} | {crash} | {names} | {t['extra']} | {_f(r['seconds'])} | {'✓' if r['right'] else '✗'} |")
    if fr:
        crashed = sum(r["torchfrtrace"]["crashed"] for r in fr)
        ranked = [r for r in fr if r["truth"]["ranks"]]
        named = sum(r["torchfrtrace"]["names_culprits"] for r in ranked)
        ours = sum(r["ranks_ok"] is True for r in ranked)
        L += ["", f"torchfrtrace crashed on {crashed}/{len(fr)} cases and named every culprit on {named}/{len(ranked)} "
              f"cases with labelled ranks; mldoctor's first finding had exactly the culprit ranks on {ours}/{len(ranked)}. "
              f"Median time: torchfrtrace {_f(_med([r['torchfrtrace']['seconds'] for r in fr]))} s (a new process), "
              f"mldoctor {_f(_med([r['seconds'] for r in fr]))} s (in-process; the CLI adds its start-up, see --cli and --scale).", ""]
    td = BENCH / "bench_traindoctor.py"
    L += ["**train-doctor** on the single-process slow scripts: " + (
        "see the output of `bench/bench_traindoctor.py` under *Other bench scripts* (`--other`)." if td.exists() else
        "`bench/bench_traindoctor.py` (another engineer's) is not in this tree yet; `--other` runs it once it lands."), ""]
    return L


def _render_live(lv: dict[str, Any]) -> list[str]:
    L = ["## Live: real jobs with injected faults", "",
         f"`{lv['command']}`: each scenario of doctor/scenarios runs as a real 4-rank torchrun gloo job on the CPU "
         "until its fault shows, then (1) py-spy alone: `py-spy dump` of every rank, one after the other, and the "
         "number of distinct main-thread stacks a human reads, and (2) `mldoctor diagnose --pid <launcher> --json "
         "--logs <job log>` (the job's own output, as a user would pass it; its `[mldoctor-scenario] ... injected` "
         "marker lines are read by no rule or probe); the job and every process it started are killed afterwards.", "",
         "| scenario | label | py-spy: time for all ranks (s) | py-spy: stacks to read | mldoctor live: time to verdict (s) | mldoctor said | right |",
         "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in lv["results"]["rows"]:
        label = (r["cause"] or "healthy") + (f" on {_ranks(r['culprits'])}" if r["culprits"] else "")
        said = _said({"got": {"top": r.get("top") or []}, "error": r.get("error", "")})
        L.append(f"| {r['scenario']} | {label} | {_f(r.get('pyspy_s'))} | {r.get('pyspy_groups', '-')} | "
                 f"{_f(r.get('seconds'))} | {_cell(said)} | {'✓' if r['right'] else '✗'} |")
    rows = lv["results"]["rows"]
    L += ["", f"Right on {sum(r['right'] for r in rows)}/{len(rows)} live scenarios.", ""]
    if lv["results"].get("scaling"):
        L += [f"Time to verdict by rank count (bench/bench_live.py: extra_collective scenario, "
              f"ranks {', '.join(map(str, lv['results']['scaling_ranks']))}, median of its --repeat runs):", "",
              lv["results"]["scaling"].strip(), ""]
    return L


def _render_scale(sc: dict[str, Any]) -> list[str]:
    r = sc["results"]
    L = ["## Speed and scale", "", f"`{sc['command']}`. Medians of several runs, each in a fresh process "
         "(peak RSS is that process's own).", "", "**CLI start** (bench/bench_core.py):", "", "```", r["cli_start"], "```", "",
         "**Stacks at scale** (bench/bench_stacks.py's replication of real captured dumps; \"analysis\" = every "
         "probe's sniff + parse + the cross-rank grouping + all rules, in one process; CLI = `mldoctor diagnose "
         "--from DIR --json` end to end). py-spy alone has no analysis to time: its column is the number of distinct "
         "main-thread stacks a human would have to read in the same files.", "",
         "| ranks | files (MiB) | facts (s) | rules (s) | peak RSS (MiB) | CLI end to end (s) | CLI peak RSS (MiB) | groups mldoctor shows | distinct raw stacks (py-spy alone) |",
         "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in r["stacks"]:
        L.append(f"| {s['ranks']} | {s['mib']:.0f} | {_f(s['facts_s'])} | {_f(s['rules_s'], '{:.3f}')} | {_f(s['inner_rss'], '{:.0f}')} | "
                 f"{_f(s['cli_s'])}{'' if not s['cli_rc'] or s['cli_rc'] == 1 else ' (rc ' + str(s['cli_rc']) + ')'} | "
                 f"{_f(s['cli_rss'], '{:.0f}')} | {s['groups']} | {s['raw_groups']} |")
    L += ["", "**Flight recorder** (bench/bench_fr.py's cases: the four NVRx 16-rank cases and one replicated to "
          "1,024 ranks; both tools as a new process on the same folder):", "",
          "| case | dumps | culprits | mldoctor (s) | mldoctor peak RSS (MiB) | mldoctor FR part in-process (s) | mldoctor right | "
          "torchfrtrace (s) | torchfrtrace peak RSS (MiB) | ratio (torchfrtrace / mldoctor) | torchfrtrace crashed | culprits it names | other ranks it names |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for f in r["fr"]:
        ratio = f["tf_s"] / f["ours_s"] if f["ours_s"] else float("nan")
        L.append(f"| {f['case']} | {f['ranks']} | {f['culprits']} | {_f(f['ours_s'])} | {_f(f['ours_rss'], '{:.0f}')} | "
                 f"{_f(f['ours_fr_s'], '{:.3f}')} | {'✓ ' + f['ours_cause'] if f['ours_ok'] else '✗ ' + f['ours_cause']} | "
                 f"{_f(f['tf_s'])} (n={f.get('tf_runs', '?')}) | {_f(f['tf_rss'], '{:.0f}')} | {_f(ratio, '{:.1f}x')} | "
                 f"{'yes: ' + _cell(f['tf_error'][:80]) if f['tf_crashed'] else 'no'} | {f['tf_names']}/{f['culprits']} | {f['tf_extra']} |")
    L.append("")
    return L


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
            data["accuracy"] = {**_stamp(cmd.strip()), "rows": dev, "summary": summary, "sealed": sealed_summary}
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
