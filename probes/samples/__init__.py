"""Sampling profiles of every rank: where the step time goes, per rank, without a restart.

Live, ``collect`` runs one ``py-spy record`` per rank, all at once, for a short window
(``--duration``, default 10 s) at a modest rate (50 Hz): ``--idle`` so that waiting shows up
(without it a rank blocked in a collective or on a queue has almost no samples and every share
is wrong), ``--nonblocking`` so the ranks are never paused (``--native`` needs the pausing
mode, so it is used only when asked), ``--threads`` to tell the main thread from helpers,
``-f raw`` (``frame;frame;... COUNT``, outermost first). The raw files are kept in the bundle
as written; a small JSON beside them records the window and the text of the source lines the
main threads stood on (``loss.item()`` is a C call: only the caller's line says what it was).

Offline it reads py-spy ``record -f raw`` files (with or without ``--threads``), py-spy
speedscope JSON, its own window JSON, and the step-timing JSONL of the in-job helper
(``doctor.torch``). ``build`` classifies every main-thread sample (``doctor.probes.samples.timeshare``, on the
frame tables of ``doctor.probes.stacks.classify``), gives per-rank time shares that add up to 1, and finds
the straggler: the rank that computes while the others wait for it in collectives, and why.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

from doctor.probes.samples import timeshare as ts
from doctor.probes.samples.live import (
    PYSPY_DONE,
    StepWatch,
    failure,
    find_pyspy,
    source_lines,
    wait_decisive,
)
from doctor.probes.samples.profiles import (
    PROC_HDR,
    RAW_LINE,
    THREAD_HDR,
    ProfileFile,
    ThreadSamples,
    main_thread,
    parse_frame,
    parse_raw,
    parse_speedscope,
)
from doctor.probes.samples.steps import STEPS_SCHEMA, parse_steps, summarize_steps

from doctor.evidence.contract import (
    CollectContext,
    Hints,
    Parsed,
    Probe,
    ProbeFailed,
    ProbeSkipped,
    Sample,
    set_world_size,
)
from doctor.evidence.errors import EvidenceError

#: Names other evidence kinds and the tests read from the probe's package.
__all__ = ["PROBE", "ProfileFile", "SamplesProbe", "ThreadSamples", "main_thread", "parse_frame", "parse_raw",
           "parse_speedscope", "parse_steps", "summarize_steps"]

META_SCHEMA = "mldoctor.samples/1"
_META_NEEDLE = META_SCHEMA.encode()
_STEPS_NEEDLE = STEPS_SCHEMA.encode()
_PAREN_SPACE = re.compile(rb"\) ")
DEFAULT_RATE = 50  # Hz: py-spy's default is 100; 50 keeps the sampler's own CPU use small
DEFAULT_DURATION = 10.0
NOTABLE_SHARE = 0.05  # a rank is listed under samples.notable[cat] from this share up
_WINDOW = re.compile(r"samples-r(\d+)-")


class SamplesProbe(Probe):
    name: ClassVar[str] = "samples"
    title: ClassVar[str] = "Sampling profiles (time shares)"
    collects: ClassVar[str] = (
        "py-spy record --idle --threads -f raw of every rank at once for a short window (non-blocking "
        "unless native frames are asked for), the text of the source lines the main threads stood on, "
        "and the in-job helper's step timings (doctor.torch); local variables are never read."
    )
    priority: ClassVar[int] = 65  # raw sample lines are text: claim them before the log reader
    build_order: ClassVar[int] = 90  # after env, procs, system, gpu, metrics: joins their facts
    live_for_symptoms: ClassVar[tuple[str, ...]] = ("slow",)
    runs_for_duration: ClassVar[bool] = True
    follow_ups: ClassVar[dict[str, dict[str, Any]]] = {"samples": {}, "samples_again": {"window": "again"}}
    shows_state: ClassVar[bool] = True
    state_order: ClassVar[int] = 20
    max_bytes: ClassVar[int] = 256 * 2**20
    fixtures: ClassVar[tuple[str, ...]] = (
        "tests/fixtures/slow/*/bundle/hosts/*/samples/samples-*",
        "tests/fixtures/slow/formats/*",
        "tests/fixtures/slow/steps/*/steps-rank*.jsonl",
    )
    facts_schema: ClassVar[dict[str, str]] = {
        "samples.ranks": "list<int>: ranks with a sampling profile",
        "samples.n_ranks": "int: how many",
        "samples.rate_hz": "int: sampling rate of the live window (0 when unknown: loose files)",
        "samples.duration_s": "float: length of the live window, its slices added up; a slice ended early on "
                              "step evidence counts what it sampled (0 when unknown)",
        "samples.samples_total": "int: main-thread samples over all ranks",
        "samples.categories": "list<string>: the time-share categories (probes/samples/timeshare.py CATEGORIES): "
                              + ", ".join(ts.CATEGORIES),
        "samples.by_rank": "map<string,map>: per rank: samples, shares (category -> share of the main "
                           "thread's samples, sum 1), top, data, busy, waiting, checkpoint, collective_ops, "
                           "io_ops, sync_ops, compile_ops, hot (hottest user lines: where, share, category, "
                           "text), still (share of the most common Python stack), main_thread, pid",
        "samples.by_rank[].samples": "int: main-thread samples of the rank",
        "samples.by_rank[].shares": "map<string,float>: category -> share of those samples (sums to 1)",
        "samples.by_rank[].top": "string: its largest category (idle with no samples)",
        "samples.by_rank[].data": "float: share in data loading (wait and fetch)",
        "samples.by_rank[].busy": "float: share in compute-like categories",
        "samples.by_rank[].waiting": "float: share waiting (collectives, host syncs, ...)",
        "samples.by_rank[].checkpoint": "float: share in checkpoint I/O (torch.save, fsync, ...)",
        "samples.by_rank[].still": "float: share of its most common Python stack (near 1: frozen)",
        "samples.by_rank[].collective_ops": "map<string,float>: collective op -> share of its samples",
        "samples.by_rank[].io_ops": "map<string,float>: I/O call -> share of its samples",
        "samples.by_rank[].sync_ops": "map<string,float>: host-device sync call -> share of its samples",
        "samples.by_rank[].compile_ops": "map<string,float>: compile step -> share of its samples",
        "samples.by_rank[].hot": "list<map>: its hottest user lines: where, share, category, text",
        "samples.by_rank[].hot[].where": "string: file:line of the user's code",
        "samples.by_rank[].hot[].share": "float: share of the rank's samples on that line",
        "samples.by_rank[].hot[].category": "string: the category most of its samples fall in",
        "samples.by_rank[].hot[].text": "string: the line's source text, empty when unknown",
        "samples.by_rank[].main_thread": "string: name of the thread taken as the main one",
        "samples.by_rank[].threads": "int: threads in the rank's profile",
        "samples.by_rank[].files": "int: profile files read for the rank",
        "samples.by_rank[].pid": "int: its process id, null when the file does not say",
        "samples.by_rank[].host": "string: host it ran on, when known",
        "samples.mean": "map<string,float>: per category (and data, busy, waiting, checkpoint) the mean share over ranks",
        "samples.median": "map<string,float>: per category (and data, busy, waiting, checkpoint) the median share over ranks",
        "samples.max": "map<string,float>: per category (and data, busy, waiting, checkpoint) the largest share of any rank",
        "samples.max_rank": "map<string,int>: per category the rank with the largest share",
        "samples.notable": f"map<string,list<int>>: per category the ranks at or above {NOTABLE_SHARE:.0%} of their time",
        "samples.frozen_ranks": f"list<int>: ranks with {ts.FROZEN_SHARE:.1%} or more of their samples on one "
                                "Python stack (blocked, or one endless line)",
        "samples.progress": "string: hung | progressing | '' from the window: ranks that wait in collectives "
                            "never leave them (hung) or do (steps complete); job.observed_state uses it",
        "samples.n_windows": "int: sampling windows read (live rounds; a slice that extends a window is part of "
                             "it; loose files count as one)",
        "samples.windows_over": f"map<string,int>: for {', '.join(ts.WINDOW_KEYS)}: windows in which some rank "
                                f"spent {ts.WINDOW_SHARE:.0%} or more there (two windows apart: a pattern, not a one-off)",
        "samples.share_sum_min": "float: smallest per-rank sum of shares (1.0 up to rounding)",
        "samples.share_sum_max": "float: largest per-rank sum of shares",
        "samples.collective_ops": "map<string,float>: collective op -> mean share over ranks",
        "samples.straggler": "map: detected, ranks, category (the straggler's largest non-collective category), "
                             "cause (input | compute | gpu | host | io | compile | host_sync | gc | logging | other), "
                             "peers_collective, straggler_collective (median collective shares), evidence, detail",
        "samples.straggler.detected": "bool: some ranks compute while the rest wait for them in collectives",
        "samples.straggler.ranks": "list<int>: the stragglers",
        "samples.straggler.cause": "string: why they are slow (see samples.straggler)",
        "samples.straggler.category": "string: their largest non-collective category",
        "samples.straggler.peers_collective": "float: median collective share of the other ranks",
        "samples.straggler.straggler_collective": "float: median collective share of the stragglers",
        "samples.straggler.evidence": "list<string>: readable lines behind the cause",
        "samples.straggler.detail": "string: one line",
        "samples.hot": "list<map>: hottest user lines over all ranks: where, share (of all samples), category, text, ranks",
        "samples.hot[].where": "string: file:line of the user's code",
        "samples.hot[].share": "float: share of all ranks' samples on that line",
        "samples.hot[].category": "string: the category most of its samples fall in",
        "samples.hot[].text": "string: the line's source text (live windows; empty when unknown)",
        "samples.hot[].ranks": "list<int>: ranks where it is among the hottest",
        "samples.window": "map: rate_hz, duration_s, nonblocking, native (live windows only)",
        "samples.window.rate_hz": "int: samples per second py-spy was asked for",
        "samples.window.duration_s": "float: seconds the window lasted",
        "samples.window.nonblocking": "bool: py-spy sampled without pausing the process",
        "samples.window.native": "bool: native (C/C++) frames were sampled too",
        "samples.errors": "list<string>: ranks whose sampling failed, with py-spy's reason",
        "samples.formats": "list<string>: raw | speedscope | meta | steps",
        "samples.steps": "map: step timings of the in-job helper (doctor.torch): ranks, n_steps, step_time_median, "
                         "slowest_rank, slowest_ratio, data_share, gc_share, phase_share, checkpoint_share, "
                         "compiles, slow (n_slow, periodic, interval, lost_share, median_s, slow_median_s, rank), by_rank",
        "samples.steps.data_share": "float: sum of data-wait time / sum of step time, all ranks",
        "samples.steps.gc_share": "float: time in Python GC / step time, all ranks",
        "samples.steps.checkpoint_share": "float: time in phases named checkpoint/save/ckpt / step time",
        "samples.steps.compiles": "int: graphs torch.compile built (Dynamo's unique_graphs counter at the last step)",
        "samples.steps.slow": "map: slow steps (3x median): n_slow, periodic, interval, lost_share, rank",
        "samples.steps.slow.periodic": "bool: the slow steps come at a fixed interval",
        "samples.steps.slow.interval": "int: that interval in steps",
        "samples.steps.slow.lost_share": "float: time above the median spent in slow steps / all step time",
        "samples.steps.slow.n_slow": "int: slow steps",
        "samples.steps.slow.median_s": "float: median step time in seconds",
        "samples.steps.slow.slow_median_s": "float: median time of the slow steps in seconds",
        "samples.steps.slow.rank": "int: the rank these slow steps belong to (the one losing the most)",
        "samples.steps.step_time_median": "float: median over ranks of each rank's median step time in seconds",
        "samples.steps.slowest_rank": "int: rank with the largest median step time",
        "samples.steps.slowest_ratio": "float: its median step time / the median over ranks",
        "samples.steps.phase_share": "map<string,float>: named phase -> its time / step time, all ranks",
        "samples.steps.by_rank": "map<string,map>: per rank: steps, step-time median/p90/max, shares, compiles, slow",
        "samples.steps.by_rank[].steps": "int: step records of the rank",
        "samples.steps.by_rank[].step_time_median": "float: median step time in seconds",
        "samples.steps.by_rank[].step_time_p90": "float: 90th percentile step time in seconds",
        "samples.steps.by_rank[].step_time_max": "float: longest step in seconds",
        "samples.steps.by_rank[].data_share": "float: data-wait time / step time",
        "samples.steps.by_rank[].gc_share": "float: Python GC time / step time",
        "samples.steps.by_rank[].phase_share": "map<string,float>: named phase -> its time / step time",
        "samples.steps.by_rank[].compiles": "int: graphs torch.compile built",
        "samples.steps.by_rank[].slow": "map: the rank's slow steps: n_slow, periodic, interval, lost_share, median_s, slow_median_s",
        "samples.steps.by_rank[].slow.n_slow": "int: slow steps",
        "samples.steps.by_rank[].slow.periodic": "bool: they come at a fixed interval",
        "samples.steps.by_rank[].slow.interval": "int: that interval in steps",
        "samples.steps.by_rank[].slow.lost_share": "float: time above the median spent in them / all step time",
        "samples.steps.by_rank[].slow.median_s": "float: median step time in seconds",
        "samples.steps.by_rank[].slow.slow_median_s": "float: median time of the slow steps in seconds",
        "samples.steps.n_steps": "int: step records read",
        "samples.steps.ranks": "list<int>: ranks with step records",
    }

    # -- offline ---------------------------------------------------------------------------


    def observed_state(self, facts: dict[str, Any]) -> str:
        """A sampling window sees hundreds of stacks per rank where snapshots see a few: ranks
        that wait 99 % of each step for a straggler look frozen in every snapshot, but in a
        window they leave the collective now and then. When there is one, it decides."""
        progress = (facts.get("samples") or {}).get("progress")
        return str(progress) if progress in ("hung", "progressing") else ""

    def sniff(self, sample: Sample) -> bool:
        raw = sample.raw
        # bounded finds, not slices: this runs on every file of a folder (16k stack dumps), and
        # each slice or split copied the sample's head again only to search it once
        if raw.find(b"\x00", 0, 4096) != -1:
            return False
        if raw.find(_META_NEEDLE, 0, 400) != -1:
            return True
        end = raw.find(b"\n")  # the first line: STEPS_SCHEMA must lie inside it
        if raw.find(_STEPS_NEEDLE, 0, len(raw) if end == -1 else end) != -1 \
                and raw[:len(raw) if end == -1 else end].lstrip().startswith(b"{"):
            return True
        if raw.find(b"speedscope.app/file-format-schema", 0, 2000) != -1:
            return True
        # every raw line ends "...) COUNT": one C-level test spares the rest (the regex engine's
        # literal search looks for the rarer ")" first: twice as fast as `in` on a stack dump)
        if _PAREN_SPACE.search(raw) is None:
            return False
        lines = [ln for ln in sample.text.splitlines()[:40] if ln.strip()]
        if not lines:
            return False
        complete = lines[:-1] if len(lines) > 1 and sample.size > len(raw) else lines  # last may be cut
        ok = py = 0
        for ln in complete:
            m = RAW_LINE.match(ln.rstrip())
            if not m:
                continue
            parts = m.group(1).split(";")
            frames = [p for p in parts if not (THREAD_HDR.match(p) or PROC_HDR.match(p))]
            if frames and all(parse_frame(p) is not None for p in frames):
                ok += 1
                py += any(".py:" in p for p in frames)
        return ok >= max(1, int(0.9 * len(complete))) and py > 0

    def parse(self, path: Path, rel: str, hints: Hints) -> Parsed:
        sample = Sample.read(path)
        head = sample.raw[:400]
        if META_SCHEMA.encode() in head:
            try:
                doc = json.loads(path.read_text(encoding="utf-8", errors="replace"))
            except ValueError as exc:
                raise EvidenceError(rel, f"not valid JSON ({exc})") from None
            if not isinstance(doc, dict) or doc.get("schema") != META_SCHEMA:
                raise EvidenceError(rel, f"not an {META_SCHEMA} document")
            return Parsed(self.name, rel, {"type": "meta", "doc": doc}, None, doc.get("host") or hints.host)
        if STEPS_SCHEMA.encode() in sample.raw.split(b"\n", 1)[0]:
            data = parse_steps(path, rel, hints)
            return Parsed(self.name, rel, data, data["rank"], data["header"].get("host") or hints.host)
        text = path.read_text(encoding="utf-8", errors="replace")
        if b"speedscope.app/file-format-schema" in sample.raw[:2000]:
            try:
                doc = json.loads(text)
            except ValueError as exc:
                raise EvidenceError(rel, f"speedscope file is not valid JSON ({exc})") from None
            pf = parse_speedscope(doc, rel)
        else:
            pf = parse_raw(text, rel)
        main = main_thread(pf)
        if main is None or not main.stacks:
            raise EvidenceError(rel, "no main-thread samples")
        return Parsed(self.name, rel, {"type": "profile", "fmt": pf.fmt, "main": main, "threads": len(pf.threads),
                                       "thread_ids": pf.thread_ids, "pid": main.pid or hints.pid},
                      hints.rank, hints.host, pf.notes)

    def build(self, parsed: list[Parsed], facts: dict[str, Any]) -> None:
        metas = [p.data["doc"] for p in parsed if p.data["type"] == "meta"]
        profiles = [p for p in parsed if p.data["type"] == "profile"]
        steps = [p.data for p in parsed if p.data["type"] == "steps"]
        lines: dict[str, str] = {}
        window: dict[str, Any] = {}
        errors: list[str] = []
        pid_rank: dict[tuple[str, int], int] = {}
        # A slice that extends an earlier round's window (``continues``) is part of that window:
        # its samples join it and its seconds add to its length (one window, not two).
        window_of: dict[int, int] = {}
        lengths: dict[tuple[str, int], float] = {}
        for m in metas:
            rnd = m.get("round") if isinstance(m.get("round"), int) else -1
            wid = m["continues"] if isinstance(m.get("continues"), int) else rnd
            window_of[rnd] = wid
            key = (str(m.get("host") or ""), wid)
            lengths[key] = lengths.get(key, 0.0) + float(m.get("duration_s") or 0)
        for m in metas:
            lines.update({k: str(v) for k, v in (m.get("lines") or {}).items()})
            if not window or float(m.get("duration_s") or 0) > float(window.get("duration_s") or 0):
                window = {k: m.get(k) for k in ("rate_hz", "duration_s", "nonblocking", "native")}
            for r in m.get("ranks") or []:
                if isinstance(r, dict) and isinstance(r.get("pid"), int) and isinstance(r.get("rank"), int):
                    pid_rank[(str(m.get("host") or ""), r["pid"])] = r["rank"]
                if isinstance(r, dict) and not r.get("ok", True):
                    errors.append(f"rank {r.get('rank')} (pid {r.get('pid')}): {r.get('reason', 'failed')}")
        if window and lengths:
            window["duration_s"] = round(max(lengths.values()), 3)
        out: dict[str, Any] = {"formats": sorted({p.data["type"] if p.data["type"] != "profile" else p.data["fmt"]
                                                  for p in parsed}),
                               "window": window, "errors": errors[:50]}
        # one Profile per rank (several windows of a rank are added up)
        per_rank: dict[int, ts.Profile] = {}
        per_window: dict[int, dict[int, ts.Profile]] = {}
        info: dict[int, dict[str, Any]] = {}
        unranked = [p for p in profiles if p.rank is None and pid_rank.get((p.host or "", p.data["pid"] or -1)) is None]
        for p in profiles:
            rank = p.rank
            if rank is None:
                rank = pid_rank.get((p.host or "", p.data["pid"] or -1))
            if rank is None:
                # loose files without a rank in their name: one file is a single-process job
                rank = unranked.index(p) if len(unranked) > 1 else 0
            prof = per_rank.setdefault(rank, ts.Profile())
            wm = _WINDOW.search(p.path.rsplit("/", 1)[-1])
            wid = window_of.get(int(wm.group(1)), int(wm.group(1))) if wm else 0
            wprof = per_window.setdefault(wid, {}).setdefault(rank, ts.Profile())
            for stack, n in p.data["main"].stacks.items():
                prof.add(stack, n)
                wprof.add(stack, n)
            inf = info.setdefault(rank, {"pid": p.data["pid"], "main_thread": p.data["main"].name,
                                         "threads": p.data["threads"], "files": 0})
            inf["files"] += 1
            if p.host:
                inf["host"] = p.host
        by_rank: dict[str, dict[str, Any]] = {}
        sums = []
        for rank in sorted(per_rank):
            summ = per_rank[rank].summarize(lines)
            summ.update(info[rank])
            by_rank[str(rank)] = summ
            sums.append(sum(summ["shares"].values()))
        if by_rank:
            set_world_size(facts, max(per_rank) + 1)
        keys = list(ts.CATEGORIES) + ["data", "busy", "waiting", "checkpoint"]

        def val(summ: dict[str, Any], k: str) -> float:
            return float(summ["shares"][k]) if k in ts.CATEGORIES else float(summ[k])

        vals = {k: {int(r): val(s, k) for r, s in by_rank.items()} for k in keys}
        out.update({
            "ranks": sorted(per_rank), "n_ranks": len(per_rank),
            "rate_hz": int(window.get("rate_hz") or 0), "duration_s": float(window.get("duration_s") or 0.0),
            "samples_total": sum(p.total for p in per_rank.values()),
            "categories": list(ts.CATEGORIES),
            "by_rank": by_rank,
            "mean": {k: round(sum(v.values()) / len(v), 4) if v else 0.0 for k, v in vals.items()},
            "median": {k: round(statistics.median(v.values()), 4) if v else 0.0 for k, v in vals.items()},
            "max": {k: round(max(v.values()), 4) if v else 0.0 for k, v in vals.items()},
            "max_rank": {k: max(v, key=lambda r, v=v: (v[r], -r)) if v else -1 for k, v in vals.items()},
            "notable": {k: sorted(r for r, x in v.items() if x >= NOTABLE_SHARE) for k, v in vals.items()},
            "frozen_ranks": sorted(int(r) for r, x in by_rank.items()
                                   if x["samples"] >= ts.MIN_SAMPLES and x["still"] >= ts.FROZEN_SHARE),
            "progress": ts.progress({int(r): x for r, x in by_rank.items()}),
            "share_sum_min": round(min(sums), 4) if sums else 0.0,
            "share_sum_max": round(max(sums), 4) if sums else 0.0,
            "collective_ops": _mean_ops(by_rank, "collective_ops"),
            "hot": _hot_overall(by_rank),
        })
        windows_over = dict.fromkeys(ts.WINDOW_KEYS, 0)
        for wranks in per_window.values():
            summs = [w.summarize(lines, hot=0) for w in wranks.values() if w.total >= ts.MIN_SAMPLES]
            for k in ts.WINDOW_KEYS:
                if any(val(x, k) >= ts.WINDOW_SHARE for x in summs):
                    windows_over[k] += 1
        out["n_windows"] = len(per_window)
        out["windows_over"] = windows_over
        strag = ts.stragglers({int(r): s for r, s in by_rank.items()})
        _attribute(strag, by_rank, facts)
        out["straggler"] = strag
        if steps:
            out["steps"] = summarize_steps(steps)
            ws = max((int(d["header"].get("world_size") or 0) for d in steps), default=0)
            set_world_size(facts, ws)
        facts[self.name] = out

    # -- live ------------------------------------------------------------------------------

    def collect(self, ctx: CollectContext) -> dict[str, Any]:
        exe = find_pyspy()
        if exe is None:
            raise ProbeSkipped("py-spy is not installed (pip install py-spy); no sampling profile")
        ranks = ctx.ranks
        if not ranks:
            raise ProbeSkipped("no rank processes on this host")
        duration = max(1, math.ceil(float(ctx.options.get("duration") or DEFAULT_DURATION)))
        rate = int(ctx.options.get("rate") or DEFAULT_RATE)
        native = bool(ctx.options.get("native"))
        tmp = Path(tempfile.mkdtemp(prefix="mldoctor-samples-"))
        procs: list[tuple[Any, subprocess.Popen[bytes], Path, float]] = []
        try:
            for rp in ranks:
                out = tmp / f"rank{rp.rank}-{rp.pid}.txt"
                argv = [exe, "record", "--pid", str(rp.pid), "--duration", str(duration), "--rate", str(rate),
                        "--idle", "--threads", "--full-filenames", "--format", "raw", "--output", str(out)]
                argv.append("--native" if native else "--nonblocking")
                try:
                    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT)
                except OSError as exc:
                    raise ProbeFailed(f"cannot run py-spy: {exc.strerror or exc}") from None
                procs.append((rp, p, out, time.monotonic()))
            ended = _end_early(ctx, procs)
            deadline = time.monotonic() + duration + 15.0
            results = []
            for rp, p, out, t0 in procs:
                try:
                    text, _ = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()  # our own py-spy, never the job
                    text, _ = p.communicate()
                    results.append((rp, out, False, "py-spy did not finish in time", 0, 0, time.monotonic() - t0))
                    continue
                msg = text.decode("utf-8", "replace")
                m = PYSPY_DONE.search(msg)
                ok = p.returncode == 0 and out.is_file() and out.stat().st_size > 0
                reason = "" if ok else failure(p.returncode, msg, rp.pid)
                results.append((rp, out, ok, reason, int(m.group(1)) if m else 0, int(m.group(2)) if m else 0,
                                time.monotonic() - t0))
            # An ended window lasted until its samplers stopped: at most their wall time (which
            # includes py-spy's start) and never more than the length asked.
            took = round(min(float(duration), max((r[6] for r in results), default=duration)), 2) \
                if ended else float(duration)
            meta_ranks = []
            lines: dict[str, str] = {}
            cache: dict[str, list[str] | None] = {}
            good = 0
            for rp, out, ok, reason, n, errs, wall in results:
                entry = {"rank": rp.rank, "pid": rp.pid, "ok": ok, "reason": reason, "samples": n,
                         "errors": errs, "wall_s": round(wall, 3)}
                if ok:
                    text = out.read_text(encoding="utf-8", errors="replace")
                    name = f"samples-r{ctx.round}-rank{rp.rank}.txt"
                    entry["file"] = name
                    ctx.add(name, text, rank=rp.rank, pid=rp.pid,
                            meta={"rate_hz": rate, "duration_s": took, "native": native,
                                  "command": f"py-spy record --idle --threads -f raw -r {rate} -d {duration} "
                                             + ("--native" if native else "--nonblocking") + f" --pid {rp.pid}"})
                    try:
                        pf = parse_raw(text, name)
                        lines.update(source_lines(rp.pid, main_thread(pf), cache))
                    except EvidenceError:
                        pass
                    good += 1
                meta_ranks.append(entry)
            doc = {"schema": META_SCHEMA, "host": ctx.host, "round": ctx.round, "rate_hz": rate,
                   "duration_s": took, "nonblocking": not native, "native": native,
                   "ranks": meta_ranks, "lines": lines}
            if ended:
                doc.update({"asked_s": duration, "ended_early": ended})
            if isinstance(ctx.options.get("continues"), int):  # a further slice of an earlier round's window
                doc["continues"] = ctx.options["continues"]
            ctx.add(f"samples-r{ctx.round}-window.json", json.dumps(doc, indent=1))
        finally:
            for _rp, p, _out, _t0 in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            shutil.rmtree(tmp, ignore_errors=True)
        if not good:
            first = next((e["reason"] for e in meta_ranks if e["reason"]), "every py-spy record failed")
            raise ProbeFailed(first)
        return {"ranks": good, "duration_s": took, "rate_hz": rate, "ended_early": ended}


def _end_early(ctx: CollectContext, procs: list[tuple[Any, subprocess.Popen[bytes], Path, float]]) -> str:
    """With ``stop_after_steps`` N among the options (the live loop's adaptive window; never a
    window the user sized), end the window once every sampled rank's log named N new step
    numbers and ``min_window_s`` seconds have passed (``StepWatch``): SIGINT makes each of our
    own py-spy processes stop and write what it sampled. Returns why it ended early ('' when
    it ran its course: no counter to watch, a rank without progress, or the window was over)."""
    need = int(ctx.options.get("stop_after_steps") or 0)
    if not need or not procs or any(rp.rank is None for rp, *_ in procs):
        return ""
    watch = StepWatch([(rp.rank, rp.pid) for rp, *_ in procs], need)
    try:
        if not watch.usable():
            return ""
        why = wait_decisive(watch, lambda: any(p.poll() is None for _, p, *_ in procs),
                            float(ctx.options.get("min_window_s") or 1.0))
    finally:
        watch.close()
    if why:
        for _rp, p, *_ in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)  # our own py-spy, never the job
    return why


def _mean_ops(by_rank: dict[str, dict[str, Any]], key: str) -> dict[str, float]:
    acc: dict[str, float] = {}
    for s in by_rank.values():
        for op, v in s.get(key, {}).items():
            acc[op] = acc.get(op, 0.0) + float(v)
    n = len(by_rank) or 1
    return {op: round(v / n, 4) for op, v in sorted(acc.items(), key=lambda kv: -kv[1])}


def _hot_overall(by_rank: dict[str, dict[str, Any]], top: int = 8) -> list[dict[str, Any]]:
    acc: dict[str, dict[str, Any]] = {}
    n = len(by_rank) or 1
    for r, s in by_rank.items():
        for h in s.get("hot", []):
            e = acc.setdefault(h["where"], {"where": h["where"], "share": 0.0, "category": h["category"],
                                            "text": h["text"], "ranks": []})
            e["share"] += h["share"] / n
            e["ranks"].append(int(r))
    out = sorted(acc.values(), key=lambda e: -e["share"])[:top]
    for e in out:
        e["share"] = round(e["share"], 4)
        e["ranks"] = sorted(e["ranks"])
    return out


def _attribute(strag: dict[str, Any], by_rank: dict[str, dict[str, Any]], facts: dict[str, Any]) -> None:
    """Refine a compute-bound straggler's cause with the GPU and host facts when present: a
    throttled or slower GPU says gpu; a rank that gets little CPU while it computes, or a
    host loaded past its cores, says host."""
    ev: list[str] = []
    if strag.get("detected"):
        ranks = strag["ranks"]
        for r in ranks:
            s = by_rank[str(r)]
            ev.append(f"rank {r}: {s['shares'].get('collective', 0):.0%} in collectives, "
                      f"{s['data']:.0%} loading data, {s['busy']:.0%} computing (top: {s['top']})")
        ev.append(f"the other ranks wait in collectives {strag['peers_collective']:.0%} of the time (median)")
        if strag["cause"] == "compute":
            gpu = facts.get("gpu") or {}
            gbr = gpu.get("by_rank") or {}
            thr = {int(r) for t in gpu.get("throttled") or [] for r in (t.get("ranks") or [])}
            bad_gpu = [r for r in ranks if r in thr or (gbr.get(str(r)) or {}).get("throttle_fault")]
            procs = (facts.get("procs") or {}).get("by_rank") or {}
            system = facts.get("system") or {}
            cores = int(system.get("affinity_cores") or system.get("cores") or 0)
            load = float(system.get("load1") or 0.0)
            starved = [r for r in ranks if isinstance((procs.get(str(r)) or {}).get("cpu_pct"), (int, float))
                       and procs[str(r)]["cpu_pct"] < 60.0 and by_rank[str(r)]["busy"] >= 0.5]
            if bad_gpu:
                strag["cause"] = "gpu"
                ev.append(f"GPU of rank(s) {bad_gpu} throttled or behind its peers (gpu probe)")
            elif starved or (cores and load > 1.5 * cores):
                strag["cause"] = "host"
                if starved:
                    ev.append(f"rank(s) {starved} computing but getting under 60% of a core (procs)")
                if cores and load > 1.5 * cores:
                    ev.append(f"load average {load:.1f} on {cores} cores (system)")
    strag["evidence"] = ev
    if strag.get("detected"):
        why = {"input": "the input pipeline (loading data)", "compute": "more compute than the others",
               "gpu": "the GPU (throttled or behind its peers)", "host": "the host's CPU", "io": "file/checkpoint I/O",
               "compile": "torch.compile compiling", "host_sync": "waiting for the device",
               "gc": "garbage collection", "logging": "logging"}.get(strag["cause"], strag["category"])
        names = ", ".join(str(r) for r in strag["ranks"])
        one = len(strag["ranks"]) == 1
        strag["detail"] = (f"rank{'' if one else 's'} {names} spend{'s' if one else ''} "
                           f"{strag['straggler_collective']:.0%} of {'its' if one else 'their'} time in collectives "
                           f"while the other ranks wait there {strag['peers_collective']:.0%} of theirs; "
                           f"{'it is' if one else 'they are'} slowed by {why}")


PROBE = SamplesProbe()
