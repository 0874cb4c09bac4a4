"""How long a rule-asked sampling window lasts, and when to start it early.

A rule asks for a sampling window (PERF011: some ranks moved between snapshots, others did not)
because a few snapshots cannot tell a rank that waits 99% of each step for a straggler from one
that waits forever. The window does not need to be long to settle that; it needs to cover a few
steps. A waiting rank that leaves its wait even once during the window is progressing, and 50
samples a second show where every rank's time goes after a second or two. Only when the window
is still ambiguous (a waiting rank never left its wait, which a long step could also explain)
does a longer look pay. So the window here is adaptive:

* the first slice lasts ``max(MIN_SLICE, STEPS_PER_SLICE x step time)`` when a step time is known
  (from a metrics log or the in-job step timer), else ``MIN_SLICE``, never past ``--duration``;
* after it, the analysis runs; if the samples show a rank that never left its wait, or the slice
  covered fewer than ``STEPS_PER_SLICE`` steps, the agent takes one more slice, up to the full
  ``--duration`` (the old fixed window), so a hang is still told from a slow step with the same
  evidence as before;
* when the two stack/process readings of the first pass already show most ranks' main threads
  waking up (a job that makes progress, whose only open question is healthy or straggler, which
  only samples answer), the first slice starts *early*, right after the first pass, while the
  rules compile. When it has ended by the time they are compiled, the first analysis reads it
  with the rest of the first pass (one analysis instead of a second one after a rule asked for
  the window, and no wait); when it still runs, the first analysis goes ahead without it and its
  held artifacts enter the bundle only if a rule asks for a window, as before.

* a rule-asked slice (first, early or extended) ends before its length once the evidence is
  decisive: every sampled rank's own step counter, read from the log lines it writes during the
  slice (``step 120``, ``iter=120`` ... attributed by the ``[rankN]:`` prefix, a ``rank N`` in
  the line, or a log only that rank writes), named ``STEPS_PER_SLICE`` new step numbers, and the
  slice has lasted ``MIN_EARLY_S``. Then no rank is hung, the slice spans the steps a verdict
  needs, and the samples already hold at least 50 per rank. A rank that logs no step, a log
  that is a pipe, or a hang (no new step anywhere) leaves the slice its full length, so hung
  versus slow is told from the same evidence as before (``probes/samples/live.py StepWatch``).

A ``--symptom slow`` window is the user's and keeps its ``--duration``.
"""

from __future__ import annotations

import math
from typing import Any

from doctor.engine import facts as facts_mod
from doctor.evidence import plugins
from doctor.evidence.bundle import Bundle

#: Shortest slice (s): 2 s at 50 Hz is 100 samples per rank, five times the minimum the time
#: shares need (probes/samples/timeshare.py MIN_SAMPLES), and a fast step (<0.7 s) repeats 3+ times.
MIN_SLICE = 2.0
#: Steps a slice should cover for a waiting rank to have left its wait at least a few times.
STEPS_PER_SLICE = 3.0
#: Shortest slice that may end early on step evidence (s): 50 samples per rank at 50 Hz, 2.5
#: times what the time shares need (MIN_SAMPLES), so a cut slice still measures every rank.
MIN_EARLY_S = 1.0


def early_end() -> dict[str, Any]:
    """The sampling probe's options that let a rule-asked slice end once it is decisive (see
    the module docstring): stop after every rank's log named ``STEPS_PER_SLICE`` new step
    numbers, never before ``MIN_EARLY_S``."""
    return {"stop_after_steps": int(STEPS_PER_SLICE), "min_window_s": MIN_EARLY_S}


def step_time(facts: dict[str, Any]) -> float | None:
    """The job's step time in seconds when some evidence measured it (a metrics log's timing
    column or the in-job step timer), else ``None``."""
    for path in (("metrics", "step_time", "median"), ("samples", "steps", "step_time_median")):
        node: Any = facts
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, (int, float)) and not isinstance(node, bool) and node > 0:
            return float(node)
    return None


def first_slice(facts: dict[str, Any] | None, duration: float) -> float:
    """Length of the first slice of a rule-asked window: enough for ``STEPS_PER_SLICE`` steps,
    at least ``MIN_SLICE``, never more than the configured ``duration``; whole seconds, since
    py-spy rounds a window up."""
    st = step_time(facts or {})
    want = max(MIN_SLICE, STEPS_PER_SLICE * st) if st else MIN_SLICE
    return float(max(1, math.ceil(min(want, duration))))


def still_ambiguous(facts: dict[str, Any], taken: float) -> str:
    """Why the window taken so far cannot settle hung versus slow ('' when it can).

    Ambiguous: the samples say hung (the waiting ranks never left their collective: a hang, or a
    step longer than the window), or could not tell at all (too few samples), or some rank's
    samples all stood on one stack while its main thread never woke up between the process
    readings either (a waiting rank whose thread wakes every step is a waiter, not a hang), or a
    known step time says the slices so far covered fewer than ``STEPS_PER_SLICE`` steps."""
    sm = facts.get("samples") or {}
    if not sm:
        return ""
    st = step_time(facts)
    if st and taken < STEPS_PER_SLICE * st:
        return f"the window covered {taken:g} s, under {STEPS_PER_SLICE:g} steps of {st:.2g} s"
    if not sm.get("progress"):
        return "too few samples to tell"
    frozen = sorted(set(sm.get("frozen_ranks") or []) - set((facts.get("procs") or {}).get("main_waking_ranks") or []))
    if sm.get("progress") == "hung":
        return "the waiting ranks never left their collective"
    if frozen:
        return f"rank(s) {', '.join(str(r) for r in frozen)} never left their wait nor woke up"
    return ""


def progress_likely(bundle: Bundle) -> bool:
    """From the first pass's process readings only (cheap: two small files): did the main thread
    of at least half of the ranks wake up between the readings? A rank parked in a hang does
    not wake; a training loop wakes many times a second. Then the job progresses and the open
    question, if any, is healthy or straggler: worth starting a sampling slice early."""
    kinds = {p.name for p in plugins.probes() if p.live_snapshots and p.name != "stacks"}
    items = [i for i in facts_mod.items_from_bundle(bundle) if i.kind in kinds]
    if not items:
        return False
    try:
        facts, _ = facts_mod.build(items, "live")
    except Exception:  # a gate, not a verdict: any trouble means no early slice
        return False
    pr = facts.get("procs") or {}
    alive = pr.get("ranks_on_host") or []
    waking = set(pr.get("main_waking_ranks") or [])
    return int(pr.get("snapshots") or 0) >= 2 and len(alive) >= 2 and 2 * len(waking & set(alive)) >= len(alive)
