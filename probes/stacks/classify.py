"""Where a thread is, from its stack: the frame-pattern tables and the classifier.

A hung rank is diagnosed by *what its main thread waits for*: peers in a collective, a batch from
its DataLoader workers, a file write, the GPU, a lock another of its threads holds. The tables
in ``patterns/*.yaml`` map frames to those states. They are data (one entry per pattern, with the
reason it means what it says, its upstream source and real frames it must hit, checked by
tests/test_patterns.py), so a new library or a new torch version is a new entry, not a new branch.

Frames come innermost first (py-spy, faulthandler and gdb all print them that way) as tuples
``(name, file, line, native)``. The classifier looks at the whole stack, not only the top frame,
because the top is often a generic wait (``Condition.wait``, ``poll``, a futex) and the frame that
says *why* the thread waits is further out (``_try_get_data`` of the DataLoader, ``all_reduce``):

1. tier 1 (specific) patterns: the innermost match decides, unless it lists states it
   ``yields`` to and a frame further out matches one of them (a CUDA event wait inside an NCCL
   collective is the collective, not a stuck GPU);
2. tier 3 (generic) patterns, used only when no tier-1 pattern matched: the innermost decides
   (``Condition.wait`` called from user code is a lock wait);
3. nothing matched: ``python`` when the thread was running (or its activity is unknown),
   ``unknown`` when it was idle inside a call the Python frames do not show (sleep, a lock, a
   socket: native frames tell), ``idle`` when it has no frames at all.

Imported by the stacks probe and the sampling profile (doctor.probes.samples); no torch, no pandas.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from doctor.evidence.patterns import Pattern, load_library

#: The states a thread can be in, and what each means (documented in the facts schema too).
STATES: dict[str, str] = {
    "collective": "waiting in a torch.distributed collective or point-to-point op (or its Work.wait)",
    "init": "in process-group setup: init_process_group, rendezvous, TCPStore, new_group, first communicator",
    "dataloader_wait": "waiting for the next batch from DataLoader workers (worker result queue), or starting/stopping them",
    "dataloader_fetch": "running the dataset code itself (num_workers=0, or inside a DataLoader worker)",
    "io": "in file or network I/O: torch.save/load, safetensors, checkpoint writers, shutil, sockets, HTTP",
    "cuda_sync": "waiting for the GPU: synchronize, a device-to-host copy (.item(), .cpu()), CUDA init",
    "lock_wait": "waiting on a lock, condition, event, queue or future of its own process, or for the GIL",
    "ipc_wait": "waiting on a child process, a pipe or a multiprocessing queue/pool outside the DataLoader",
    "gc": "inside Python's garbage collector",
    "sleeping": "in time.sleep (native frames only) or asyncio.sleep",
    "python": "running Python code the tables do not know (user code, model code)",
    "unknown": "idle inside a call the Python frames do not explain (native frames would)",
    "idle": "no frames at all",
}

#: Point-to-point ops: ranks in send and recv at once are a normal pipeline, not a mismatch.
P2P_OPS = frozenset({"send", "recv", "send_recv"})
#: Ops whose type is unknown from the stack (a bare wait on a Work/tensor).
VAGUE_OPS = frozenset({"wait", "destroy_process_group"})

PATTERN_DIR = Path(__file__).with_name("patterns")


@cache
def library(name: str) -> tuple[Pattern, ...]:
    """One pattern library of this package, read once per process (every classifier table is
    built from these at import; tests and docs read them again for free)."""
    return tuple(load_library(PATTERN_DIR / f"{name}.yaml"))


def _collective_ops() -> dict[str, str]:
    """The id of each entry is the function name: a dict lookup by name is what the op needs
    (a frame's last name part, exactly), the regex is there for the library test."""
    out: dict[str, str] = {}
    for p in library("collective_ops"):
        if not p.regex.fullmatch(p.id):
            raise ValueError(f"collective_ops.yaml: {p.id}: the pattern must match its own id")
        out[p.id] = str(p.fields["op"])
    return out


def _table(name: str) -> list[dict[str, Any]]:
    """A frame table as the classifier has always read it: ``func`` and ``file`` regexes (the
    library's ``pattern`` is one of them, ``target`` says which), ``native``, ``tier``, ``yields``,
    ``why``."""
    out: list[dict[str, Any]] = []
    for p in library(name):
        f = p.fields
        row: dict[str, Any] = {"state": f["state"], "op": f["op"]}
        if "tier" in f:
            row["tier"] = int(f["tier"])
        if "native" in f:
            row["native"] = bool(f["native"])
        if f.get("target", "func") == "file":
            row["file"] = p.pattern
            if f.get("func"):
                row["func"] = f["func"]
        else:
            row["func"] = p.pattern
            if f.get("file"):
                row["file"] = f["file"]
        if f.get("yields"):
            row["yields"] = list(f["yields"])
        row["why"] = p.means
        out.append(row)
    return out


#: Collective function names (torch.distributed, functional collectives, DeepSpeed comm) and the
#: op type they perform: ranks in different *types* at once cannot all finish (a mismatch).
COLLECTIVE_OPS: dict[str, str] = _collective_ops()

# Op types read from native symbols (NCCL and gloo entry points, c10d work objects).
_NATIVE_OPS: list[tuple[re.Pattern[str], str]] = [(p.regex, str(p.fields["op"])) for p in library("native_ops")]

# One entry per pattern. Keys: state, op ("{func}" = from COLLECTIVE_OPS by function name,
# "{native}" = from the native symbol), tier (1 specific, 3 generic), func / file (regexes searched
# in the frame's function name / file), native (True: only native frames, False: only Python
# frames, absent: both), yields (states of an outer tier-1 match that win over this one), why.
# The framework wrappers (collective_wrappers.yaml) come first: each is scoped to its library's
# files, so it only decides frames no torch entry would, and must beat the generic tier-3 waits.
PATTERNS: list[dict[str, Any]] = _table("collective_wrappers") + _table("frame_states")

# Libraries and the standard library: the first frame outside them is the user's call site.
KNOWN_LIBS = frozenset({
    "torch", "torchvision", "torchaudio", "torchdata", "functorch", "triton", "deepspeed", "lightning",
    "pytorch_lightning", "lightning_fabric", "transformers", "accelerate", "datasets", "numpy",
    "safetensors", "apex", "fsspec", "s3fs", "gcsfs", "requests", "urllib3", "huggingface_hub",
    "webdataset", "tqdm", "wandb", "tensorboard", "tensorboardX", "botocore", "boto3", "s3transfer",
    "h5py", "PIL", "pandas", "pyarrow", "megatron", "transformer_engine", "flash_attn", "xformers",
    "peft", "trl", "optimum", "timm", "einops", "pybind11", "typing_extensions", "_pytest", "pluggy",
})
_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) | {"<frozen", "<string>"}
_LIB_PATH = re.compile(r"/(site|dist)-packages/|/lib/python\d\.\d+/|^<")
#: a Windows interpreter's library prefix (``C:\\...\\Lib\\site-packages\\``), once slashes are turned
_WIN_PREFIX = re.compile(r"^(?:[A-Za-z]:)?/.*/(?:site-packages|dist-packages)/|^[A-Za-z]:/.*?/Lib/", re.I)


