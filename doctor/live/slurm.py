"""``mldoctor diagnose --slurm-job ID``: collect on every node of a SLURM job, merge, diagnose.

One ``srun`` step inside the job's allocation runs ``mldoctor collect`` on every node at once
(``--overlap`` so it never waits behind the training step; ``--ntasks-per-node=1``). Each task
writes its fragment (a small .tar.gz bundle) to its stdout, and srun's ``--output`` pattern with
``%n`` (the node's index in the step) makes each node's slurmstepd write that stream straight
into its own file in a folder every node can see. Nothing binary crosses srun's own I/O
forwarding, and no ssh loop is needed. Why this shape, the options and the 1,024-node estimate:
docs/slurm.md.

While srun runs, every fragment that is complete (its gzip stream ends with a valid trailer) is
unpacked and moved into the merged bundle at once, one file at a time, so merging overlaps the
wait and memory stays flat whatever the node count. At the per-node deadline the nodes that
have not answered are reported as missing evidence, by name and with the reason (no answer,
launch failed, collector error), and our own srun step (never the job) is ended; the
diagnosis of the rest comes back on time. The scheduler's own record of the job (scontrol,
sacct, squeue) and the fan-out record go into the bundle too, so ``diagnose --from`` replays it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from doctor.engine.diagnose import analyze
from doctor.engine.report import Report
from doctor.engine.trace import Trace
from doctor.evidence.bundle import MANIFEST, Bundle, ProbeRun, bad_relpath
from doctor.evidence.contract import one_line
from doctor.evidence.errors import UserError
from doctor.live import window
from doctor.live.common import FOLLOW_UP_ENV, finish, import_cel_core, out_folder

ENV_SHARED_DIR = "MLDOCTOR_SLURM_SHARED_DIR"
ENV_NODE_TIMEOUT = "MLDOCTOR_SLURM_NODE_TIMEOUT"
ENV_SRUN_ARGS = "MLDOCTOR_SRUN_ARGS"
ENV_COLLECT = "MLDOCTOR_SLURM_COLLECT"
#: Seconds kept back from the budget for merging the last fragments and the analysis.
ANALYSIS_RESERVE_S = 4.0
MIN_NODE_TIMEOUT_S = 5.0
POLL_S = 0.1
#: After srun exits, how long a fragment file may still be settling on a shared filesystem.
SETTLE_S = 1.5
#: A fragment holds what the rules need from one node (a few KiB to a few MiB); more is refused.
MAX_FRAGMENT = 256 * 2**20
_LAUNCH_FAILED = re.compile(r"Task launch for StepId=\S+ failed on node (\S+?):\s*(.*)")


def _fanout_api() -> Any:
    """The SLURM evidence kind's helpers (host lists, scontrol parsing, commands)."""
    from doctor.probes import slurm as slurm_probe

    return slurm_probe


def client_env() -> dict[str, str]:
    """Our environment for SLURM clients, minus the job variables of any allocation we run in.

    Run from inside another allocation (salloc, a batch script), inherited SLURM_NTASKS,
    SLURM_CPUS_PER_TASK and friends would silently change what srun asks for.
    """
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SRUN_", "SBATCH_", "SALLOC_")) or k == "SLURM_CONF"}
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class JobInfo:
    """The job as ``scontrol show job`` describes it."""

    job_id: str
    state: str
    nodes: list[str]
    node_expr: str
    work_dir: str
    raw: dict[str, Any] = field(default_factory=dict)


