"""Live diagnosis: plan probes for the symptom, run them in parallel, evaluate, follow up.

The loop is deliberately plain: a first round of probes, a second stack snapshot to tell hung
from slow, then as many rounds as the leading hypotheses ask for (native stacks of an odd rank,
another snapshot, a sampling window) until nothing new is asked or the time budget is spent. A
rule-asked sampling window is only as long as the evidence needs (``doctor.live.window``): when
the job visibly progresses, a short first slice right after the first pass (read by the first
analysis when it has ended by then), ended as soon as every rank's log shows a few new steps;
extended to ``--duration`` only while it cannot tell slow from hung.
Every step lands in the trace, and everything collected lands in a bundle, so the same verdict
can be reproduced offline with ``mldoctor diagnose --from BUNDLE``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from doctor.engine import facts as facts_mod
from doctor.engine.diagnose import analyze
from doctor.engine.report import Report
from doctor.engine.trace import Trace
from doctor.evidence import plugins, procfs
from doctor.evidence.bundle import Bundle, ProbeRun
from doctor.evidence.contract import (
    LOOP_FOLLOW_UPS,
    CollectContext,
    ProbeFailed,
    ProbeSkipped,
    one_line,
)
from doctor.live import targets, window
from doctor.live.common import Interrupted, Progress, finish, import_cel_core, out_folder

SNAPSHOT_GAPS = (1.0, 2.0, 4.0)  # seconds before snapshot 1, 2, 3: a slow step shows as movement
PROBE_TIMEOUT = 10.0


class _Context(CollectContext):
    """A probe's context that stops taking artifacts once the loop has abandoned the probe, so a
    probe that wakes up after its timeout cannot write into a bundle being sealed."""

    abandoned: bool = False
    #: Not None: artifacts are held here instead of written (an early sampling slice that
    #: enters the bundle only once it is kept, ``Collector.keep_early``; ``commit`` writes them).
    held: list[tuple[str, bytes | str, dict[str, Any]]] | None = None

    def add(self, name: str, data: bytes | str, **kw: Any) -> Any:  # noqa: D102 - see CollectContext.add
        if self.abandoned:
            raise ProbeFailed("abandoned after its timeout")
        if self.held is not None:
            self.held.append((name, data, kw))
            self.written += 1
            return None
        return super().add(name, data, **kw)

    def commit(self) -> None:
        """Write the held artifacts into the bundle, as if they had been written at once."""
        held, self.held, self.written = self.held or [], None, 0
        for name, data, kw in held:
            super().add(name, data, **kw)


@dataclass
class Collector:
    """Runs probes against one job on this host and records each run in the bundle.

    ``deadline`` (a ``time.perf_counter()`` value) is the run's hard bound: no probe is waited
    for past it. ``progress`` gets one line per step (stderr in the command line)."""

    bundle: Bundle
    job: targets.Job
    trace: Trace
    options: dict[str, Any] = field(default_factory=dict)
    snapshot: int = 0
    done: set[tuple[str, str]] = field(default_factory=set)
    deadline: float | None = None
    progress: Progress = None
    #: The early sampling slice in flight or done (``start_early``): probe name, thread, slot,
    #: context, window length, when it may be given up.
    early: dict[str, Any] | None = None
    #: Seconds of rule-asked sampling window taken so far, the ranks it covered, and the round
    #: of its first slice (a further slice continues that window: ``samples.n_windows``).
    window_taken: float = 0.0
    window_ranks: list[int] | None = None
    window_round: int | None = None

    def layout(self) -> dict[str, Any]:
        return {"world_size": self.job.world_size, "local_world_size": self.job.local_world_size,
                "dead_ranks": [], "launcher": self.job.launcher.pid if self.job.launcher else None}

    def say(self, text: str) -> None:
        if self.progress is not None:
            self.progress(text)

    def left(self) -> float:
        """Seconds left before the deadline (infinite without one)."""
        return float("inf") if self.deadline is None else self.deadline - time.perf_counter()

    def _one(self, name: str, opts: dict[str, Any], round_no: int, slot: dict[str, Any]) -> None:
        """Run one probe (in its own daemon thread); the result lands in ``slot``."""
        probe = plugins.probe(name)
        t0 = time.perf_counter()
        if probe is None:
            slot["run"] = ProbeRun(name, "skipped", "probe not installed", 0.0, self.job.host)
            return
        ctx = _Context(self.bundle, self.job.host, self.job.procs,
                       {**self.options, **opts, "layout": self.layout()},
                       float(opts.get("timeout", PROBE_TIMEOUT)), name, round_no)
        if slot.get("held"):
            ctx.held = []
        slot["ctx"] = ctx
        try:
            if not probe.collects_live():  # this kind is read from files only
                raise ProbeSkipped("this evidence kind is read from files only")
            result = probe.collect(ctx)
            if isinstance(result, dict):
                slot["result"] = result
            status, reason = "ok", ""
        except ProbeSkipped as exc:
            status, reason = "skipped", one_line(exc)
        except ProbeFailed as exc:
            status, reason = "failed", one_line(exc)
        except Exception as exc:  # a probe bug must not end the diagnosis
            status, reason = "failed", f"internal error: {type(exc).__name__}: {one_line(exc)}"
        slot["run"] = ProbeRun(name, status, reason, round(time.perf_counter() - t0, 3), self.job.host, ctx.written)

    def run(self, requests: list[tuple[str, dict[str, Any]]], round_no: int) -> None:
        """Run probe requests in parallel, each with its own timeout; record ok/failed/skipped.

        Each probe runs in a daemon thread that is never joined past its limit: a probe stuck in
        the kernel (statvfs of a hung mount, a read of a wedged /proc file) is abandoned and
        recorded as "timed out after N s", and the run goes on. Its limit is twice its timeout
        (plus its sampling window), and never past the run's deadline."""
        if any(o.get("snapshot") == "next" for _, o in requests):
            self.snapshot += 1
            requests = [(n, {**o, "snapshot": self.snapshot} if o.get("snapshot") == "next" else o) for n, o in requests]
        ranks = ",".join(str(r.rank) for r in sorted(self.job.ranks, key=lambda r: r.rank or 0)) or "-"
        snaps = sorted({o["snapshot"] for _, o in requests if "snapshot" in o})
        self.say(f"round {round_no}" + (f", snapshot {snaps[0]}" if snaps else "") + ": "
                 + ", ".join(n + (f" (ranks {o['ranks']})" if o.get("ranks") else "") for n, o in requests)
                 + f" on ranks {ranks}")
        started = []
        for name, opts in requests:
            probe = plugins.probe(name)
            window_s = float({**self.options, **opts}.get("duration") or 0) if getattr(probe, "runs_for_duration", False) else 0.0
            if window_s:
                self.say(f"sampling window: {window_s:g} s of {name} on ranks {opts.get('ranks') or ranks}"
                         + (f" ({opts['why']})" if opts.get("why") else ""))
            started.append(self._start(name, {k: v for k, v in opts.items() if k != "why"}, round_no, window_s))
        for name, opts, t, slot, until, limit in started:
            self._finish(name, opts, t, slot, until, limit, round_no)

    def _start(self, name: str, opts: dict[str, Any], round_no: int, window_s: float,
               held: bool = False) -> tuple[str, dict[str, Any], threading.Thread, dict[str, Any], float, float]:
        """Start one probe in its daemon thread; its limit is twice its timeout plus its window."""
        limit = float(opts.get("timeout", PROBE_TIMEOUT)) * 2 + window_s
        slot: dict[str, Any] = {"held": held}
        t = threading.Thread(target=self._one, args=(name, opts, round_no, slot), daemon=True,
                             name=f"mldoctor-probe-{name}")
        t.start()
        return name, opts, t, slot, time.perf_counter() + limit, limit

    def _finish(self, name: str, opts: dict[str, Any], t: threading.Thread, slot: dict[str, Any], until: float,
                limit: float, round_no: int, note: str = "") -> ProbeRun:
        """Wait for a started probe (never past its limit or the deadline), record its run."""
        wait_s = min(until - time.perf_counter(), self.left())
        if wait_s > 0:
            t.join(wait_s)
        label = name + (f"(snapshot {opts.get('snapshot')})" if "snapshot" in opts else "")
        run = slot.get("run")
        if run is None:  # still running: abandon it (daemon thread, never joined)
            if "ctx" in slot:
                slot["ctx"].abandoned = True
            why = (f"timed out after {limit:.0f} s" if time.perf_counter() >= until
                   else f"timed out after {time.perf_counter() - (until - limit):.1f} s: the run's time budget was spent")
            run = ProbeRun(name, "failed", why + "; abandoned (it may be blocked in the kernel)",
                           round(time.perf_counter() - (until - limit), 3), self.job.host)
        elif slot.get("held") and "ctx" in slot:
            slot["ctx"].commit()
        self.bundle.record_probe(run)
        line = (f"{label}: {run.status}" + (f" ({run.reason})" if run.reason else "")
                + f" in {run.duration_s:.2f}s, {run.artifacts} artifact(s)" + note)
        self.trace.add("probe", line, round=round_no)
        self.say("  " + line)
        return run

    def start_early(self, round_no: int, duration: float) -> None:
        """Start the first slice of a sampling window now, with its artifacts held back until
        ``keep_early`` commits them (the slice ended before the first analysis, or a rule asks
        for a window); ``drop_early`` throws them away otherwise."""
        names = [p.name for p in plugins.probes() if p.runs_for_duration and p.collects_live()]
        if not names or self.early is not None:
            return
        slice_s = window.first_slice(None, duration)
        ranks = sorted(r.rank for r in self.job.ranks if r.rank is not None)
        self.say(f"sampling window: {slice_s:g} s of {names[0]} on ranks {','.join(map(str, ranks)) or '-'}, "
                 "started early (most ranks' main threads wake up: the job progresses); it ends sooner once "
                 f"every rank's log shows {window.STEPS_PER_SLICE:g} new steps")
        self.trace.add("window", f"early {slice_s:g} s slice of {names[0]} after the first pass (the job progresses: "
                                 "healthy or straggler is the samples' question); read by the first analysis when "
                                 "it has ended by then, else kept only if a rule asks for a window")
        started = self._start(names[0], {"duration": slice_s, **window.early_end()}, round_no, slice_s, held=True)
        self.early = {"started": started, "duration": slice_s, "ranks": ranks, "round": round_no}

    def keep_early(self, only_if_done: bool = True) -> bool:
        """Commit the early slice's artifacts so that the next analysis reads the samples with
        the rest of the first pass. ``only_if_done``: only when the slice has already ended (it
        ends early on step evidence), so the first analysis never waits for it; a slice still
        running is left to ``take_early`` (a rule asks) or ``drop_early``. True when kept."""
        e = self.early
        if e is None or e.get("used"):
            return False
        name_, opts, t, slot, until, limit = e["started"]
        if only_if_done and t.is_alive():
            return False
        e["used"] = e["kept"] = True
        run = self._finish(name_, opts, t, slot, until, limit, e["round"], note=" (started after the first pass)")
        result = slot.get("result") or {}
        if result.get("ended_early"):
            self.trace.add("window", f"the slice ended after {result.get('duration_s')} s of {e['duration']:g} s: "
                                     f"{result['ended_early']}")
        taken = result.get("duration_s")
        if run.status == "ok":
            self.window_taken += float(taken) if isinstance(taken, (int, float)) and taken > 0 else e["duration"]
            self.window_ranks, self.window_round = None, e["round"]
        return True

    def take_early(self, name: str, ranks: list[int] | None) -> str:
        """A rule asks for ``name`` on ``ranks``. 'kept': the slice the analysis already read
        sampled that probe on those ranks (nothing to collect); 'taken': the slice still held
        covers them and is committed now (an analysis must read it); '': neither."""
        e = self.early
        if e is None or e["started"][0] != name:
            return ""
        if e.get("kept"):
            return "kept" if not ranks or set(ranks) <= set(e["ranks"]) else ""
        if ranks and set(ranks) != set(e["ranks"]):  # a held slice of other ranks is not what was asked
            return ""
        return "taken" if self.keep_early(only_if_done=False) else ""

    def drop_early(self) -> None:
        """The verdict needs no window: wait for the early slice's py-spy runs to end (none is
        left on the job) and throw its artifacts away."""
        e = self.early
        if e is None or e.get("used"):
            return
        e["used"] = True
        _name, _opts, t, slot, _until, _limit = e["started"]
        if "ctx" in slot:
            slot["ctx"].abandoned = True
            slot["ctx"].held = []
        if t.is_alive():  # stop its samplers now rather than wait out the slice (py-spy ends on SIGINT)
            _stop_own_children(self.job)
            t.join(3.0)
        self.trace.add("window", "no rule asked for a sampling window: the early slice was discarded")

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


