"""Find the training jobs on this host: launcher trees, their rank processes, DataLoader workers.

Everything comes from /proc (cmdline, environ, status), read-only. A rank is a process whose
environment names its rank (RANK, or the SLURM/MPI equivalents); a child of a rank with the same
rank is one of its DataLoader workers; the nearest non-rank ancestor that looks like a launcher
(torchrun, deepspeed, accelerate, mpirun, srun) groups the ranks into a job.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

from doctor.evidence import procfs
from doctor.evidence.contract import RankProcess
from doctor.evidence.errors import UserError
from doctor.evidence.redact import filter_env

LAUNCHER_MARKERS = ("torch.distributed.run", "torchrun", "torch.distributed.launch", "deepspeed",
                    "accelerate", "mpirun", "mpiexec", "srun", "lightning", "composer", "torchx")
RANK_KEYS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
SIZE_KEYS = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


@dataclass
class ProcInfo:
    pid: int
    ppid: int
    state: str
    cmdline: list[str]
    env: dict[str, str] | None  # None: not readable


@dataclass
class Job:
    """One distributed job as seen on this host."""

    key: str
    launcher: RankProcess | None
    ranks: list[RankProcess] = field(default_factory=list)
    workers: list[RankProcess] = field(default_factory=list)
    dead: list[ProcInfo] = field(default_factory=list)  # zombie rank processes
    world_size: int | None = None
    local_world_size: int | None = None
    host: str = ""
    #: What was denied while finding the job and what was used instead (shown in the trace).
    notes: list[str] = field(default_factory=list)

    @property
    def procs(self) -> list[RankProcess]:
        return ([self.launcher] if self.launcher else []) + self.ranks + self.workers

    def describe(self) -> str:
        who = f"launcher {self.launcher.pid} ({' '.join(self.launcher.cmdline[:4])})" if self.launcher else "no launcher"
        ranks = ",".join(str(r.rank) for r in sorted(self.ranks, key=lambda r: r.rank or 0))
        return f"job {self.key}: {who}; ranks {ranks or '-'} of {self.world_size or '?'} on {self.host}"


def read_proc(pid: int) -> ProcInfo | None:
    """One process's identity; None when it is gone or not readable at all."""
    fields = procfs.status(pid)
    if fields is None:
        return None
    return ProcInfo(pid, int(fields.get("PPid", "0") or 0), fields.get("State", "?")[:1],
                    procfs.cmdline(pid) or [], procfs.environ(pid))


def _int(env: dict[str, str], keys: tuple[str, ...]) -> int | None:
    for k in keys:
        v = env.get(k, "")
        if v.isdigit():
            return int(v)
    return None


def _looks_like_launcher(cmd: list[str]) -> bool:
    text = " ".join(cmd[:6])
    return any(m in text for m in LAUNCHER_MARKERS)


def all_procs() -> dict[int, ProcInfo]:
    me = os.getpid()
    out = {}
    for pid in procfs.pids():
        if pid != me:
            info = read_proc(pid)
            if info is not None:
                out[info.pid] = info
    return out


def _is_python(cmd: list[str]) -> bool:
    return bool(cmd) and ("python" in Path(cmd[0]).name or any(c.endswith(".py") for c in cmd[:3]))


CAP_SYS_PTRACE = 19


def access_limits(owner_uid: int | None = None) -> str:
    """Why this user cannot read another user's processes (environment, stacks), in words: the
    ptrace scope, the user ids, the container's capabilities. Empty when nothing limits it."""
    me = os.geteuid()
    if me == 0 and _has_cap_ptrace():
        return ""
    why = []
    if owner_uid is not None and owner_uid != me:
        why.append(f"the job runs as uid {owner_uid}, mldoctor as uid {me}: its environment and stacks are "
                   "readable only by that user or root")
    scope = (procfs.read_text(None, "sys/kernel/yama/ptrace_scope") or "").strip()
    if scope in ("1", "2", "3"):
        meaning = {"1": "only a parent may attach (py-spy needs sudo or the job's own parent)",
                   "2": "only root (CAP_SYS_PTRACE) may attach", "3": "no process may attach at all"}[scope]
        why.append(f"kernel.yama.ptrace_scope={scope}: {meaning}")
    if me == 0 and not _has_cap_ptrace():
        why.append("running as root without CAP_SYS_PTRACE (a container without --cap-add SYS_PTRACE)")
    return "; ".join(why)


def _has_cap_ptrace() -> bool:
    caps = (procfs.status(os.getpid()) or {}).get("CapEff", "0")
    try:
        return bool(int(caps, 16) >> CAP_SYS_PTRACE & 1)
    except ValueError:
        return False