def job_info(job_id: str, env: dict[str, str], timeout: float = 10.0) -> JobInfo:
    api = _fanout_api()
    if not api.valid_job_id(job_id):
        raise UserError(f"--slurm-job {job_id!r}: not a SLURM job id (4242, 4242_7 or 4242+1)")
    if shutil.which("scontrol", path=env.get("PATH")) is None:
        raise UserError("--slurm-job needs the SLURM client tools (scontrol, srun) on this host")
    try:
        res = subprocess.run(["scontrol", "show", "job", "-d", job_id], capture_output=True, text=True,
                             timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise UserError(f"scontrol show job {job_id}: slurmctld did not answer within {timeout:.0f}s") from None
    if res.returncode != 0:
        msg = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
        raise UserError(f"SLURM job {job_id}: {msg}")
    jobs = [j for j in api.parse_scontrol_jobs(res.stdout) if job_id in
            (j.get("JobId"), f"{j.get('ArrayJobId')}_{j.get('ArrayTaskId')}")] or api.parse_scontrol_jobs(res.stdout)
    if not jobs:
        raise UserError(f"SLURM job {job_id}: scontrol printed no job record")
    job = jobs[0]
    expr = job.get("NodeList", "")
    try:
        nodes = api.expand_hostlist(expr)
    except ValueError as exc:
        raise UserError(f"SLURM job {job_id}: {exc}") from None
    return JobInfo(str(job.get("JobId", job_id)), job.get("JobState", ""), nodes,
                   "" if expr in ("(null)", "None") else expr, job.get("WorkDir", ""), job)


def default_node_timeout(budget: float) -> float:
    env = os.environ.get(ENV_NODE_TIMEOUT, "").strip()
    if env:
        try:
            return max(1.0, float(env))
        except ValueError:
            raise UserError(f"{ENV_NODE_TIMEOUT}={env!r}: not a number of seconds") from None
    return max(MIN_NODE_TIMEOUT_S, min(budget * 0.75, budget - ANALYSIS_RESERVE_S))


def node_command_prefix() -> list[str]:
    """How a node starts mldoctor: ``$MLDOCTOR_SLURM_COLLECT`` when set (a wrapper, a container
    exec), else this installation's own ``mldoctor`` script."""
    custom = os.environ.get(ENV_COLLECT, "").strip()
    if custom:
        return shlex.split(custom)
    exe = Path(sys.executable).with_name("mldoctor")
    return [str(exe) if exe.exists() else (shutil.which("mldoctor") or "mldoctor")]


def collect_command(job_id: str, symptom: str | None = None, duration: float = 10.0) -> list[str]:
    """What every node runs: this installation's ``mldoctor collect`` (or ``$MLDOCTOR_SLURM_COLLECT``);
    ``--symptom slow`` makes every node record its sampling window too."""
    prefix = node_command_prefix()
    extra = ["--symptom", symptom, "--duration", f"{duration:g}"] if symptom else []
    return [*prefix, "collect", "--slurm-job", job_id, "--out", "-", *extra]


def srun_command(job_id: str, nodes: list[str], node_expr: str, shared: Path, node_timeout: float,
                 command: list[str]) -> list[str]:
    """The one srun step that collects on every node (see docs/slurm.md for each option)."""
    minutes = max(1, int(node_timeout // 60) + 1)
    argv = [
        "srun", f"--jobid={job_id}",
        "--overlap",                       # share the job's CPUs, memory and GRES: never queue behind the training step
        f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1",
        f"--nodelist={node_expr or ','.join(nodes)}",
        "--cpus-per-task=1", "--mem=0",    # ask for no memory of the job's own (pre-20.11.3 overlap shared only CPUs)
        "--kill-on-bad-exit=0",            # one node's collector failing must not end the others'
        "--input=none", f"--job-name={_fanout_api().OWN_STEP}", f"--chdir={shared}", f"--time={minutes}",
        f"--output={shared}/frag-%n.tar.gz", f"--error={shared}/err-%n.txt",
    ]
    argv += shlex.split(os.environ.get(ENV_SRUN_ARGS, ""))
    return argv + command


def shared_dir(info: JobInfo, trace: Trace) -> Path:
    """A fresh folder every node of the job can see: $MLDOCTOR_SLURM_SHARED_DIR, else the job's WorkDir.

    The job's working directory is where SLURM started it on every node, so it is on a shared
    filesystem in practice; /tmp is the last resort (right only when all nodes are this host).
    """
    base = os.environ.get(ENV_SHARED_DIR, "").strip()
    for cand in ([base] if base else []) + [info.work_dir]:
        if cand and os.path.isdir(cand) and os.access(cand, os.W_OK | os.X_OK):
            return Path(tempfile.mkdtemp(prefix=".mldoctor-frag-", dir=cand))
    trace.add("slurm", f"no writable shared folder (set {ENV_SHARED_DIR}); using this host's temp dir, "
                       "which only nodes on this host can see")
    return Path(tempfile.mkdtemp(prefix="mldoctor-frag-"))


class Merger:
    """Merges complete fragments into one bundle, one fragment at a time, as they arrive.

    A fragment (a few KiB of gzip) is checked whole in memory first (a gzip stream that is
    still being written fails its trailer check, so nothing half-written is ever used), then
    each artifact its manifest lists is checked against its sha256 and written straight to its
    place in the merged bundle: no staging folder, no extraction tree to delete (directory
    operations dominate on shared filesystems). Memory holds one fragment; the bookkeeping is
    kept in sets so that merging stays linear in the number of nodes.
    """

    def __init__(self, bundle: Bundle) -> None:
        self.bundle = bundle
        self.artifacts = 0
        self.seconds = 0.0
        man = bundle.manifest
        self._paths = {a["path"] for a in man["artifacts"]}
        self._hosts = set(man["hosts"])
        self._ranks = set(man["ranks"])
        self._dirs: set[Path] = set()

    def _read(self, frag: Path) -> tuple[dict[str, Any], dict[str, bytes]]:
        """(manifest, {relative path: bytes}) of a whole fragment; UserError when not whole or not one."""
        try:
            raw = frag.read_bytes()
            if len(raw) > MAX_FRAGMENT:
                raise UserError(f"{frag.name}: {len(raw) / 2**20:.0f} MiB is larger than a fragment can be")
            data = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as exc:
            raise UserError(f"{frag.name}: not a whole gzip stream ({one_line(exc)})") from None
        if len(data) > MAX_FRAGMENT:
            raise UserError(f"{frag.name}: unpacks to more than {MAX_FRAGMENT / 2**20:.0f} MiB; refusing")
        files: dict[str, bytes] = {}
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
                for m in tar:
                    parts = PurePosixPath(m.name).parts
                    if not m.isfile() or m.name.startswith("/") or ".." in parts or len(parts) < 2:
                        continue
                    src = tar.extractfile(m)
                    if src is not None:
                        files["/".join(parts[1:])] = src.read()  # below the fragment's top folder
        except tarfile.TarError as exc:
            raise UserError(f"{frag.name}: not a readable archive ({one_line(exc)})") from None
        try:
            man = json.loads(files.pop(MANIFEST))
        except KeyError:
            raise UserError(f"{frag.name}: no {MANIFEST} in the fragment") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"{frag.name}: manifest is not valid JSON ({one_line(exc)})") from None
        if not isinstance(man, dict) or not str(man.get("schema", "")).startswith("mldoctor.bundle/"):
            raise UserError(f"{frag.name}: not an mldoctor fragment")
        return man, files

    def add(self, frag: Path, expect: str, replace: bool = False) -> tuple[str, float]:
        """Merge one fragment; returns (node name, seconds its collection took). Raises UserError.

        ``replace``: a follow-up round's artifact replaces the first pass's file of the same name
        (as a follow-up does in a local diagnosis); otherwise the first one stays.
        """
        t0 = time.perf_counter()
        out = self.bundle.manifest
        try:
            man, files = self._read(frag)
            node = str((man.get("target") or {}).get("host") or expect)
            if node != expect:
                self.bundle.note(f"the fragment expected from {expect} says it comes from {node}; kept as {node}")
            for art in man.get("artifacts", []):
                rel = str(art.get("path", ""))
                body = files.get(rel)
                if bad_relpath(rel) or rel == MANIFEST:  # the same check as Bundle.load
                    continue
                if body is None or hashlib.sha256(body).hexdigest() != art.get("sha256"):
                    self.bundle.note(f"{node}: {rel}: {'missing from' if body is None else 'sha256 differs in'} "
                                     "the fragment; left out")
                    continue
                if rel in self._paths:
                    if not replace:
                        continue
                    out["artifacts"] = [a for a in out["artifacts"] if a["path"] != rel]
                dest = self.bundle.root / rel
                if dest.parent not in self._dirs:
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    self._dirs.add(dest.parent)
                fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(body)
                out["artifacts"].append(art)
                self._paths.add(rel)
                self.artifacts += 1
            for run in man.get("probes", []):
                out["probes"].append({**run, "host": run.get("host") or node})
            for note in man.get("notes", []):
                self.bundle.note(f"{node}: {note}")
            for h in man.get("hosts", []) or [node]:
                if h not in self._hosts:
                    self._hosts.add(h)
                    out["hosts"].append(h)
            for r in man.get("ranks", []):
                if r not in self._ranks:
                    self._ranks.add(r)
                    out["ranks"].append(r)
            steps = man.get("trace") or []
            collect_s = max((float(s.get("t", 0.0)) for s in steps if isinstance(s, dict)), default=0.0)
            return node, round(collect_s, 3)
        finally:
            self.seconds += time.perf_counter() - t0


@dataclass
class FanOut:
    """What one fan-out over the job's nodes brought back."""

    asked: list[str]
    answered: dict[str, float] = field(default_factory=dict)  # node -> seconds its collect took
    arrived: dict[str, float] = field(default_factory=dict)   # node -> seconds from srun start
    missing: dict[str, str] = field(default_factory=dict)     # node -> why
    srun: list[str] = field(default_factory=list)
    srun_rc: int | None = None
    wall_s: float = 0.0
    retried: list[str] = field(default_factory=list)

    def record(self, job_id: str, node_timeout: float, merge_s: float) -> dict[str, Any]:
        return {"schema": "mldoctor.slurm-fanout/1", "job_id": job_id, "asked": self.asked,
                "answered": [n for n in self.asked if n in self.answered], "missing": self.missing,
                "node_timeout_s": node_timeout, "wall_s": round(self.wall_s, 3),
                "collect_s": self.answered, "arrived_s": {k: round(v, 3) for k, v in self.arrived.items()},
                "merge_s": round(merge_s, 3), "srun": self.srun, "srun_rc": self.srun_rc, "retried": self.retried}


def _stop_srun(proc: subprocess.Popen[bytes]) -> None:
    """End our own srun (it cancels only its own step, never the job): TERM, then KILL."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1].strip()[:240] if lines else ""


def run_fanout(job_id: str, nodes: list[str], node_expr: str, shared: Path, merger: Merger, deadline: float,
               node_timeout: float, env: dict[str, str], trace: Trace, result: FanOut | None = None,
               requests: list[tuple[str, dict[str, Any]]] | None = None, symptom: str | None = None,
               duration: float = 10.0, command: list[str] | None = None) -> FanOut:
    """One srun over ``nodes``; merge fragments as they complete; stop at ``deadline``.

    ``requests``: a follow-up round (only these probe runs on each node, via the collector's
    environment); its artifacts replace the first pass's files of the same name. ``command``:
    what each node runs instead of ``mldoctor collect`` (``mldoctor check`` writes a fragment too).
    """
    res = result or FanOut(list(nodes))
    round_dir = Path(tempfile.mkdtemp(prefix="r", dir=shared))
    argv = srun_command(job_id, nodes, node_expr, round_dir, node_timeout,
                        command or collect_command(job_id, None if requests else symptom, duration))
    res.srun = argv
    trace.add("srun", shlex.join(argv))
    t0 = time.monotonic()
    stderr_path = round_dir / "srun.stderr"
    if requests:
        env = {**env, FOLLOW_UP_ENV: json.dumps([list(r) for r in requests])}
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                env=env, start_new_session=True)
    pending = dict(enumerate(nodes))
    last_error: dict[str, str] = {}
    tried: dict[int, tuple[int, int]] = {}  # (size, mtime) of a fragment that was not whole yet
    t0_wall = time.time()

    def sweep(final: bool) -> None:
        """Merge every fragment that is whole now; a node's answer time is its file's mtime."""
        for i, node in list(pending.items()):
            frag = round_dir / f"frag-{i}.tar.gz"
            try:
                st = frag.stat()
            except OSError:
                continue
            sig = (st.st_size, st.st_mtime_ns)
            if st.st_size == 0 or (tried.get(i) == sig and not final):
                continue
            try:
                name, collect_s = merger.add(frag, node, replace=bool(requests))
            except UserError as exc:  # not whole yet (or broken): look again when it changes
                tried[i] = sig
                last_error[node] = one_line(exc)
                continue
            del pending[i]
            res.answered[name] = collect_s
            res.arrived[name] = round(max(0.0, st.st_mtime - t0_wall), 3)
            trace.add("fragment", f"{name}: answered after {res.arrived[name]:.2f}s "
                                  f"(collection {collect_s:.2f}s on the node)")
            try:
                frag.unlink()
            except OSError:
                pass

    exited_at: float | None = None
    try:
        while pending:
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            sweep(final=False)
            if not pending or now >= deadline or (exited_at is not None and now - exited_at >= SETTLE_S):
                break
            time.sleep(POLL_S)
    finally:
        if not pending and proc.poll() is None:  # every fragment is in: let the collectors exit
            try:
                proc.wait(timeout=max(0.1, min(SETTLE_S, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                pass
        timed_out = proc.poll() is None and bool(pending)
        _stop_srun(proc)
        res.srun_rc = proc.returncode
    sweep(final=True)  # whatever was whole by the deadline counts, merged or not yet
    timed_out = timed_out and bool(pending)
    res.wall_s = max(res.wall_s, time.monotonic() - t0)
    stderr = stderr_path.read_text(errors="replace") if stderr_path.exists() else ""
    launch_failed = {m.group(1): m.group(2).strip() for m in _LAUNCH_FAILED.finditer(stderr)}
    srun_msg = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip().startswith("srun: error")), "")
    for i, node in pending.items():
        err = _last_line(round_dir / f"err-{i}.txt")
        if node in launch_failed:
            why = f"srun could not start the collector there: {launch_failed[node]}"
        elif timed_out:
            why = f"did not answer within {node_timeout:.0f}s (no complete fragment)"
        elif node in last_error:
            why = f"fragment unusable: {last_error[node]}"
        elif err:
            why = f"collector ended without a fragment: {err}"
        elif srun_msg:
            why = f"no fragment; {srun_msg}"
        else:
            why = f"no fragment (srun exit {proc.returncode})"
        res.missing[node] = why
    if stderr.strip():
        trace.add("srun", f"exit {proc.returncode}" + (" (stopped at the deadline)" if timed_out else "")
                  + f"; stderr: {' | '.join(stderr.strip().splitlines()[-3:])[:400]}")
    shutil.rmtree(round_dir, ignore_errors=True)
    return res


def fan_out(info: JobInfo, shared: Path, merger: Merger, node_timeout: float, env: dict[str, str],
            trace: Trace, symptom: str | None = None, duration: float = 10.0,
            command: list[str] | None = None) -> FanOut:
    """Collect on every node; one retry for nodes lost only because srun aborted the step early.

    When one node cannot start its task, srun aborts the whole step; the nodes that had not
    finished yet lose their fragment through no fault of their own. Those get one more srun
    (without the failed nodes) if the deadline leaves time for it.
    """
    t0 = time.monotonic()
    deadline = t0 + node_timeout
    res = run_fanout(info.job_id, info.nodes, info.node_expr, shared, merger, deadline, node_timeout, env, trace,
                     symptom=symptom, duration=duration, command=command)
    innocent = [n for n, why in res.missing.items()
                if not why.startswith(("srun could not start", "did not answer"))]
    launch_failed = any(why.startswith("srun could not start") for why in res.missing.values())
    if innocent and launch_failed and deadline - time.monotonic() > MIN_NODE_TIMEOUT_S:
        trace.add("retry", f"srun aborted the step because a node failed to launch; once more on {', '.join(innocent)}")
        for n in innocent:
            res.missing.pop(n, None)
        res.retried = list(innocent)
        res = run_fanout(info.job_id, innocent, ",".join(innocent), shared, merger, deadline, node_timeout, env,
                         trace, res, symptom=symptom, duration=duration, command=command)
    res.wall_s = time.monotonic() - t0
    return res


def plan_follow_ups(report: Report, answered: list[str], done: set[tuple[str, str]],
                    trace: Trace) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """The node-side probe runs the leading hypotheses ask for, and the nodes that hold those ranks.

    Snapshot requests are left out: every node's first pass already took two snapshots; the
    SLURM record is read here, not on the nodes.
    """
    from doctor.evidence import plugins

    table = plugins.follow_ups()

    where = (report.facts.get("job") or {}).get("rank_hosts") or {}
    requests: list[tuple[str, dict[str, Any]]] = []
    nodes: set[str] = set()
    for fu in report.follow_ups:
        if fu.get("probe") in ("slurm", "snapshots"):
            continue
        for name, opts in table.get(fu.get("probe", ""), []):
            if "snapshot" in opts:
                continue
            ranks = sorted({int(r) for r in fu.get("ranks") or []}) or None
            key = (name, repr((ranks, sorted(opts.items()))))
            if key in done:
                continue
            done.add(key)
            on = sorted({where[str(r)] for r in ranks if str(r) in where}) if ranks else list(answered)
            on = [n for n in on if n in answered]
            if not on:
                continue
            if getattr(plugins.probe(name), "runs_for_duration", False):
                opts = {**opts, **window.early_end()}  # a rule-asked window ends once decisive, per node
            trace.add("follow-up", f"{fu['probe']} on ranks {ranks or 'all'} ({', '.join(on)}): "
                                   f"{fu.get('why') or 'asked by ' + fu.get('rule', 'a rule')}")
            requests.append((name, {**opts, "ranks": ranks}))
            nodes.update(on)
    return requests, [n for n in answered if n in nodes]


def _controller_slurm_evidence(bundle: Bundle, job_id: str, env: dict[str, str], trace: Trace) -> None:
    """scontrol/sacct/squeue once, from here (never from every node)."""
    from doctor.evidence.contract import ProbeFailed, ProbeSkipped

    t0 = time.perf_counter()
    try:
        outputs, errors = _fanout_api().run_commands(job_id, 10.0, env)
    except (ProbeSkipped, ProbeFailed) as exc:
        status = "skipped" if isinstance(exc, ProbeSkipped) else "failed"
        bundle.record_probe(ProbeRun("slurm", status, one_line(exc), round(time.perf_counter() - t0, 3)))
        trace.add("probe", f"slurm: {status} ({one_line(exc)})")
        return
    for name, text in outputs.items():
        bundle.add_artifact(f"slurm/{name}", text, "slurm")
    for line in errors:
        bundle.note(f"slurm probe: {line}")
    reason = "; ".join(errors)
    bundle.record_probe(ProbeRun("slurm", "ok", reason, round(time.perf_counter() - t0, 3), socket.gethostname(),
                                 len(outputs)))
    trace.add("probe", f"slurm: ok ({', '.join(sorted(outputs))})" + (f"; {reason}" if reason else ""))


def _warm_up(rules_dirs: list[Path] | None) -> None:
    """Import the evidence kinds and compile the rules (both cached) ahead of the analysis."""
    try:
        import_cel_core()
        from doctor.engine import ruleset as engine
        from doctor.evidence import plugins

        plugins.probes()
        engine.load_ruleset(rules_dirs)
    except Exception:  # noqa: S110 - the analysis itself reports any problem, once
        pass


def diagnose_slurm_job(job_id: str, symptom: str | None = None, rules_dirs: list[Path] | None = None,
                       budget: float = 30.0, out: Path | None = None, redact_hosts: bool = False,
                       duration: float = 10.0) -> Report:
    """Collect on every node of the job through one srun, merge the fragments, diagnose."""
    trace = Trace()
    env = client_env()
    job_id = str(job_id).strip()
    info = job_info(job_id, env)
    trace.add("discover", f"SLURM job {info.job_id}: {info.state or '?'} on {len(info.nodes)} node(s) "
                          f"{info.node_expr or '-'}")
    tmp = Path(tempfile.mkdtemp(prefix="mldoctor-slurm-"))
    if out is not None:
        out = out_folder(out)  # never into (or over) a folder mldoctor did not create
        root = out / "bundle"
    else:
        root = tmp / "bundle"
    bundle = Bundle.create(root, {"type": "slurm", "host": socket.gethostname(), "slurm_job": info.job_id,
                                  "nodes": info.nodes})
    shared: Path | None = None
    try:
        _controller_slurm_evidence(bundle, info.job_id, env, trace)
        fan: FanOut | None = None
        node_timeout = default_node_timeout(budget)
        merger = Merger(bundle)
        if info.state in ("RUNNING", "SUSPENDED", "COMPLETING") and info.nodes:
            # Load the probes and compile the rules while the nodes collect (about 2 s of a cold start).
            threading.Thread(target=_warm_up, args=(rules_dirs,), daemon=True).start()
            shared = shared_dir(info, trace)
            trace.add("slurm", f"collecting on {len(info.nodes)} node(s) through srun; fragments in {shared}; "
                               f"{node_timeout:.0f}s per node")
            fan = fan_out(info, shared, merger, node_timeout, env, trace, symptom, duration)
            for node, why in fan.missing.items():
                bundle.record_probe(ProbeRun("collect", "failed", why, round(fan.wall_s, 3), node))
                trace.add("missing", f"{node}: {why}")
            trace.add("merge", f"{len(fan.answered)} of {len(info.nodes)} node(s) answered in {fan.wall_s:.2f}s; "
                               f"{merger.artifacts} artifact(s) merged in {merger.seconds:.2f}s")
            bundle.add_artifact("slurm/fanout.json", json.dumps(fan.record(info.job_id, node_timeout, merger.seconds),
                                                               indent=1), "slurm")
        else:
            trace.add("slurm", f"job is {info.state or 'not running'}: no processes to collect on its nodes; "
                               "diagnosing from SLURM's record")
        source = {"type": "live", "slurm_job": info.job_id, "host": socket.gethostname(), "job": info.job_id,
                  "nodes": info.nodes}
        from doctor.engine import facts as facts_mod

        def evaluate() -> Report:
            bundle.manifest["trace"] = trace.steps
            bundle.save()
            return analyze(facts_mod.items_from_bundle(bundle), source, symptom, list(bundle.manifest["probes"]),
                           rules_dirs, trace)

        report = evaluate()
        if fan is not None and fan.answered and shared is not None:
            answered = [n for n in info.nodes if n in fan.answered]
            requests, on = plan_follow_ups(report, answered, set(), trace)
            left = budget - (time.perf_counter() - trace.t0) - ANALYSIS_RESERVE_S
            if requests and left < MIN_NODE_TIMEOUT_S:
                trace.add("stop", f"time budget of {budget:.0f}s spent; follow-ups not run")
            elif requests:
                t_fu = min(node_timeout, left)
                fu = run_fanout(info.job_id, on, ",".join(on), shared, merger, time.monotonic() + t_fu, t_fu, env,
                                trace, FanOut(list(on)), requests)
                for node, why in fu.missing.items():
                    bundle.record_probe(ProbeRun("follow-up", "failed", why, round(fu.wall_s, 3), node))
                    trace.add("missing", f"{node} (follow-up): {why}")
                trace.add("merge", f"follow-up: {len(fu.answered)} of {len(on)} node(s) answered in {fu.wall_s:.2f}s")
                report = evaluate()
            else:
                trace.add("stop", "no rule asks for more evidence from the nodes")
        return finish(report, trace, bundle, out, redact_hosts)
    finally:
        if shared is not None:
            shutil.rmtree(shared, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
