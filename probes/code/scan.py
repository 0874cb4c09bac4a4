"""Find the distributed-training anti-patterns a parsed training script shows (``ast`` only).

Each finding is ``{"line": N, "code": "<the source line>", ...}`` so a report can quote it. What
counts, and why each is a lead (sources in the rules that read them):

- a collective (torch.distributed, accelerate, Lightning's ``sync_dist``/``all_gather``) or a
  call of a function of this file that reaches one, or the forward of a DDP-wrapped model, under a
  rank condition (``if rank == 0:``, ``if dist.get_rank() == 0:``, ``if is_main_process():``,
  ``if self.global_rank == 0:``): the other ranks never join it;
- ``break``/``continue``/``return`` under a rank condition inside a loop that runs collectives
  (or a DDP backward), or before a collective later in the same function;
- host syncs (``.item()``, ``.cpu()``, ``.numpy()``, ``.tolist()``, ``torch.cuda.synchronize()``)
  in a training loop (a loop that calls ``backward``/``optimizer.step``) or a Lightning
  ``training_step``; a sync under ``if step % N == 0`` is marked ``every_n``;
- DataLoader settings, DistributedSampler without ``set_epoch``, ``find_unused_parameters``,
  hard-coded rendezvous, NCCL without ``torch.cuda.set_device``, fp16 autocast without
  GradScaler, literal learning rates, gradient clipping present or not.
"""

from __future__ import annotations

import ast
import copy
import re
import time
from collections.abc import Iterator
from typing import Any

#: torch.distributed collectives (torch/distributed/distributed_c10d.py public functions)
DIST_COLLECTIVES = frozenset({
    "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "reduce", "barrier", "monitored_barrier",
    "gather", "gather_object", "scatter", "scatter_object_list", "all_to_all", "all_to_all_single",
    "all_reduce_coalesced", "all_gather_coalesced",
})
#: accelerate.Accelerator / Lightning strategy / torch_xla methods that every process must call
FRAMEWORK_COLLECTIVES = frozenset({
    "wait_for_everyone", "gather", "gather_for_metrics", "reduce", "pad_across_processes", "barrier",
    "broadcast", "all_gather", "rendezvous", "all_reduce",
})
_FRAMEWORK_RECEIVER = re.compile(r"(?:^|\.)(?:accelerator|strategy|xm|trainer|fabric|self)$")
_RANK_TEST = re.compile(
    r"\b(?:get_rank\s*\(|get_local_rank\s*\(|(?:local_|global_|node_|process_)?rank\b|is_main_process"
    r"|is_local_main_process|is_global_zero|is_master\w*|is_rank_zero|rank_zero\w*|master_process"
    r"|is_world_process_zero|is_local_process_zero|process_index|local_process_index|main_process)")
_UNIFORM_TEST = re.compile(r"^(?:not\s+)?\(?[\w.]*rank\s*(?:!=|==)\s*-1\)?$")
HOST_SYNC_METHODS = frozenset({"item", "cpu", "numpy", "tolist"})
_STEP_CALLS = frozenset({"backward", "step"})
_TRAIN_FUNCS = frozenset({"training_step", "train_step", "compute_loss", "training_step_end"})
_HEAVY = re.compile(r"\b(?:Image\.open|cv2\.imread|imread|torch\.load|np\.load|json\.load|pickle\.load|open|"
                    r"requests\.get|urlopen|decode_image|read_image|torchaudio\.load|librosa\.load|"
                    r"tokenizer|AutoTokenizer|from_pretrained)\s*\(")