def _uid(pid: int) -> int | None:
    fields = (procfs.status(pid) or {}).get("Uid", "").split()
    return int(fields[0]) if fields and fields[0].isdigit() else None


_LOCAL_RANK_ARG = re.compile(r"^--local[-_]rank(?:=(\d+))?$")


def _local_rank_arg(cmd: list[str]) -> int | None:
    """``--local-rank=N`` / ``--local_rank N`` (torch.distributed.launch passes it to each rank)."""
    for i, arg in enumerate(cmd):
        m = _LOCAL_RANK_ARG.match(arg)
        if m:
            value = m.group(1) or (cmd[i + 1] if i + 1 < len(cmd) else "")
            return int(value) if value.isdigit() else None
    return None


def _unreadable_jobs(procs: dict[int, ProcInfo], children: dict[int, list[int]], host: str) -> list[Job]:
    """Jobs seen only from the outside: Python children of a launcher whose environments this
    user may not read. Their ranks are taken from ``--local-rank`` arguments, else from start
    order (a launcher starts its local ranks in order); the job then runs on what needs no
    environment (process states, logs it can open, the debug server, dump folders), and says so."""
    jobs = []
    for lp in sorted(procs.values(), key=lambda p: p.pid):
        if not _looks_like_launcher(lp.cmdline) or "mldoctor" in " ".join(lp.cmdline[:3]):
            continue
        kids = [procs[c] for c in sorted(children.get(lp.pid, [])) if c in procs]
        ranks = [k for k in kids if k.env is None and _is_python(k.cmdline) and k.state != "Z"]
        if not ranks:
            continue
        args = [_local_rank_arg(k.cmdline) for k in ranks]
        from_args = all(a is not None for a in args) and len(set(args)) == len(args)
        owner = _uid(ranks[0].pid)
        job = Job(str(lp.pid), RankProcess(lp.pid, None, host=host, cmdline=lp.cmdline, env={}, role="launcher",
                                           parent=lp.ppid), host=host, local_world_size=len(ranks))
        for i, (k, a) in enumerate(zip(ranks, args, strict=True)):
            rank = a if from_args else i
            job.ranks.append(RankProcess(k.pid, rank, rank, None, host, k.cmdline, {}, "rank", lp.pid))
        why = access_limits(owner) or "their /proc/PID/environ is not readable"
        job.notes.append(
            f"the environments of {len(ranks)} process(es) under launcher {lp.pid} are not readable ({why}); "
            f"ranks taken {'from their --local-rank arguments' if from_args else 'from start order (local ranks)'}; "
            "stacks through py-spy may be denied too: the debug server (--debug-server), logs, "
            "flight-recorder dumps and process states are used where readable")
        jobs.append(job)
    return jobs


def _check_explicit_pid(p: ProcInfo, has_ranks: bool) -> None:
    """A ``--pid`` that can say nothing is a usage error (exit 2), not a healthy job: a zombie
    (exited, only its exit status is left) or a process that is not Python and has no rank below
    it (py-spy finds no interpreter there, so every probe would come back empty)."""
    if has_ranks or _looks_like_launcher(p.cmdline):
        return
    if p.state == "Z":
        raise UserError(f"--pid {p.pid}: a zombie (it exited; its parent {p.ppid} has not reaped it yet), "
                        f"nothing is left to inspect; diagnose its parent (--pid {p.ppid}) or its logs (--from LOG)")
    if _is_python(p.cmdline) or "python" in (procfs.read_text(p.pid, "maps") or ""):
        return
    name = Path(p.cmdline[0]).name if p.cmdline else "?"
    raise UserError(f"--pid {p.pid} ({name}): not a Python process; give the PID of a training rank "
                    "or of its launcher (torchrun, deepspeed, srun)")