def _window(col: Collector, duration: float) -> float:
    """The sampling window, cut so that it ends (with a second to spare) before the deadline;
    whole seconds, since py-spy rounds a window up."""
    return float(max(1, int(min(duration, col.left() - 1.0))))


def collect_job(job: targets.Job, bundle: Bundle, trace: Trace, options: dict[str, Any],
                symptom: str | None, deadline: float | None = None, progress: Progress = None) -> Collector:
    """The first pass on one host: every probe once, then a second stack snapshot."""
    col = Collector(bundle, job, trace, options, deadline=deadline, progress=progress)
    snap = set(plugins.snapshot_probes())
    first = [(n, {"snapshot": 0} if n in snap else {}) for n in plugins.first_round()]
    t0 = time.perf_counter()
    col.run(first, 0)
    remaining = min(SNAPSHOT_GAPS[0] - (time.perf_counter() - t0), col.left())
    if remaining > 0:
        col.say(f"waiting {remaining:.1f} s before snapshot 1 (the gap is the measurement)")
        time.sleep(remaining)  # the gap between snapshots is the measurement, not a wait for luck
    if col.left() <= 0:
        trace.add("stop", "time budget spent before a second snapshot")
        return col
    col.snapshot_round(1)
    early = plugins.for_symptom(symptom)
    if early and col.left() > 1.5:
        col.run([(n, {"duration": _window(col, float(options.get("duration", 10.0)))}) for n in early], 1)
    return col