def norm_file(file: str) -> str:
    """A frame's file with Windows separators turned into ``/`` and the interpreter's library
    prefix cut, so ``C:\\env\\Lib\\site-packages\\torch\\distributed\\distributed_c10d.py`` reads as
    ``torch/distributed/distributed_c10d.py`` like py-spy's short paths (tracebacks pasted from
    Windows jobs would otherwise match no library entry)."""
    if "\\" not in file:
        return file
    return _WIN_PREFIX.sub("", file.replace("\\", "/"), count=1)


def is_library(file: str) -> bool:
    """True for frames of installed libraries and the standard library (not the user's code)."""
    file = norm_file(file)
    if _LIB_PATH.search(file):
        return True
    head = file.split("/", 1)[0]
    return head.removesuffix(".py") in KNOWN_LIBS or head.removesuffix(".py") in _STDLIB


@dataclass(frozen=True)
class _Compiled:
    state: str
    op: str
    tier: int
    func: re.Pattern[str] | None
    file: re.Pattern[str] | None
    native: bool | None
    yields: frozenset[str]


_COMPILED: list[_Compiled] = [
    _Compiled(p["state"], p["op"], int(p["tier"]),
              re.compile(p["func"]) if p.get("func") else None,
              re.compile(p["file"]) if p.get("file") else None,
              p.get("native"), frozenset(p.get("yields", ())))
    for p in PATTERNS
]

# A generic wait (tier 3: a queue, a condition, a multiprocessing pipe) inside one of these
# frames is a wait for the input pipeline: a training loop pulling its next batch from a
# prefetching iterator that a background thread or process fills (fairseq's BufferedIterator,
# Megatron/NeMo prefetchers, webdataset and torchdata pipes, hand-written loaders). Matched by
# the iterator protocol in a data-named module, so it holds for code this table never saw.
WAIT_CONTEXTS: list[dict[str, Any]] = _table("wait_contexts")
_CONTEXTS = [(c["state"], c["op"], re.compile(c["file"]), re.compile(c["func"])) for c in WAIT_CONTEXTS]
_GENERIC_WAITS = frozenset({"lock_wait", "ipc_wait"})


