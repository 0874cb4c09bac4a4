"""Where the step time goes: classify sampled stacks into time shares, find the straggler.

A sampling profile (``py-spy record --idle``) is a bag of stacks with counts. Each main-thread
stack is put into one category (waiting for data, in a collective, forward, backward, the optimizer,
host-device sync, checkpoint I/O, logging, torch.compile, GC, other waits, idle) and the counts
become shares of the sampled window, per rank. The frame tables are those of
``doctor.probes.stacks.classify`` (the wait states of the hang classifier, plus its ``PHASES`` for running
code); this module only maps them to categories and adds one thing the frames cannot show: the
source line a sample stands on (``loss.item()`` is a C call, so py-spy's innermost Python frame is
the caller's line, and only its text says it reads a tensor back to the host).

Cross-rank: ranks that keep computing while their peers wait in collectives are stragglers; the
category that dominates the straggler's own time says why (its input pipeline, its compute, its
I/O, ...). Thresholds are module constants, named and sourced below. No torch, no pandas.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

from doctor.probes.stacks import classify as ss

#: Categories of a main-thread sample, in report order, with what each means.
CATEGORIES: dict[str, str] = {
    "data_wait": "waiting for the next batch from DataLoader worker processes",
    "data_fetch": "loading the batch in the training process itself (num_workers=0 dataset code, collate, pin_memory)",
    "collective": "in torch.distributed collectives (waiting for peers or transferring); split by op",
    "forward": "model forward (nn.Module calls, compiled graphs)",
    "backward": "autograd backward",
    "optimizer": "optimizer step, gradient clipping",
    "compute": "other running Python: loss, metrics, user code the tables do not place",
    "host_sync": "waiting for the device or reading tensors back to the host: .item(), .cpu(), .tolist(), synchronize",
    "io": "checkpoint and file I/O: torch.save/load, safetensors, DCP, fsync, file writes",
    "logging": "logging, printing, experiment trackers, progress bars",
    "compile": "torch.compile: Dynamo tracing, AOTAutograd, Inductor/Triton compilation",
    "gc": "Python garbage collection (only visible with native frames)",
    "other_wait": "waiting on locks, queues, child processes, sockets or process-group setup",
    "idle": "sleeping, or no Python frames",
}
DATA = ("data_wait", "data_fetch")
BUSY = ("forward", "backward", "optimizer", "compute", "compile")
WAITING = ("collective", "data_wait", "other_wait", "idle")

#: classifier io ops that are logging rather than checkpoint/file I/O.
LOGGING_IO_OPS = frozenset({"logging", "tensorboard"})
#: io ops (classifier) and line ops (below) that are checkpoint writes or reads.
CHECKPOINT_OPS = frozenset({"torch.save", "torch.load", "safetensors", "dcp", "shutil", "fsync",
                            "save_pretrained", "numpy", "h5py"})

# --- thresholds -------------------------------------------------------------------------------
#: DataLoader share of step time above which it is worth a finding: torch-tb-profiler's rule
#: ("DataLoader > 5% of step time"), see knowledge/perf-health-stability-anchors.md section 4.
DATA_SHARE_WORTH = 0.05
#: Above this the input pipeline is a primary bottleneck (the anchors' proposal, about 15%).
DATA_SHARE_HIGH = 0.15
#: A straggler: its peers spend at least this share in collectives (waiting for someone) ...
STRAGGLER_PEER_WAIT = 0.30
#: ... and it spends at least this much less (absolute) and at most half of its peers' median.
STRAGGLER_GAP = 0.25
#: Fewer main-thread samples than this per rank say nothing (50 Hz x 10 s gives about 500).
MIN_SAMPLES = 20
#: A rank is frozen in a window when (all but rounding of) its samples have one Python stack,
#: lines included: a blocked wait or one endless line. A rank waiting for a straggler still
#: leaves its collective once per step, so a few samples land elsewhere.
FROZEN_SHARE = 0.999
#: A category counts in a sampling window when some rank spends this share in it; compile and
#: checkpoint time in two windows apart is a pattern, in one it may be start-up or a rare save.
WINDOW_SHARE = 0.10
WINDOW_KEYS = ("compile", "checkpoint", "host_sync", "data")
#: A slow step in a step-time series: this many times the median (and 50 ms above it).
SLOW_STEP_FACTOR = 3.0
SLOW_STEP_MIN_EXTRA_S = 0.05
#: Slow steps are periodic when this share of the steps at one interval and offset are slow.
PERIODIC_AGREEMENT = 0.7

# --- source lines -----------------------------------------------------------------------------
#: What the text of the line a running sample stands on says it does. Only consulted for samples
#: the frame tables call running code, on the innermost Python frame (a C call such as
#: ``.item()`` leaves no frame of its own). ``(regex, category, op, why)``.
LINE_PATTERNS: list[tuple[re.Pattern[str], str, str, str]] = [
    (re.compile(r"\.(item|tolist)\(\s*\)"), "host_sync", "item",
     ".item()/.tolist() copy a value to the host; on a GPU each call waits for every queued kernel"),
    (re.compile(r"\.(cpu|numpy)\(\s*\)|\.to\(\s*['\"]cpu['\"]|\.to\(\s*device\s*=\s*['\"]cpu['\"]"), "host_sync", "cpu",
     ".cpu()/.numpy()/.to('cpu') copy a tensor to the host and wait for it"),
    (re.compile(r"\b(cuda|torch\.cuda|stream|event)\.synchronize\(|\bsynchronize\(\s*\)"), "host_sync", "synchronize",
     "an explicit device synchronize"),
    (re.compile(r"\bsys\.(stdout|stderr)\.write\(|\bprint\("), "logging", "print",
     "writing to stdout/stderr (a full pipe or a slow terminal blocks here)"),
    (re.compile(r"\b(os\.)?f(data)?sync\("), "io", "fsync", "fsync waits for the data to reach the disk"),
    (re.compile(r"\btorch\.save\(|\.save_pretrained\(|\bsave_file\("), "io", "torch.save", "a checkpoint save call"),
    (re.compile(r"\bopen\(|\.write\(|\.flush\(\s*\)|\bshutil\."), "io", "file", "file open/close/write/flush"),
    (re.compile(r"\b(log|logger|logging|LOG|LOGGER)\.(info|debug|warning|warn|error|exception|log)\(|\bwandb\.log\(|\.add_scalars?\("),
     "logging", "print", "printing or logging a record"),
    (re.compile(r"\btime\.sleep\(|\bsleep\("), "idle", "sleep", "an explicit sleep"),
]


def line_category(text: str) -> tuple[str, str] | None:
    """(category, op) that a source line's text implies, or None."""
    for rx, cat, op, _why in LINE_PATTERNS:
        if rx.search(text):
            return cat, op
    return None