def discover(pids: list[int] | None = None, slurm_job: str | None = None, node: str | None = None) -> list[Job]:
    """Jobs on this host (only the given PIDs' job when ``pids`` is set).

    ``node`` (a SLURM node name) keeps only processes whose SLURMD_NODENAME is that node: where
    several slurmd share one host, every node's ranks are visible here. With ``slurm_job`` and no
    ``node``, the node is this process's own SLURMD_NODENAME when it runs inside a SLURM step
    (``mldoctor collect`` under srun), and the processes of that same step (the collectors) are
    never ranks. The job's host is then the node name.
    """
    own_step = None
    if slurm_job and os.environ.get("SLURM_JOB_ID") == slurm_job:
        node = node or os.environ.get("SLURMD_NODENAME") or None
        own_step = os.environ.get("SLURM_STEP_ID")
    host = node or socket.gethostname()
    procs = all_procs()
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)

    def rank_of(p: ProcInfo) -> int | None:
        if p.env is None or not _is_python(p.cmdline) or "mldoctor" in " ".join(p.cmdline[:3]):
            return None
        if slurm_job and p.env.get("SLURM_JOB_ID") != slurm_job:
            return None
        if node and p.env.get("SLURMD_NODENAME", node) != node:
            return None
        if own_step is not None and p.env.get("SLURM_STEP_ID") == own_step:
            return None
        return _int(p.env, RANK_KEYS) if ("RANK" in p.env or "LOCAL_RANK" in p.env or
                                          "OMPI_COMM_WORLD_RANK" in p.env or "PMI_RANK" in p.env or
                                          ("SLURM_PROCID" in p.env and "SLURM_STEP_ID" in p.env)) else None

    rank_pids = {pid for pid, p in procs.items() if rank_of(p) is not None}
    if pids:
        missing = [p for p in pids if p not in procs]
        if missing:
            raise UserError(f"--pid {missing[0]}: no such process (or not readable)")
        wanted = set(pids)
        # --pid may name a launcher: take its rank children.
        for pid in pids:
            wanted |= {c for c in children.get(pid, []) if c in rank_pids}
            wanted |= {g for c in children.get(pid, []) for g in children.get(c, []) if g in rank_pids}
        rank_pids &= wanted | {p for p in rank_pids if procs[p].ppid in wanted}
        for pid in pids:
            _check_explicit_pid(procs[pid], any(procs[r].ppid == pid or procs.get(procs[r].ppid, procs[r]).ppid == pid
                                                for r in rank_pids))
            if pid not in rank_pids and not _looks_like_launcher(procs[pid].cmdline) \
                    and not any(procs[r].ppid == pid for r in rank_pids):
                rank_pids.add(pid)  # an explicit PID is diagnosed even without rank variables

    jobs: dict[str, Job] = {}
    for pid in sorted(rank_pids):
        p = procs[pid]
        env = p.env or {}
        parent = procs.get(p.ppid)
        # A DataLoader worker is a child of a rank process and inherits its rank.
        if parent is not None and parent.pid in rank_pids and rank_of(parent) == rank_of(p):
            continue
        launcher = None
        anc = parent
        hops = 0
        while anc is not None and hops < 4:
            if anc.pid not in rank_pids and _looks_like_launcher(anc.cmdline):
                launcher = anc
                break
            anc = procs.get(anc.ppid)
            hops += 1
        key = str(launcher.pid) if launcher else (
            f"{env.get('MASTER_ADDR', '?')}:{env.get('MASTER_PORT', '?')}" if env.get("MASTER_PORT")
            else env.get("SLURM_JOB_ID") or f"pid{pid}")
        job = jobs.get(key)
        if job is None:
            lp = None
            if launcher:
                lp = RankProcess(launcher.pid, None, host=host, cmdline=launcher.cmdline,
                                 env=filter_env(launcher.env or {}), role="launcher", parent=launcher.ppid)
            job = jobs[key] = Job(key, lp, host=host)
        rank = rank_of(p)
        if p.state == "Z":
            job.dead.append(p)
            continue
        rp = RankProcess(pid, rank, _int(env, ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")),
                         _int(env, SIZE_KEYS), host, p.cmdline, filter_env(env), "rank", p.ppid)
        job.ranks.append(rp)
        job.world_size = job.world_size or rp.world_size
        job.local_world_size = job.local_world_size or _int(env, ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"))
        for c in children.get(pid, []):
            cp = procs.get(c)
            if cp is not None and cp.state != "Z" and _is_python(cp.cmdline):
                job.workers.append(RankProcess(c, rank, rp.local_rank, rp.world_size, host, cp.cmdline,
                                               {}, "worker", pid))
    if not jobs and not pids and not slurm_job:  # nothing readable: see the job from outside
        return _unreadable_jobs(procs, children, host)
    # Launchers whose rank children are all gone still say something: a job that lost its ranks.
    return sorted(jobs.values(), key=lambda j: j.key)


def pick_job(jobs: list[Job], which: str | None) -> Job:
    if not jobs:
        limits = access_limits()
        raise UserError("no PyTorch job found on this host (no process with RANK/WORLD_SIZE in its "
                        "environment that this user can read, and no launcher with Python children)"
                        + (f"; note: {limits}" if limits else "") + "; use --pid PID, or --from FILES")
    if which:
        for j in jobs:
            if j.key == which or (j.launcher and str(j.launcher.pid) == which):
                return j
        raise UserError(f"--job {which}: not among the jobs found: " + "; ".join(j.describe() for j in jobs))
    if len(jobs) > 1:
        raise UserError("several jobs on this host; pick one with --job KEY: " + "; ".join(j.describe() for j in jobs))
    return jobs[0]