@lru_cache(maxsize=16384)
def _wait_context(name: str, file: str, native: bool) -> tuple[str, str] | None:
    if native:
        return None
    for state, op, file_rx, func_rx in _CONTEXTS:
        if file_rx.search(file) and func_rx.search(name):
            return state, op
    return None


def _native_op(name: str) -> str:
    for rx, op in _NATIVE_OPS:
        if rx.search(name):
            return op
    return "wait"


def _op_for(pat: _Compiled, name: str) -> str:
    if pat.op == "{func}":
        return COLLECTIVE_OPS.get(name.rsplit(".", 1)[-1], "wait")
    if pat.op == "{native}":
        return _native_op(name)
    if pat.op == "{cuda}":
        m = pat.func.search(name) if pat.func else None
        return m.group(1) if m else "cuda"
    if pat.op == "{py}":
        return name.rsplit(".", 1)[-1] if "." in name else name
    return pat.op


@lru_cache(maxsize=65536)
def match_frame(name: str, file: str, native: bool) -> tuple[str, str, int, frozenset[str]] | None:
    """(state, op, tier, yields) of the first pattern matching this frame, or None (cached:
    the same frames recur across ranks, so a 16k-rank job costs one regex pass per distinct frame)."""
    file = norm_file(file)
    for pat in _COMPILED:
        if pat.native is not None and pat.native != native:
            continue
        if pat.file is not None and not pat.file.search(file):
            continue
        if pat.func is not None and not pat.func.search(name):
            continue
        return pat.state, _op_for(pat, name), pat.tier, pat.yields
    return None


Frame = tuple  # (name: str, file: str, line: int, native: bool)


@dataclass
class Verdict:
    """The classification of one thread's stack."""

    state: str
    op: str = ""
    anchor: int = -1  # index of the frame that decided, -1 when none


def classify(frames: list[Frame] | tuple[Frame, ...], active: bool | None) -> Verdict:
    """Decide what a thread is doing from its frames (innermost first) and its activity."""
    first1 = -1
    hit1: tuple[str, str, int, frozenset[str]] | None = None
    first3 = -1
    hit3: tuple[str, str, int, frozenset[str]] | None = None
    for i, fr in enumerate(frames):
        m = match_frame(fr[0], fr[1], fr[3])
        if m is None:
            continue
        if m[2] == 1:
            # the first specific match decides, unless it yields to this outer one (which may in
            # turn yield further out: CUDA wait -> native Work.wait -> Python all_reduce)
            if hit1 is None or m[0] in hit1[3]:
                hit1, first1 = m, i
                if not m[3]:
                    break
        elif hit3 is None:
            hit3, first3 = m, i
    if hit1 is not None:
        return Verdict(hit1[0], hit1[1], first1)
    if hit3 is not None:
        if hit3[0] in _GENERIC_WAITS:
            for j in range(first3 + 1, len(frames)):
                ctx = _wait_context(frames[j][0], frames[j][1], frames[j][3])
                if ctx is not None:
                    return Verdict(ctx[0], ctx[1], j)
        return Verdict(hit3[0], hit3[1], first3)
    if not frames:
        return Verdict("idle")
    if active is False:
        return Verdict("unknown")
    return Verdict("python")


def fmt_frame(fr: Frame) -> str:
    """``func (file:line)`` as py-spy prints it; native frames without a line keep ``(lib)``."""
    name = fr[0] if len(fr[0]) <= 160 else fr[0][:157] + "..."
    return f"{name} ({fr[1]}:{fr[2]})" if fr[2] else f"{name} ({fr[1]})"


def call_site(frames: list[Frame] | tuple[Frame, ...], start: int = 0) -> str:
    """The innermost frame of the user's own code at or outside ``start``: where the user called
    into the library the thread waits in (two ranks in the same op from different lines are in
    different collectives)."""
    for fr in frames[max(start, 0):]:
        if not fr[3] and not is_library(fr[1]):
            return fmt_frame(fr)
    return ""


def role_of(frames: list[Frame] | tuple[Frame, ...]) -> str:
    """What kind of process a main-thread stack belongs to: rank, worker (DataLoader), launcher."""
    for fr in frames:
        if fr[3]:
            continue
        f = fr[1]
        if f.endswith("torch/utils/data/_utils/worker.py") and fr[0].endswith("_worker_loop"):
            return "worker"
        if "torch/distributed/elastic/agent/" in f or f.endswith("torch/distributed/run.py") \
                or f.endswith("torch/distributed/launcher/api.py"):
            return "launcher"
        if "torch/_inductor/compile_worker/" in f:
            return "helper"
    return "rank"


