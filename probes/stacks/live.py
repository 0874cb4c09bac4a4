"""Live stacks: ``py-spy dump --json`` on every rank at once. py-spy ptraces and pauses the
process for the dump's duration (measured as ``pause_s``) and never signals it, so a dump is
safe on a job that is only slow; failures are classified into advice the user can act on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from doctor.evidence.contract import ProbeFailed, ProbeSkipped


def find_pyspy() -> str | None:
    """py-spy on PATH, or the one installed next to this interpreter (a venv not activated)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


_ADVICE = {
    "permission": ("py-spy may not ptrace this process: run mldoctor as the job's user or root; in "
                   "containers add CAP_SYS_PTRACE (docker --cap-add SYS_PTRACE, k8s securityContext); "
                   "check kernel.yama.ptrace_scope (0 or 1)."),
    "unsupported": ("py-spy could not read this interpreter: upgrade py-spy (new CPython versions need "
                    "a newer py-spy), or the pid is not a Python process (a launcher stub)."),
    "gone": "The process exited before or during the dump: check the launcher log for its exit.",
    "timeout": ("py-spy did not finish in time: the process may be wedged in the kernel (D state) or "
                "the host overloaded; try gdb/pstack or /proc/PID/stack."),
    "error": "",
}


def classify_failure(returncode: int | None, stderr: str, pid: int) -> tuple[str, str]:
    """(kind, one-line reason) from py-spy's exit and message."""
    text = stderr.strip()
    low = text.lower()
    first = next((ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip()[0].isdigit()), "")
    if "permission denied" in low or "operation not permitted" in low or "os error 1)" in low:
        return "permission", "permission denied (ptrace)"
    if not Path(f"/proc/{pid}").exists() or "no such process" in low or "check that the process is running" in low:
        return "gone", "process no longer exists"
    if "failed to find python version" in low or "unsupported version" in low or "python interpreter" in low:
        return "unsupported", first[:200] or "unsupported Python"
    return "error", (first or f"py-spy exited with {returncode}")[:200]


def dump_pid(exe: str, pid: int, *, native: bool = False, timeout: float = 10.0) -> dict[str, Any]:
    """One ``py-spy dump --json`` with its wall time (the pause it caused); never raises."""
    argv = [exe, "dump", "--json", "--pid", str(pid)] + (["--native"] if native else [])
    t0 = time.perf_counter()
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        wall = round(time.perf_counter() - t0, 4)
        return {"ok": False, "kind": "timeout", "reason": f"py-spy did not answer within {timeout:g} s",
                "advice": _ADVICE["timeout"], "wall_s": wall, "stdout": ""}
    except OSError as exc:
        return {"ok": False, "kind": "error", "reason": f"cannot run py-spy: {exc.strerror or exc}",
                "advice": "", "wall_s": 0.0, "stdout": ""}
    wall = round(time.perf_counter() - t0, 4)
    if r.returncode == 0 and r.stdout.strip().startswith("["):
        return {"ok": True, "wall_s": wall, "stdout": r.stdout, "kind": "", "reason": "", "advice": ""}
    kind, reason = classify_failure(r.returncode, r.stderr or r.stdout, pid)
    return {"ok": False, "kind": kind, "reason": reason, "advice": _ADVICE[kind], "wall_s": wall, "stdout": ""}


def collect(ctx: Any) -> dict[str, Any]:
    """Dump every rank (and, asked, its DataLoader workers) in parallel: a hang is a moment
    across ranks, so the dumps must be as close in time as py-spy allows; a failed dump is
    written as an error record because the failure itself says something (a rank gone)."""
    exe = find_pyspy()
    if exe is None:
        raise ProbeSkipped("py-spy is not installed (pip install py-spy); no stacks collected")
    targets = [(p.rank, p.pid, "rank", None) for p in ctx.ranks]
    if not targets:
        raise ProbeSkipped("no rank processes on this host")
    if ctx.options.get("workers"):
        rank_pids = {p.pid: p.rank for p in ctx.ranks}
        targets += [(rank_pids[w.parent], w.pid, "worker", w.parent) for w in ctx.procs
                    if w.role == "worker" and w.parent in rank_pids]
    snap = int(ctx.options.get("snapshot", 0) or 0)
    native = bool(ctx.options.get("native"))
    timeout = float(ctx.timeout)

    def one(t: tuple[int | None, int, str, int | None]) -> tuple[tuple, dict[str, Any]]:
        return t, dump_pid(exe, t[1], native=native, timeout=timeout)

    with ThreadPoolExecutor(max_workers=max(1, min(len(targets), 32))) as ex:
        results = list(ex.map(one, targets))
    ok = failed = 0
    first_problem = ""
    for (rank, pid, role, _parent), res in results:
        who = f"rank{rank}" if rank is not None else f"pid{pid}"
        if role == "worker":
            who = f"worker{pid}-of-{who}"
        meta = {"pause_s": res["wall_s"], "snapshot": snap, "native": native, "format": "pyspy_json",
                "command": "py-spy dump --json" + (" --native" if native else "") + f" --pid {pid}"}
        if res["ok"]:
            ok += 1
            ctx.add(f"pyspy-{who}-snap{snap}.json", res["stdout"], rank=rank, pid=pid, meta=meta)
        else:
            failed += 1
            first_problem = first_problem or f"{who} (pid {pid}): {res['reason']} {res['advice']}".strip()
            body = json.dumps({"mldoctor_stack_error": {
                "rank": rank, "pid": pid, "kind": res["kind"], "reason": res["reason"],
                "advice": res["advice"], "snapshot": snap}})
            ctx.add(f"pyspy-{who}-snap{snap}.error.json", body, rank=rank, pid=pid, meta=meta)
    if ok == 0:
        raise ProbeFailed(first_problem or "every py-spy dump failed")
    return {"dumped": ok, "failed": failed, "snapshot": snap, "native": native}