_LOOPBACK = re.compile(r"^(?:localhost|127\.\d+\.\d+\.\d+|0\.0\.0\.0)$")
_IP_OR_HOST = re.compile(r"^(?:\d{1,3}(?:\.\d{1,3}){3}|[a-z][\w-]*(?:\.[\w-]+)*)$", re.I)
#: lr at or above these is a lead for divergence (Adam-family defaults are 1e-3 and below;
#: SGD's usual range tops out near 0.1-0.5 with warm-up)
LR_HIGH = {"adam": 1e-2, "sgd": 1.0}
_ADAM = re.compile(r"adam|lamb|lion|adafactor|rmsprop", re.I)
MAX_FINDINGS = 50
#: Seconds one file's scan may take; a training script takes milliseconds.
TIME_BUDGET_S = 2.0


class OutOfTime(Exception):
    """The scan's time budget is spent; what was found so far is kept."""


def _name(node: ast.AST) -> str:
    """Dotted name of a Name/Attribute chain (``torch.distributed.barrier``), else ``""``."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    if isinstance(node, ast.Call):  # self.trainer.strategy.barrier() on a call result: keep the tail
        inner = _name(node.func)
        return ".".join([inner + "()"] + list(reversed(parts))) if inner else ""
    return ""


def _const(node: ast.AST | None) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
            and isinstance(node.operand.value, (int, float)):
        return -node.operand.value
    return None


def _kw(call: ast.Call, name: str) -> ast.AST | None:
    for k in call.keywords:
        if k.arg == name:
            return k.value
    return None


class Scanner:
    """One pass per question over one module's tree; results in ``out`` (plain types)."""

    def __init__(self, tree: ast.Module, text: str) -> None:
        self.tree = tree
        self.lines = text.split("\n")
        self._coll: dict[int, str] = {}
        self._sync_lines: dict[int, list[int]] = {}
        self._loop_syncs: dict[int, bool] = {}
        self._steps_memo: dict[int, bool] = {}
        self.deadline = time.monotonic() + TIME_BUDGET_S
        # "dist" is the near-universal alias; a snippet cut out of a file has lost its imports
        self.dist_aliases = {"torch.distributed", "dist"}
        self.dist_names: set[str] = set()  # bare names imported from torch.distributed
        self.ddp_names: set[str] = set()
        self.funcs: dict[str, ast.AST] = {}
        self.parents: dict[ast.AST, ast.AST] = {}
        self.nodes = list(ast.walk(tree))  # walked once; every question below reads this list
        self.by_tail: dict[str, list[ast.Call]] = {}
        for node in self.nodes:
            if isinstance(node, ast.Call):
                self.by_tail.setdefault(_name(node.func).rsplit(".", 1)[-1], []).append(node)
        for node in self.nodes:
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.funcs.setdefault(node.name, node)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name == "torch.distributed" and a.asname:
                        self.dist_aliases.add(a.asname)
            elif isinstance(node, ast.ImportFrom):
                if node.module == "torch" and any(a.name == "distributed" for a in node.names):
                    self.dist_aliases |= {a.asname or a.name for a in node.names if a.name == "distributed"}
                elif node.module == "torch.distributed":
                    self.dist_names |= {a.asname or a.name for a in node.names if a.name in DIST_COLLECTIVES}
        for node in self.nodes:  # names bound to a DDP/FSDP wrapper: their forward syncs buffers
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                fn = _name(node.value.func).rsplit(".", 1)[-1]
                if fn in ("DistributedDataParallel", "DDP", "FullyShardedDataParallel", "FSDP"):
                    self.ddp_names |= {_name(t) for t in node.targets if _name(t)}
        self.reaches = self._reaching_functions()
        # a backward all-reduces gradients when the model is DDP/FSDP-wrapped; a snippet may show only
        # the wrapped model's use (ddp_model(...), model.module.state_dict())
        self.uses_ddp = bool(self.ddp_names) or re.search(
            r"\bddp_?\w*\s*\(|DistributedDataParallel|FullyShardedDataParallel|\b\w+\.module\.", text) is not None

    # ---- helpers
    def tick(self) -> None:
        """Stop the scan once its time budget is spent (a pathological file, not a training script)."""
        if time.monotonic() > self.deadline:
            raise OutOfTime

    def collective_lines(self, fn: ast.AST) -> list[int]:
        """Lines of the calls in ``fn`` that are or reach a collective (once per function)."""
        key = id(fn)
        if key not in self._sync_lines:
            self._sync_lines[key] = sorted(
                n.lineno for n in ast.walk(fn) if isinstance(n, ast.Call)
                and (self.collective(n) or _name(n.func).rsplit(".", 1)[-1] in self.reaches))
        return self._sync_lines[key]

    def src(self, node: ast.AST) -> str:
        ln = getattr(node, "lineno", 0)
        return self.lines[ln - 1].strip()[:200] if 0 < ln <= len(self.lines) else ""

    def item(self, node: ast.AST, **extra: Any) -> dict[str, Any]:
        return {"line": int(getattr(node, "lineno", 0)), "code": self.src(node), **extra}

    def collective(self, call: ast.Call) -> str:
        """The collective a call is (``"barrier"``), else ``""`` (memoized: asked again per loop)."""
        key = id(call)
        if key not in self._coll:
            self._coll[key] = self._collective(call)
        return self._coll[key]

    def _collective(self, call: ast.Call) -> str:
        full = _name(call.func)
        if not full:
            return ""
        recv, _, meth = full.rpartition(".")
        if not recv:
            return meth if meth in self.dist_names else ""
        if meth in DIST_COLLECTIVES and (recv in self.dist_aliases or recv.endswith(".distributed")):
            return meth
        if meth in FRAMEWORK_COLLECTIVES and _FRAMEWORK_RECEIVER.search(recv):
            if recv == "self" and meth not in ("all_gather",):
                return ""  # Lightning's self.all_gather; other self.<name> methods are the user's own
            return meth
        if meth == "log" and recv == "self":  # Lightning: self.log(..., sync_dist=True) reduces across ranks
            v = _kw(call, "sync_dist")
            if isinstance(v, ast.Constant) and v.value is True:
                return "log(sync_dist=True)"
        return ""

    def _direct(self, fn: ast.AST) -> tuple[str, set[str]]:
        """The first collective a function calls itself, and the file's functions it calls."""
        first, calls = "", set()
        for node in ast.walk(fn):
            if isinstance(node, ast.Call):
                op = self.collective(node)
                if op and not first:
                    first = op
                full = _name(node.func)
                tail = full.rsplit(".", 1)[-1]
                if tail in self.funcs and (full == tail or full.startswith("self.")):
                    calls.add(tail)
        return first, calls

    def _reaching_functions(self) -> dict[str, str]:
        """Functions of this file from which a collective is reached: name -> that collective."""
        direct = {n: self._direct(f) for n, f in self.funcs.items()}
        reach = {n: op for n, (op, _) in direct.items() if op}
        for _ in range(6):  # a short fixed point: call chains of a script are shallow
            grew = False
            for n, (_, calls) in direct.items():
                if n in reach:
                    continue
                for c in calls:
                    if c in reach:
                        reach[n] = reach[c]
                        grew = True
                        break
            if not grew:
                break
        return reach

    def is_rank_test(self, test: ast.AST) -> bool:
        # names, attributes and calls only: `if "--rank-main" in sys.argv:` is not a rank condition
        text = ast.unparse(_NoStrings().visit(copy.deepcopy(test)))
        if not _RANK_TEST.search(text):
            return False
        return not _UNIFORM_TEST.match(text.strip())  # `if args.local_rank != -1:` is "distributed or not"

    def ancestors(self, node: ast.AST) -> Iterator[tuple[ast.AST, ast.AST]]:
        """(ancestor, the child on the path) pairs, innermost first."""
        child = node
        while child in self.parents:
            parent = self.parents[child]
            yield parent, child
            child = parent

    def rank_guard(self, node: ast.AST) -> ast.If | None:
        """The innermost ``if`` with a rank condition whose body (or else) holds ``node``; a nested
        function definition stops the search (its body runs where it is called)."""
        for anc, child in self.ancestors(node):
            if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                return None
            if isinstance(anc, ast.If) and child is not anc.test and self.is_rank_test(anc.test):
                return anc
            if isinstance(anc, ast.IfExp) and child is not anc.test and self.is_rank_test(anc.test):
                return None  # an expression choosing a value per rank, e.g. a device
        return None

    def enclosing(self, node: ast.AST, kinds: tuple[type, ...]) -> ast.AST | None:
        for anc, _ in self.ancestors(node):
            if isinstance(anc, kinds):
                return anc
        return None

    def train_loop(self, node: ast.AST) -> ast.AST | None:
        """The innermost enclosing loop that runs a training step, or a training-step method."""
        for anc, _ in self.ancestors(node):
            if isinstance(anc, (ast.For, ast.While, ast.AsyncFor)):
                # the innermost loop only: an .item() once per epoch, in the epoch loop around the
                # step loop, is not a per-step sync
                return anc if self._steps(anc) else None
            if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return anc if anc.name in _TRAIN_FUNCS else None
        return None

    def _steps(self, loop: ast.AST) -> bool:
        """The loop itself calls backward/optimizer.step (not only a loop nested in it: an epoch loop
        around the step loop is not a step loop). Memoized per loop."""
        key = id(loop)
        if key not in self._steps_memo:
            self._steps_memo[key] = self._steps_walk(loop)
        return self._steps_memo[key]

    def _steps_walk(self, loop: ast.AST) -> bool:
        for n in _walk_own(loop):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _STEP_CALLS:
                if n.func.attr == "backward" or "optim" in _name(n.func.value).lower() or \
                        _name(n.func.value).endswith(("opt", "optimizer", "scaler")):
                    return True
        return False

    def _syncs(self, loop: ast.AST) -> bool:
        """The loop runs a collective, or a backward through a DDP/FSDP model (bucket all_reduce)."""
        key = id(loop)
        if key not in self._loop_syncs:
            self._loop_syncs[key] = self._syncs_walk(loop)
        return self._loop_syncs[key]

    def _syncs_walk(self, loop: ast.AST) -> bool:
        for n in ast.walk(loop):
            if isinstance(n, ast.Call):
                if self.collective(n) or _name(n.func).rsplit(".", 1)[-1] in self.reaches:
                    return True
                if self.uses_ddp and isinstance(n.func, ast.Attribute) and n.func.attr == "backward":
                    return True
        return False

    # ---- the questions
    def rank_conditional(self) -> list[dict[str, Any]]:
        out = []
        for node in self.nodes:
            if not isinstance(node, ast.Call) or len(out) >= MAX_FINDINGS:
                continue
            self.tick()
            op, via = self.collective(node), ""
            full = _name(node.func)
            if not op:
                tail = full.rsplit(".", 1)[-1]
                if tail in self.reaches and (full == tail or full.startswith("self.")):
                    op, via = self.reaches[tail], tail
                elif full in self.ddp_names:
                    op, via = "DDP forward", full
            if not op:
                continue
            guard = self.rank_guard(node)
            if guard is None:
                continue
            scope = self.enclosing(guard, (ast.FunctionDef, ast.AsyncFunctionDef))
            branch = "body" if any(child in guard.body for a, child in self.ancestors(node) if a is guard) else "else"
            out.append(self.item(node, op=op, via=via, guard=ast.unparse(guard.test)[:120], scope=id(scope),
                                 branch=branch,
                                 guard_line=guard.lineno,
                                 barrier=op in ("barrier", "monitored_barrier", "wait_for_everyone", "rendezvous")))
        return sorted(_unpaired(self, out), key=lambda d: d["line"])

    def early_exits(self) -> list[dict[str, Any]]:
        out = []
        for node in self.nodes:
            if not isinstance(node, (ast.Break, ast.Continue, ast.Return)) or len(out) >= MAX_FINDINGS:
                continue
            self.tick()
            guard = self.rank_guard(node)
            if guard is None:
                continue
            loop = self.enclosing(guard, (ast.For, ast.While, ast.AsyncFor, ast.FunctionDef, ast.AsyncFunctionDef))
            why = ""
            if isinstance(loop, (ast.For, ast.While, ast.AsyncFor)) and self._syncs(loop):
                why = "the loop runs collectives on the other ranks"
            if not why and isinstance(node, ast.Return):
                fn = self.enclosing(guard, (ast.FunctionDef, ast.AsyncFunctionDef))
                end = guard.end_lineno or guard.lineno
                later = [ln for ln in self.collective_lines(fn) if ln > end] if fn else []
                if later:
                    why = f"a collective follows at line {later[0]}"
            if why:
                kind = type(node).__name__.lower()
                out.append(self.item(node, exit=kind, guard=ast.unparse(guard.test)[:120], guard_line=guard.lineno,
                                     why=why))
        return sorted(out, key=lambda d: d["line"])

    def host_syncs(self) -> list[dict[str, Any]]:
        out = []
        for node in self.nodes:
            if not isinstance(node, ast.Call) or len(out) >= MAX_FINDINGS:
                continue
            self.tick()
            full = _name(node.func)
            what = ""
            if isinstance(node.func, ast.Attribute) and node.func.attr in HOST_SYNC_METHODS and not node.args:
                if node.func.attr == "cpu" and isinstance(self.parents.get(node), ast.Attribute):
                    what = ".cpu()"
                else:
                    what = f".{node.func.attr}()"
            elif full.endswith("cuda.synchronize"):
                what = "torch.cuda.synchronize()"
            elif full == "print" and any(_tensorish(a) for a in node.args):
                what = "print(tensor)"
            if not what or self.train_loop(node) is None:
                continue
            every_n = any(isinstance(a, ast.If) and "%" in ast.unparse(a.test) for a, _ in self.ancestors(node)
                          if not isinstance(a, (ast.For, ast.While)))
            out.append(self.item(node, call=what, every_n=every_n))
        return sorted(out, key=lambda d: d["line"])

    def dataloaders(self) -> list[dict[str, Any]]:
        out = []
        for node in self.nodes:
            if isinstance(node, ast.Call) and _name(node.func).rsplit(".", 1)[-1] == "DataLoader":
                nw = _kw(node, "num_workers")
                workers = 0 if nw is None else (_const(nw) if isinstance(_const(nw), int) else -1)
                dl = _const(_kw(node, "drop_last"))
                sampler = _kw(node, "sampler")
                out.append(self.item(node, num_workers=workers, drop_last=bool(dl) if dl is not None else False,
                                     sampler=ast.unparse(sampler)[:80] if sampler is not None else "",
                                     shuffle=bool(_const(_kw(node, "shuffle")))))
        return sorted(out, key=lambda d: d["line"])[:MAX_FINDINGS]

    def heavy_getitem(self) -> list[dict[str, Any]]:
        out = []
        for node in self.nodes:
            if isinstance(node, ast.FunctionDef) and node.name in ("__getitem__", "__iter__"):
                for n in ast.walk(node):
                    m = _HEAVY.search(ast.unparse(n.func) + "(") if isinstance(n, ast.Call) else None
                    if m:
                        out.append(self.item(n, call=m.group(0).rstrip("( ")))
                        break
        return out[:MAX_FINDINGS]

    def calls_named(self, *tails: str) -> list[ast.Call]:
        return sorted((c for t in tails for c in self.by_tail.get(t, [])), key=lambda c: (c.lineno, c.col_offset))

    def text_has(self, rx: str) -> bool:
        return re.search(rx, "\n".join(self.lines)) is not None