def _from_state(state: str, op: str) -> tuple[str, str] | None:
    """The category of a classifier wait state; None for running code (decided by phases)."""
    if state == "collective":
        return "collective", op or "wait"
    if state == "dataloader_wait":
        return "data_wait", op
    if state == "dataloader_fetch":
        return "data_fetch", op
    if state == "io":
        return ("logging", op) if op in LOGGING_IO_OPS else ("io", op)
    if state == "cuda_sync":
        return "host_sync", op
    if state == "gc":
        return "gc", "gc"
    if state in ("lock_wait", "ipc_wait"):
        return "other_wait", op
    if state == "init":
        return "other_wait", "init"
    if state == "sleeping":
        return "idle", op
    if state == "idle":
        return "idle", ""
    return None


#: Wait states that, under torch.compile's compiler, are compile time (waiting for the compile
#: worker pool, writing generated code), not the job's own waits.
_COMPILE_WAITS = frozenset({"lock_wait", "ipc_wait", "sleeping", "io", "unknown"})


def classify_stack(frames: tuple[ss.Frame, ...], lines: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(category, op) of one main-thread sample; ``frames`` innermost first, as the classifier wants.

    Order: a wait state decides (a collective, a DataLoader wait, a file write), except that
    generic waits inside torch.compile's compiler are compile time; then for running code compile
    and logging anywhere in the stack; then the text of the innermost Python line (``.item()``,
    ``fsync``); then the outermost forward/backward/optimizer frame; else compute.
    """
    if not frames:
        return "idle", ""
    v = ss.classify(frames, None)
    phase, op = ss.phase_of(frames)
    if phase == "compile" and v.state in _COMPILE_WAITS:
        return phase, op
    cat = _from_state(v.state, v.op)
    if cat is not None:
        return cat
    if phase in ("compile", "logging"):
        return phase, op
    if lines and not frames[0][3]:
        text = lines.get(f"{frames[0][1]}:{frames[0][2]}")
        if text:
            hit = line_category(text)
            if hit is not None:
                return hit
    if phase:
        return phase, op
    return "compute", ""


_GENERATED = re.compile(r"/torchinductor_[^/]*/|^<eval_with_key>|codegen\(|^<string>|^<frozen ")


def user_site(frames: tuple[ss.Frame, ...]) -> str:
    """``file:line`` of the innermost frame of the user's own code (for the hot-lines list);
    code torch generates (Inductor's cache, FX graphs) is not the user's."""
    for fr in frames:
        if not fr[3] and not ss.is_library(fr[1]) and not _GENERATED.search(fr[1]):
            return f"{fr[1]}:{fr[2]}"
    return ""


class Profile:
    """One rank's main-thread samples: counts per distinct stack, classified once per stack."""

    def __init__(self) -> None:
        self.stacks: dict[tuple[ss.Frame, ...], int] = {}
        self.total = 0

    def add(self, frames: tuple[ss.Frame, ...], count: int) -> None:
        self.stacks[frames] = self.stacks.get(frames, 0) + count
        self.total += count

    def summarize(self, lines: Mapping[str, str] | None = None, hot: int = 5) -> dict[str, Any]:
        """Shares per category (sum 1.0), collective/io ops, the hottest user lines."""
        counts = dict.fromkeys(CATEGORIES, 0)
        coll: dict[str, int] = {}
        io_ops: dict[str, int] = {}
        sync_ops: dict[str, int] = {}
        compile_ops: dict[str, int] = {}
        sites: dict[str, list[Any]] = {}
        for frames, n in self.stacks.items():
            cat, op = classify_stack(frames, lines)
            counts[cat] += n
            if cat == "collective":
                coll[op] = coll.get(op, 0) + n
            elif cat == "io":
                io_ops[op] = io_ops.get(op, 0) + n
            elif cat == "host_sync":
                sync_ops[op] = sync_ops.get(op, 0) + n
            elif cat == "compile":
                compile_ops[op] = compile_ops.get(op, 0) + n
            site = user_site(frames)
            if site:
                entry = sites.setdefault(site, [0, {}])
                entry[0] += n
                entry[1][cat] = entry[1].get(cat, 0) + n
        tot = self.total or 1
        py_stacks: dict[tuple[ss.Frame, ...], int] = {}
        for frames, n in self.stacks.items():
            key = tuple(f for f in frames if not f[3])
            py_stacks[key] = py_stacks.get(key, 0) + n
        still = max(py_stacks.values()) / tot if py_stacks else 0.0

        def share(d: Mapping[str, int]) -> dict[str, float]:
            return {k: round(v / tot, 4) for k, v in sorted(d.items(), key=lambda kv: -kv[1])}

        shares = {k: round(v / tot, 4) for k, v in counts.items()}
        top = max(counts, key=lambda k: counts[k]) if self.total else "idle"
        hot_sites = []
        for site, (n, cats) in sorted(sites.items(), key=lambda kv: -kv[1][0])[:hot]:
            text = (lines or {}).get(site, "")
            hot_sites.append({"where": site, "share": round(n / tot, 4),
                              "category": max(cats, key=lambda c: cats[c]), "text": text[:160]})
        ckpt = sum(v for k, v in io_ops.items() if k in CHECKPOINT_OPS)
        return {
            "samples": self.total,
            "shares": shares,
            "top": top,
            "data": round(sum(counts[c] for c in DATA) / tot, 4),
            "busy": round(sum(counts[c] for c in BUSY) / tot, 4),
            "waiting": round(sum(counts[c] for c in WAITING) / tot, 4),
            "checkpoint": round(ckpt / tot, 4),
            "still": round(still, 4),
            "collective_ops": share(coll),
            "io_ops": share(io_ops),
            "sync_ops": share(sync_ops),
            "compile_ops": share(compile_ops),
            "hot": hot_sites,
        }


# --- cross-rank -------------------------------------------------------------------------------

def stragglers(by_rank: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """Ranks that compute while their peers wait for them in collectives.

    For each rank, its collective share is compared with the median of the *other* ranks: the
    peers must wait a lot (>= STRAGGLER_PEER_WAIT) and the rank much less (at least STRAGGLER_GAP
    less and at most half). Only a minority can be stragglers (if most ranks "compute" while a
    few wait, the few are simply fast). The cause is the straggler's largest non-collective
    category, named for the fix: input, compute, io, compile, host_sync, gc, logging, other.
    """
    ranks = [r for r in sorted(by_rank) if by_rank[r].get("samples", 0) >= MIN_SAMPLES]
    out: dict[str, Any] = {"detected": False, "ranks": [], "cause": "", "category": "",
                           "peers_collective": 0.0, "straggler_collective": 0.0, "detail": ""}
    if len(ranks) < 2:
        return out
    coll = {r: float(by_rank[r]["shares"].get("collective", 0.0)) for r in ranks}
    found = []
    for r in ranks:
        peers = [coll[p] for p in ranks if p != r]
        med = statistics.median(peers)
        if med >= STRAGGLER_PEER_WAIT and coll[r] <= med - STRAGGLER_GAP and coll[r] <= 0.5 * med:
            found.append(r)
    if not found or len(found) * 2 >= len(ranks):
        return out
    others = [coll[p] for p in ranks if p not in found]
    agg: dict[str, float] = {}
    for r in found:
        for cat, v in by_rank[r]["shares"].items():
            if cat != "collective":
                agg[cat] = agg.get(cat, 0.0) + float(v)
    category = max(agg, key=lambda c: agg[c]) if agg else ""
    out.update({
        "detected": True, "ranks": found, "category": category, "cause": cause_label(category),
        "peers_collective": round(statistics.median(others), 4),
        "straggler_collective": round(statistics.median(coll[r] for r in found), 4),
    })
    return out


def cause_label(category: str) -> str:
    """The straggler cause a category stands for (what to fix)."""
    if category in DATA:
        return "input"
    if category in ("forward", "backward", "optimizer", "compute"):
        return "compute"
    if category in ("io", "compile", "host_sync", "gc", "logging"):
        return category
    return "other"


# --- step-time series (doctor.torch helper) --------------------------------------------------

def periodic_slow_steps(steps: list[int], times: list[float]) -> dict[str, Any]:
    """Slow steps (SLOW_STEP_FACTOR x median) and whether they come at a regular interval.

    Periodic long steps at a fixed interval are the signature of synchronous checkpointing (or
    evaluation) every N steps; ``lost_share`` is the time above the median they cost.
    """
    res: dict[str, Any] = {"n_slow": 0, "periodic": False, "interval": 0, "lost_share": 0.0,
                           "slow_median_s": 0.0, "median_s": 0.0}
    if len(times) < 5:
        return res
    med = statistics.median(times)
    limit = max(SLOW_STEP_FACTOR * med, med + SLOW_STEP_MIN_EXTRA_S)
    slow = [(s, t) for s, t in zip(steps, times, strict=True) if t > limit]
    res["median_s"] = round(med, 6)
    res["n_slow"] = len(slow)
    if not slow:
        return res
    total = sum(times) or 1.0
    res["lost_share"] = round(sum(t - med for _, t in slow) / total, 4)
    res["slow_median_s"] = round(statistics.median(t for _, t in slow), 6)
    if len(slow) >= 3:
        k, _o = _period(steps, {st for st, _ in slow}, {st: t - med for st, t in slow})
        if k:
            res["periodic"] = True
            res["interval"] = k
    return res


def _period(steps: list[int], slow: set[int], extra: Mapping[int, float], max_k: int = 100) -> tuple[int, int]:
    """The smallest interval k (and offset) such that the steps ``s % k == offset`` are nearly all
    slow (PERIODIC_AGREEMENT of them, at least 3) and hold at least half of the time lost in slow
    steps; (0, 0) when none. Stray slow steps (a noisy neighbour) do not break the pattern, and
    they cannot make one: they do not fall into one residue class again and again."""
    lost = sum(extra.values()) or 1.0
    for k in range(2, min(max_k, max(2, len(steps) // 3)) + 1):
        members: dict[int, int] = {}
        hits: dict[int, int] = {}
        hit_lost: dict[int, float] = {}
        for st in steps:
            o = st % k
            members[o] = members.get(o, 0) + 1
            if st in slow:
                hits[o] = hits.get(o, 0) + 1
                hit_lost[o] = hit_lost.get(o, 0.0) + extra[st]
        for o, n in members.items():
            h = hits.get(o, 0)
            if h >= 3 and h / n >= PERIODIC_AGREEMENT and hit_lost.get(o, 0.0) >= 0.5 * lost:
                return k, o
    return 0, 0


@lru_cache(maxsize=1)
def category_docs() -> dict[str, str]:
    """Categories and their meaning (for the facts reference)."""
    return dict(CATEGORIES)


def merge_counts(items: Iterable[tuple[tuple[ss.Frame, ...], int]]) -> Profile:
    """A Profile from (frames, count) pairs."""
    p = Profile()
    for frames, n in items:
        p.add(frames, n)
    return p


def progress(by_rank: Mapping[int, Mapping[str, Any]]) -> str:
    """``hung`` or ``progressing`` from one sampling window; ``""`` with too few samples.

    A collective finishes only when every rank is in it, so when the ranks that mostly wait in
    collectives ever leave them, steps complete: progressing. When at least half of the ranks
    wait in collectives and none of them ever leaves its stack, the job is hung (whatever the
    others do: a rank evaluating alone forever is moving, but the job is not). Without
    collective waiters (a single process), the job is hung when most ranks are frozen.
    """
    ranks = [r for r in by_rank if by_rank[r].get("samples", 0) >= MIN_SAMPLES]
    if not ranks:
        return ""
    frozen = [r for r in ranks if by_rank[r]["still"] >= FROZEN_SHARE]
    waiters = [r for r in ranks if by_rank[r]["top"] == "collective" and by_rank[r]["shares"]["collective"] >= 0.5]
    if waiters and len(waiters) * 2 >= len(ranks):
        return "hung" if all(r in frozen for r in waiters) else "progressing"
    return "hung" if len(frozen) * 2 >= len(ranks) else "progressing"
