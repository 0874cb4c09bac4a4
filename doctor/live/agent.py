"""Live diagnosis: plan probes for the symptom, run them in parallel, evaluate, follow up.

The loop is deliberately plain: a first round of probes, a second stack snapshot to tell hung
from slow, then as many rounds as the leading hypotheses ask for (native stacks of an odd rank,
another snapshot, a sampling window) until nothing new is asked or the time budget is spent.
Every step lands in the trace, and everything collected lands in a bundle, so the same verdict
can be reproduced offline with ``mldoctor diagnose --from BUNDLE``.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from doctor.engine import facts as facts_mod
from doctor.engine.diagnose import analyze
from doctor.engine.report import Report
from doctor.engine.trace import Trace
from doctor.evidence import plugins
from doctor.evidence.bundle import Bundle, ProbeRun
from doctor.evidence.contract import (
    LOOP_FOLLOW_UPS,
    CollectContext,
    ProbeFailed,
    ProbeSkipped,
    one_line,
)
from doctor.live import targets
from doctor.live.common import finish

SNAPSHOT_GAPS = (1.0, 2.0, 4.0)  # seconds before snapshot 1, 2, 3: a slow step shows as movement
PROBE_TIMEOUT = 10.0


@dataclass
class Collector:
    """Runs probes against one job on this host and records each run in the bundle."""

    bundle: Bundle
    job: targets.Job
    trace: Trace
    options: dict[str, Any] = field(default_factory=dict)
    snapshot: int = 0
    done: set[tuple[str, str]] = field(default_factory=set)

    def layout(self) -> dict[str, Any]:
        return {"world_size": self.job.world_size, "local_world_size": self.job.local_world_size,
                "dead_ranks": [], "launcher": self.job.launcher.pid if self.job.launcher else None}

    def run(self, requests: list[tuple[str, dict[str, Any]]], round_no: int) -> None:
        """Run probe requests in parallel, each with its own timeout; record ok/failed/skipped."""
        def one(name: str, opts: dict[str, Any]) -> ProbeRun:
            probe = plugins.probe(name)
            t0 = time.perf_counter()
            if probe is None:
                return ProbeRun(name, "skipped", "probe not installed", 0.0, self.job.host)
            ctx = CollectContext(self.bundle, self.job.host, self.job.procs,
                                 {**self.options, **opts, "layout": self.layout()},
                                 float(opts.get("timeout", PROBE_TIMEOUT)), name, round_no)
            try:
                if not probe.collects_live():  # this kind is read from files only
                    raise ProbeSkipped("this evidence kind is read from files only")
                probe.collect(ctx)
                status, reason = "ok", ""
            except ProbeSkipped as exc:
                status, reason = "skipped", one_line(exc)
            except ProbeFailed as exc:
                status, reason = "failed", one_line(exc)
            except Exception as exc:  # a probe bug must not end the diagnosis
                status, reason = "failed", f"internal error: {type(exc).__name__}: {one_line(exc)}"
            return ProbeRun(name, status, reason, round(time.perf_counter() - t0, 3), self.job.host, ctx.written)

        if any(o.get("snapshot") == "next" for _, o in requests):
            self.snapshot += 1
            requests = [(n, {**o, "snapshot": self.snapshot} if o.get("snapshot") == "next" else o) for n, o in requests]
        with ThreadPoolExecutor(max_workers=max(1, len(requests))) as pool:
            futures = {pool.submit(one, n, o): (n, o) for n, o in requests}
            # a sampling window runs for its --duration before it can answer
            window = max((float({**self.options, **o}.get("duration") or 0) for n, o in requests
                          if getattr(plugins.probe(n), "runs_for_duration", False)),
                         default=0.0)
            finished, pending = wait(futures, timeout=PROBE_TIMEOUT * 2 + window)
            for fut in finished:
                run = fut.result()
                self.bundle.record_probe(run)
                label = run.name + (f"(snapshot {futures[fut][1].get('snapshot')})" if "snapshot" in futures[fut][1] else "")
                self.trace.add("probe", f"{label}: {run.status}" + (f" ({run.reason})" if run.reason else "")
                               + f" in {run.duration_s:.2f}s, {run.artifacts} artifact(s)", round=round_no)
            for fut in pending:
                name = futures[fut][0]
                self.bundle.record_probe(ProbeRun(name, "failed", "timed out", PROBE_TIMEOUT * 2, self.job.host))
                self.trace.add("probe", f"{name}: failed (timed out)", round=round_no)

    def snapshot_round(self, round_no: int) -> None:
        self.snapshot += 1
        self.run([(name, {"snapshot": self.snapshot}) for name in plugins.snapshot_probes()], round_no)


def _analyze(bundle: Bundle, symptom: str | None, rules_dirs: list[Path] | None, trace: Trace,
             source: dict[str, Any]) -> Report:
    return analyze(facts_mod.items_from_bundle(bundle), source, symptom,
                   list(bundle.manifest["probes"]), rules_dirs, trace)


def _ambiguous_motion(report: Report) -> bool:
    """Some kind's evidence is ambiguous in a way another snapshot settles (``wants_another_look``)."""
    kinds = set(report.facts.get("evidence", {}).get("kinds") or [])
    return any(p.wants_another_look(report.facts) for p in plugins.probes() if p.name in kinds)