class _NoStrings(ast.NodeTransformer):
    """Blank string constants (and f-strings) so words inside them never read as rank names."""

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        return ast.Constant("") if isinstance(node.value, str) else node

    def visit_JoinedStr(self, node: ast.JoinedStr) -> ast.AST:
        return ast.Constant("")


_TENSOR_NAME = re.compile(r"^(?:loss|losses|logits|outputs?|preds?|predictions|grads?|.*_loss|.*_tensor)$")


def _tensorish(arg: ast.AST) -> bool:
    """A print argument that is a tensor by its usual name (``loss``, ``logits``), bare or in an
    f-string without ``.item()``: formatting a CUDA tensor copies it to the host."""
    if isinstance(arg, ast.JoinedStr):
        return any(isinstance(v, ast.FormattedValue) and _tensorish(v.value) for v in arg.values)
    return isinstance(arg, ast.Name) and _TENSOR_NAME.match(arg.id) is not None


def _walk_own(loop: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a loop's own body: nested loops and function definitions are not entered."""
    todo = list(ast.iter_child_nodes(loop))
    while todo:
        n = todo.pop()
        yield n
        if not isinstance(n, (ast.For, ast.While, ast.AsyncFor, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(n))


def _unpaired(s: Scanner, found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop the balanced shapes: the same collective in both branches of one rank ``if``, or under
    two different rank conditions of one function (HF's "main process first": the other ranks wait
    at a barrier while rank 0 prepares the data, then rank 0 joins them at its own barrier)."""
    by: dict[tuple[int, str], set[str]] = {}
    for f in found:
        by.setdefault((f["scope"], f["op"]), set()).add(f["guard"] + "@" + str(f["guard_line"]) + "/" + str(f["branch"]))
    out = []
    for f in found:
        if len(by[(f["scope"], f["op"])]) < 2:
            out.append({k: v for k, v in f.items() if k not in ("scope", "branch")})
    return out


def scan(tree: ast.Module, text: str) -> dict[str, Any]:
    """Every finding of one source file, as plain data."""
    s = Scanner(tree, text)
    out: dict[str, Any] = {"rank_conditional_collectives": [], "rank_conditional_exits": [], "host_sync_in_loop": []}
    try:
        out["rank_conditional_collectives"] = s.rank_conditional()
        out["rank_conditional_exits"] = s.early_exits()
        out["host_sync_in_loop"] = s.host_syncs()
    except OutOfTime:
        out["out_of_time"] = True
        return out
    out["dataloaders"] = s.dataloaders()
    out["heavy_getitem"] = s.heavy_getitem()
    samplers = s.calls_named("DistributedSampler")
    out["distributed_sampler"] = bool(samplers)
    out["sampler_set_epoch_missing"] = bool(samplers) and not s.calls_named("set_epoch")
    ddp = s.calls_named("DistributedDataParallel", "DDP")
    out["ddp"] = bool(ddp)
    fup = [c for c in ddp if _const(_kw(c, "find_unused_parameters")) is True]
    out["find_unused_parameters"] = [s.item(c) for c in fup]
    out.update(_init(s))
    out.update(_precision(s))
    out["learning_rates"] = _learning_rates(s)
    out["trains"] = any(s._steps(n) for n in s.nodes if isinstance(n, (ast.For, ast.While))) or \
        any(isinstance(n, ast.FunctionDef) and n.name in _TRAIN_FUNCS for n in s.nodes)
    out["grad_clipping"] = s.text_has(r"clip_grad_(?:norm|value)_?\s*\(|max_grad_norm|gradient_clip_val|clip_grad\s*=")
    out["sets_omp_threads"] = s.text_has(r"OMP_NUM_THREADS|set_num_threads\s*\(")
    return out


def _init(s: Scanner) -> dict[str, Any]:
    """init_process_group's backend, hard-coded rendezvous, and whether the CUDA device is chosen."""
    backend = ""
    hard: list[dict[str, Any]] = []
    for c in s.calls_named("init_process_group"):
        b = _kw(c, "backend")
        b = b if b is not None else (c.args[0] if c.args else None)
        if isinstance(_const(b), str):
            backend = backend or str(_const(b)).lower()
        im = _const(_kw(c, "init_method"))
        if isinstance(im, str) and im.startswith("tcp://"):
            host = im[6:].rsplit(":", 1)[0].strip("[]")
            hard.append(s.item(c, key="init_method", value=im[:80], loopback=bool(_LOOPBACK.match(host))))
    for node in s.nodes:  # os.environ["MASTER_ADDR"] = "..." / os.environ.setdefault(...)
        key = val = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Subscript):
            key, val = _const(node.targets[0].slice), _const(node.value)
        elif isinstance(node, ast.Call) and _name(node.func).endswith("environ.setdefault") and len(node.args) == 2:
            key, val = _const(node.args[0]), _const(node.args[1])
        if key in ("MASTER_ADDR", "MASTER_PORT") and isinstance(val, (str, int)):
            sval = str(val)
            if key == "MASTER_ADDR" and not _IP_OR_HOST.match(sval):
                continue
            hard.append(s.item(node, key=key, value=sval[:80], loopback=bool(_LOOPBACK.match(sval))))
    picks_device = bool(s.calls_named("set_device")) or s.text_has(
        r"cuda:\{|f[\"']cuda:\{|cuda\",\s*\w*rank|device\(\s*[\w.]*rank|\.cuda\(\s*[\w.]*rank|device_ids\s*=\s*\[\s*[\w.]*rank"
        r"|Accelerator\(|Trainer\(|TrainingArguments\(|deepspeed\.initialize|accelerator\.device")
    return {"backend": backend, "hardcoded_rendezvous": hard[:MAX_FINDINGS],
            "nccl_without_set_device": backend == "nccl" and not picks_device}


def _precision(s: Scanner) -> dict[str, Any]:
    """fp16 autocast / .half() with no GradScaler (bf16 needs none; HF/Lightning scale themselves)."""
    fp16: list[dict[str, Any]] = []
    for c in s.calls_named("autocast"):
        dt = _kw(c, "dtype")
        dts = ast.unparse(dt) if dt is not None else ""
        if "bfloat16" in dts or "bf16" in dts:
            continue
        dev = _const(_kw(c, "device_type")) or (_const(c.args[0]) if c.args else None)
        if dev == "cpu":
            continue  # CPU autocast defaults to bfloat16
        fp16.append(s.item(c, how="autocast"))
    for n in s.nodes:
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "half" and not n.args \
                and "model" in _name(n.func.value).lower():
            fp16.append(s.item(n, how=".half()"))
    scaled = bool(s.calls_named("GradScaler", "ShardedGradScaler")) or s.text_has(
        r"fp16\s*=\s*True|precision\s*=\s*[\"']?16|mixed_precision\s*=|deepspeed|apex\.amp|amp\.initialize")
    return {"fp16": fp16[:MAX_FINDINGS], "fp16_without_scaler": bool(fp16) and not scaled}


def _learning_rates(s: Scanner) -> list[dict[str, Any]]:
    out = []
    for c in s.nodes:
        if not isinstance(c, ast.Call):
            continue
        opt = _name(c.func).rsplit(".", 1)[-1]
        if not (_ADAM.search(opt) or opt == "SGD" or opt == "TrainingArguments"):
            continue
        lr_node = _kw(c, "lr") or _kw(c, "learning_rate")
        if lr_node is None and opt == "SGD" and len(c.args) > 1:
            lr_node = c.args[1]
        lr = _const(lr_node)
        if not isinstance(lr, (int, float)) or isinstance(lr, bool):
            continue
        family = "sgd" if opt == "SGD" else "adam"
        out.append(s.item(c, optimizer=opt, lr=float(lr), high=float(lr) >= LR_HIGH[family]))
    return out[:MAX_FINDINGS]