def _stop_own_children(job: targets.Job) -> None:
    """Ctrl-C: pass the interrupt on to the helpers mldoctor started (py-spy, dmesg), as the
    terminal does for a foreground group; py-spy detaches cleanly on SIGINT. Only this process's
    own children are signalled, never a process of the job (``mldoctor demo`` starts its job as
    a child: its processes are skipped)."""
    me, job_pids = os.getpid(), {p.pid for p in job.procs}
    for pid in procfs.pids():
        if pid in job_pids:
            continue
        st = procfs.status(pid) or {}
        if st.get("PPid") == str(me):
            try:
                os.kill(pid, signal.SIGINT)
            except OSError:
                pass


#: Seconds of the budget kept for the analysis and the report after the last probe.
ANALYSIS_RESERVE = 2.0


def diagnose_live(pids: list[int] | None = None, symptom: str | None = None,
                  logs: list[Path] | None = None, rules_dirs: list[Path] | None = None,
                  budget: float = 30.0, duration: float = 10.0, job: str | None = None,
                  out: Path | None = None, redact_hosts: bool = False,
                  trace: Trace | None = None, progress: Progress = None,
                  debug_server: str | None = None) -> Report:
    """Diagnose the job on this host. ``debug_server``: the url of the job's torch debug server
    frontend (default: this host's port 25999). ``trace``: pass one to watch the steps while it runs (the
    TUI polls it from a thread). ``progress`` gets one line per step. A SLURM job is
    ``doctor.live.slurm.diagnose_slurm_job``.

    The budget is a hard bound on collection: no probe is waited for past ``budget`` minus
    ``ANALYSIS_RESERVE`` (a quarter of it for short budgets). Ctrl-C stops at once and raises
    :class:`Interrupted` with the report of what was collected until then."""
    t_start = time.perf_counter()
    deadline = t_start + budget - min(ANALYSIS_RESERVE, budget / 4)
    trace = trace if trace is not None else Trace()
    the_job = targets.pick_job(targets.discover(pids or None), job)
    trace.add("discover", the_job.describe() + f"; {len(the_job.workers)} DataLoader worker(s)")
    for note in the_job.notes:
        trace.add("discover", note)
    if progress is not None:
        progress(f"found {the_job.describe()}")
    # Compile the rules while the probes run and the snapshot gap passes (a cold start's ~1-2 s).
    warm = threading.Thread(target=_warm_up, args=(rules_dirs, trace), daemon=True, name="mldoctor-warm-up")
    warm.start()
    tmp = None
    if out is not None:
        out = out_folder(out)  # never into (or over) a folder mldoctor did not create
        root = out / "bundle"
    else:
        tmp = Path(tempfile.mkdtemp(prefix="mldoctor-live-"))
        root = tmp / "bundle"
    bundle = Bundle.create(root, {"type": "live", "host": socket.gethostname(), "job": the_job.key,
                                  "world_size": the_job.world_size, "pids": [p.pid for p in the_job.ranks]})
    options: dict[str, Any] = {"logs": [str(p) for p in logs or []], "duration": duration}
    if debug_server:
        options["debug_server"] = debug_server
    source = {"type": "live", "host": the_job.host, "job": the_job.key}
    try:
        try:
            report = _loop(the_job, bundle, trace, options, symptom, rules_dirs, source, deadline, progress, warm)
        except KeyboardInterrupt:
            _stop_own_children(the_job)
            trace.add("stop", "interrupted (Ctrl-C): the report holds what was collected until then")
            if progress is not None:
                progress("interrupted: analyzing what was collected so far")
            warm.join(30)  # the rules are half compiled: finishing beats compiling them twice
            report = _analyze(bundle, symptom, rules_dirs, trace, source)
            raise Interrupted(finish(report, trace, bundle, out, redact_hosts)) from None
        return finish(report, trace, bundle, out, redact_hosts)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _warm_up(rules_dirs: list[Path] | None, trace: Trace | None = None) -> None:
    """Compile the rules (cached) ahead of the first analysis; the trace says how long it took
    (on a loaded host it is often what the first analysis waits for)."""
    t0 = time.perf_counter()
    try:
        import_cel_core()
        from doctor.engine import ruleset

        n = len(ruleset.load_ruleset(rules_dirs).rules)
    except Exception:  # the analysis itself reports any problem, once
        return
    if trace is not None:
        trace.add("warm-up", f"{n} rules compiled in {time.perf_counter() - t0:.2f} s, alongside the first pass")