def collect_job(job: targets.Job, bundle: Bundle, trace: Trace, options: dict[str, Any],
                symptom: str | None) -> Collector:
    """The first pass on one host: every probe once, then a second stack snapshot."""
    col = Collector(bundle, job, trace, options)
    snap = set(plugins.snapshot_probes())
    first = [(n, {"snapshot": 0} if n in snap else {}) for n in plugins.first_round()]
    t0 = time.perf_counter()
    col.run(first, 0)
    remaining = SNAPSHOT_GAPS[0] - (time.perf_counter() - t0)
    if remaining > 0:
        time.sleep(remaining)  # the gap between snapshots is the measurement, not a wait for luck
    col.snapshot_round(1)
    early = plugins.for_symptom(symptom)
    if early:
        col.run([(n, {"duration": options.get("duration", 10.0)}) for n in early], 1)
    return col


def diagnose_live(pids: list[int] | None = None, symptom: str | None = None,
                  logs: list[Path] | None = None, rules_dirs: list[Path] | None = None,
                  budget: float = 30.0, duration: float = 10.0, job: str | None = None,
                  out: Path | None = None, redact_hosts: bool = False,
                  trace: Trace | None = None) -> Report:
    """Diagnose the job on this host. ``trace``: pass one to watch the steps while it runs (the
    TUI polls it from a thread). A SLURM job is ``doctor.live.slurm.diagnose_slurm_job``."""
    t_start = time.perf_counter()
    trace = trace if trace is not None else Trace()
    the_job = targets.pick_job(targets.discover(pids or None), job)
    trace.add("discover", the_job.describe() + f"; {len(the_job.workers)} DataLoader worker(s)")
    tmp = None
    if out is not None:
        root = out / "bundle"
        if root.exists():
            shutil.rmtree(root)
    else:
        tmp = Path(tempfile.mkdtemp(prefix="mldoctor-live-"))
        root = tmp / "bundle"
    bundle = Bundle.create(root, {"type": "live", "host": socket.gethostname(), "job": the_job.key,
                                  "world_size": the_job.world_size, "pids": [p.pid for p in the_job.ranks]})
    options = {"logs": [str(p) for p in logs or []], "duration": duration}
    try:
        col = collect_job(the_job, bundle, trace, options, symptom)
        source = {"type": "live", "host": the_job.host, "job": the_job.key}
        report = _analyze(bundle, symptom, rules_dirs, trace, source)
        round_no, gap_i = 2, 1
        while True:
            if time.perf_counter() - t_start >= budget:
                trace.add("stop", f"time budget of {budget:.0f}s spent")
                break
            want_snapshot = _ambiguous_motion(report)
            requests: list[tuple[str, dict[str, Any]]] = []
            table = plugins.follow_ups()
            for fu in report.follow_ups:
                if fu["probe"] in LOOP_FOLLOW_UPS:
                    want_snapshot = True
                    continue
                for name, opts in table.get(fu["probe"], []):
                    ranks = fu.get("ranks") or None
                    key = (name, repr((ranks, sorted(opts.items()))))
                    if key in col.done:
                        continue
                    col.done.add(key)
                    trace.add("follow-up", f"{fu['probe']} on ranks {ranks or 'all'}: {fu.get('why') or 'asked by ' + fu.get('rule', 'a rule')}")
                    requests.append((name, {**opts, "ranks": ranks}))
            took_snapshot = False
            if want_snapshot and gap_i < len(SNAPSHOT_GAPS):
                gap = SNAPSHOT_GAPS[gap_i]
                gap_i += 1
                if time.perf_counter() - t_start + gap < budget:
                    trace.add("snapshot", f"some ranks moved and some did not; looking again in {gap:.0f}s")
                    time.sleep(gap)  # the spacing is the measurement: a slow step shows as movement
                    col.snapshot_round(round_no)
                    took_snapshot = True
            if requests:
                col.run(requests, round_no)
            if not (requests or took_snapshot):
                trace.add("stop", "no rule asks for more evidence")
                break
            report = _analyze(bundle, symptom, rules_dirs, trace, source)
            round_no += 1
        return finish(report, trace, bundle, out, redact_hosts)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