#: Native frames of an OpenMP runtime waiting at a team barrier or for its pool (libgomp,
#: LLVM/Intel libomp). A forked DataLoader worker that enters a parallel region the parent had
#: already started waits there for pool threads that do not exist in the child; py-spy marks the
#: spinning thread active, yet it never progresses. source: GCC bug 52303 (libgomp is not
#: fork-safe), https://pytorch.org/docs/stable/data.html#multi-process-data-loading
_OMP_WAIT = re.compile(r"^(?:gomp_(?:team_)?barrier_wait\w*|gomp_sem_wait|gomp_mutex_lock_slow|do_spin|do_wait|"
                       r"__kmp_(?:suspend\w*|wait_\w+|hyper_barrier_\w+|fork_barrier|join_barrier|"
                       r"barrier\w*|acquire_ticket_lock|execute_tasks\w*))$")


def worker_activity(frames: list[Frame] | tuple[Frame, ...], active: bool | None) -> str:
    """A DataLoader worker: ``waiting`` for indices or to hand over a batch (its loop's queue),
    ``busy`` running dataset code, or ``blocked`` idle inside dataset/user code (a lock inherited
    through fork, I/O, a dead peer) -- the deadlock signature. A worker whose native frames wait
    in an OpenMP barrier or pool lock counts as blocked even when py-spy saw it spin (active):
    the pool it waits for was not carried across fork."""
    omp = any(fr[3] and _OMP_WAIT.match(str(fr[0])) for fr in frames)
    for fr in frames:
        if fr[3]:
            continue
        if fr[0].endswith("_worker_loop"):
            return "waiting"
        if is_library(fr[1]) and not fr[1].endswith("fetch.py"):
            # stdlib/multiprocessing internals above the loop: a queue get/put
            continue
        break
    return "busy" if active and not omp else "blocked"


def pattern_docs() -> list[dict[str, str]]:
    """The pattern table for documentation (``mldoctor facts --schema`` readers, tests)."""
    return [{"state": p["state"], "op": p["op"], "tier": str(p.get("tier", "3+")), "func": p.get("func", ""),
             "file": p.get("file", ""), "why": p["why"]} for p in PATTERNS + WAIT_CONTEXTS]


# ---------------------------------------------------------------------------------------------
# Phases of a running thread (used by the sampling profile, probes/samples/timeshare.py).
#
# ``classify`` answers "what does this thread wait for". A sampling profile also needs "which
# part of the step is it running": a thread that ``classify`` calls ``python`` (running code the
# wait tables do not know) is in forward, backward, the optimizer step, torch.compile's compiler,
# or a logger. These patterns are kept apart from PATTERNS so the hang classifier's states do not
# change. Same keys as PATTERNS (tier unused). ``phase_of`` picks, in order: compile anywhere in
# the stack (a lazily compiled backward is compile time, not backward), logging anywhere, then the
# OUTERMOST of optimizer / backward / forward (a forward re-run inside backward for activation
# checkpointing is backward time; a module called by the optimizer is optimizer time).
PHASES: list[dict[str, Any]] = _table("phases")

_PHASES_C: list[_Compiled] = [
    _Compiled(p["state"], p["op"], 0, re.compile(p["func"]) if p.get("func") else None,
              re.compile(p["file"]) if p.get("file") else None, p.get("native"), frozenset())
    for p in PHASES
]
_OUTER_PHASES = ("optimizer", "backward", "forward")


@lru_cache(maxsize=65536)
def match_phase(name: str, file: str, native: bool) -> tuple[str, str] | None:
    """(phase, op) of the first PHASES entry matching this frame, or None (cached)."""
    for pat in _PHASES_C:
        if pat.native is not None and pat.native != native:
            continue
        if pat.file is not None and not pat.file.search(file):
            continue
        if pat.func is not None and not pat.func.search(name):
            continue
        return pat.state, pat.op
    return None


def phase_of(frames: list[Frame] | tuple[Frame, ...]) -> tuple[str, str]:
    """The phase of a running stack (innermost first): compile | logging | optimizer | backward |
    forward, with the op that decided; ``("", "")`` when no phase pattern matches."""
    outer: tuple[str, str] | None = None
    logging_hit: tuple[str, str] | None = None
    for fr in frames:
        m = match_phase(fr[0], fr[1], fr[3])
        if m is None:
            continue
        if m[0] == "compile":
            return m
        if m[0] == "logging":
            logging_hit = logging_hit or m
        elif m[0] in _OUTER_PHASES:
            outer = m  # keep going: the outermost wins
    return logging_hit or outer or ("", "")