def _loop(the_job: targets.Job, bundle: Bundle, trace: Trace, options: dict[str, Any], symptom: str | None,
          rules_dirs: list[Path] | None, source: dict[str, Any], deadline: float, progress: Progress,
          warm: threading.Thread) -> Report:
    """The first pass, then follow-up rounds until no rule asks for more or the deadline comes."""
    col = collect_job(the_job, bundle, trace, options, symptom, deadline, progress)
    configured = float(options.get("duration") or 10.0)
    # The user's own window (--symptom slow) keeps its length; a rule-asked one is adaptive.
    adaptive = not plugins.for_symptom(symptom)
    # Most ranks' main threads waking: the job progresses, and healthy or straggler is a question
    # only samples answer: a short slice starts now and runs while the rules compile; the first
    # analysis reads it when it has ended by then (one analysis instead of two, no wait), else a
    # rule that asks for a window takes it. Most ranks parked: a hang is likely and a short slice
    # would only be extended, so a rule-asked window gets its full length at once.
    progressing = adaptive and window.progress_likely(bundle)
    if progressing and col.left() > window.MIN_SLICE + ANALYSIS_RESERVE:
        col.start_early(2, configured)
    warm.join(30)  # the rule cache is not locked: wait for the warm-up rather than compile twice
    col.keep_early()  # the slice, when it already ended: one analysis instead of two, no wait
    col.say("analyzing")
    report = _analyze(bundle, symptom, rules_dirs, trace, source)
    round_no, gap_i = 2, 1
    while True:
        if col.left() <= 0:
            trace.add("stop", "time budget spent")
            break
        want_snapshot = _ambiguous_motion(report)
        requests: list[tuple[str, dict[str, Any]]] = []
        took_early = False
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
                timed = "duration" in opts or getattr(plugins.probe(name), "runs_for_duration", False)
                got = col.take_early(name, ranks) if timed and adaptive and not opts.get("duration") else ""
                if got == "kept":
                    trace.add("window", f"{name} on ranks {ranks or 'all'}: answered by the slice already read")
                    continue
                if got:
                    took_early = True
                    continue
                if timed:
                    want = float(opts.get("duration") or 0) or (
                        window.first_slice(report.facts, configured) if progressing and not col.window_taken
                        else configured)
                    opts = {**opts, "duration": _window(col, want)}
                    if adaptive:
                        opts.update(window.early_end())
                    if progressing and not col.window_taken and opts["duration"] < configured:
                        col.window_taken, col.window_ranks, col.window_round = opts["duration"], ranks, round_no
                        opts["why"] = (f"first slice of up to {configured:g} s; longer only if it cannot "
                                       "tell slow from hung")
                    elif adaptive and not progressing:
                        opts["why"] = "most ranks parked in the first pass: the full window at once"
                requests.append((name, {**opts, "ranks": ranks}))
        if adaptive and not requests and not took_early:
            requests += _extend_window(col, report, configured, trace)
        took_snapshot = False
        if want_snapshot and gap_i < len(SNAPSHOT_GAPS):
            gap = SNAPSHOT_GAPS[gap_i]
            gap_i += 1
            if col.left() > gap:
                trace.add("snapshot", f"some ranks moved and some did not; looking again in {gap:.0f}s")
                col.say(f"some ranks moved and some did not: snapshot {col.snapshot + 1} in {gap:.0f} s")
                time.sleep(gap)  # the spacing is the measurement: a slow step shows as movement
                col.snapshot_round(round_no)
                took_snapshot = True
        if requests and col.left() > 0:
            col.run(requests, round_no)
        if not (requests or took_snapshot or took_early):
            trace.add("stop", "no rule asks for more evidence")
            break
        col.say("analyzing")
        report = _analyze(bundle, symptom, rules_dirs, trace, source)
        round_no += 1
    col.drop_early()
    return report


def _extend_window(col: Collector, report: Report, configured: float, trace: Trace) -> list[tuple[str, dict[str, Any]]]:
    """One more slice of the rule-asked sampling window, up to ``configured`` seconds in all,
    when the slices so far cannot tell a slow job from a hung one (``window.still_ambiguous``)."""
    if not col.window_taken or col.window_taken >= configured:
        return []
    why = window.still_ambiguous(report.facts, col.window_taken)
    if not why or col.left() <= 1.5:
        return []
    names = [p.name for p in plugins.probes() if p.runs_for_duration and p.collects_live()]
    if not names:
        return []
    more = _window(col, configured - col.window_taken)
    trace.add("follow-up", f"{names[0]}: window extended by {more:g} s after {col.window_taken:g} s: {why}")
    col.window_taken += more
    cont = {"continues": col.window_round} if col.window_round is not None else {}
    return [(names[0], {"duration": more, "ranks": col.window_ranks, "window": "extended", **cont,
                        **window.early_end(), "why": f"extends the {col.window_taken - more:g} s taken: {why}"})]
