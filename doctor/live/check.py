"""``mldoctor check``: measure this node (host, GPUs, rank-to-rank communication) and report it
with the same facts, rules, findings, playbooks and exit codes as a diagnosis.

Why through a bundle: the checks' results are written as one artifact of the ``check`` kind, so
the report is built by the ordinary offline analysis (``engine.diagnose.analyze``), ``--out``
keeps a bundle that ``mldoctor diagnose --from`` reads back to the same verdict, and several
nodes' check bundles merge like any other evidence. The kind is reached through the probe
registry, never imported by name (the layer rule of ``tests/test_layers.py``).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from doctor.engine import facts as facts_mod
from doctor.engine.diagnose import analyze
from doctor.engine.report import Report
from doctor.engine.trace import Trace
from doctor.evidence import plugins
from doctor.evidence.bundle import Bundle, ProbeRun
from doctor.evidence.contract import CollectContext, ProbeFailed, ProbeSkipped, one_line
from doctor.evidence.errors import UserError
from doctor.live.common import Progress, finish, out_folder

KIND = "check"


def _node_name() -> str:
    """Under srun the SLURM node name (several slurmd may share one machine), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def run_check(level: str = "quick", path: Path | None = None, gpus: list[int] | None = None,
              nprocs: int | None = None, out: Path | None = None, skip_gpu: bool = False,
              skip_comm: bool = False, rules_dirs: list[Path] | None = None,
              progress: Progress = None, io_bytes: int | None = None) -> Report | None:
    """Run the checks of ``level`` (quick|full) here and return the report. ``out`` of ``-``:
    the fragment mode srun runs on each node (a bundle as .tar.gz on stdout, no report)."""
    if level not in ("quick", "full"):
        raise UserError(f"--level {level}: expected quick or full")
    if path is not None and "{node}" in str(path):  # node-local folders named after the node
        path = Path(str(path).replace("{node}", _node_name()))
    if path is not None and not path.is_dir():
        raise UserError(f"--path {path}: not a folder")
    if out is not None and str(out) == "-":
        _fragment(level, path, gpus, nprocs, skip_gpu, skip_comm, io_bytes)
        return None
    if nprocs is not None and nprocs < 2:
        raise UserError("--nprocs: at least 2 ranks are needed to test communication")
    probe = plugins.probe(KIND)
    if probe is None:
        raise UserError("the check kind is not installed (entry point mldoctor.probes: check)")
    host = _node_name()
    trace = Trace()
    tmp = None
    if out is not None:
        out = out_folder(out)
        root = out / "bundle"
    else:
        tmp = Path(tempfile.mkdtemp(prefix="mldoctor-check-"))
        root = tmp / "bundle"
    bundle = Bundle.create(root, {"type": "check", "host": host, "level": level})
    options = _options(level, path, gpus, nprocs, skip_gpu, skip_comm, io_bytes)
    if progress is not None:
        progress(f"running the {level} checks on {host}")
    run = _run_checks(probe, bundle, host, options)
    trace.add("check", f"{level} checks on {host}: {run.status} in {run.duration_s:.1f} s"
              + (f" ({run.reason})" if run.reason else ""))
    source = {"type": "check", "host": host, "level": level}
    try:
        report = analyze(facts_mod.items_from_bundle(bundle), source, None, list(bundle.manifest["probes"]),
                         rules_dirs, trace)
        return finish(report, trace, bundle, out, False)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _run_checks(probe: Any, bundle: Bundle, host: str, options: dict[str, Any]) -> ProbeRun:
    """Run the check kind once into ``bundle`` and record how it went (a skipped or failed run
    is recorded with its reason, never raised: the report says it)."""
    ctx = CollectContext(bundle, host, [], options, timeout=900.0, probe_name=KIND)
    t0 = time.perf_counter()
    try:
        probe.collect(ctx)
        status, reason = "ok", ""
    except (ProbeSkipped, ProbeFailed) as exc:
        status, reason = ("skipped" if isinstance(exc, ProbeSkipped) else "failed"), one_line(exc)
    run = ProbeRun(KIND, status, reason, round(time.perf_counter() - t0, 3), host, ctx.written)
    bundle.record_probe(run)
    return run


def _options(level: str, path: Path | None, gpus: list[int] | None, nprocs: int | None, skip_gpu: bool,
             skip_comm: bool, io_bytes: int | None) -> dict[str, Any]:
    return {"level": level, "path": str(path) if path else None, "gpus": gpus or None, "nprocs": nprocs,
            "skip_gpu": skip_gpu, "skip_comm": skip_comm, "io_bytes": io_bytes}


def _fragment(level: str, path: Path | None, gpus: list[int] | None, nprocs: int | None, skip_gpu: bool,
              skip_comm: bool, io_bytes: int | None) -> None:
    """One node's check results as a bundle fragment on stdout (what the SLURM merger reads)."""
    probe = plugins.probe(KIND)
    if probe is None:
        raise UserError("the check kind is not installed (entry point mldoctor.probes: check)")
    host = _node_name()
    tmp = Path(tempfile.mkdtemp(prefix="mldoctor-check-"))
    try:
        root = tmp / f"fragment-{host}"
        bundle = Bundle.create(root, {"type": "fragment", "host": host, "check": level})
        _run_checks(probe, bundle, host, _options(level, path, gpus, nprocs, skip_gpu, skip_comm, io_bytes))
        bundle.save()
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            tar.add(str(root), arcname=root.name)
        sys.stdout.buffer.write(buf.getvalue())
        sys.stdout.buffer.flush()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def node_command(level: str, path: Path | None, skip_gpu: bool, skip_comm: bool) -> list[str]:
    """What srun runs on every node: this installation's ``mldoctor check ... --out -`` (or the
    prefix in ``$MLDOCTOR_SLURM_COLLECT``, the same override the diagnosis fan-out uses)."""
    from doctor.live.slurm import node_command_prefix

    argv = [*node_command_prefix(), "check", "--full" if level == "full" else "--quick", "--out", "-", "-q"]
    if path is not None:
        argv += ["--path", str(path)]
    return argv + (["--no-gpu"] if skip_gpu else []) + (["--no-comm"] if skip_comm else [])


def check_slurm_job(job_id: str, level: str = "quick", path: Path | None = None, out: Path | None = None,
                    skip_gpu: bool = False, skip_comm: bool = False, rules_dirs: list[Path] | None = None,
                    node_timeout: float | None = None) -> Report:
    """``mldoctor check --slurm-job ID``: the checks on every node of the job through one srun
    step (the diagnosis fan-out's, with ``mldoctor check`` as the node command), merged into one
    report that names the nodes and GPUs that fail. Meant for a job held for health checking
    (salloc/sbatch on the nodes to vet): the GPU checks load the GPUs, so never point it at a
    training job's nodes unless they are drained (``--no-gpu`` keeps to host and network checks)."""
    from doctor.live import slurm

    if level not in ("quick", "full"):
        raise UserError(f"--level {level}: expected quick or full")
    trace = Trace()
    env = slurm.client_env()
    info = slurm.job_info(str(job_id).strip(), env)
    trace.add("discover", f"SLURM job {info.job_id}: {info.state or '?'} on {len(info.nodes)} node(s)")
    if info.state not in ("RUNNING", "SUSPENDED", "COMPLETING") or not info.nodes:
        raise UserError(f"SLURM job {info.job_id} is {info.state or 'not running'}: checks run inside a running "
                        "allocation (salloc or sbatch one on the nodes to check)")
    tmp = Path(tempfile.mkdtemp(prefix="mldoctor-check-slurm-"))
    if out is not None:
        out = out_folder(out)
        root = out / "bundle"
    else:
        root = tmp / "bundle"
    bundle = Bundle.create(root, {"type": "check", "host": socket.gethostname(), "slurm_job": info.job_id,
                                  "nodes": info.nodes, "level": level})
    shared: Path | None = None
    try:
        shared = slurm.shared_dir(info, trace)
        limit = node_timeout or (120.0 if level == "quick" else 1200.0)
        merger = slurm.Merger(bundle)
        fan = slurm.fan_out(info, shared, merger, limit, env, trace,
                            command=node_command(level, path, skip_gpu, skip_comm))
        for node, why in fan.missing.items():
            bundle.record_probe(ProbeRun("check", "failed", why, round(fan.wall_s, 3), node))
            trace.add("missing", f"{node}: {why}")
        trace.add("merge", f"{len(fan.answered)} of {len(info.nodes)} node(s) answered in {fan.wall_s:.2f}s")
        bundle.add_artifact("slurm/fanout.json", json.dumps(fan.record(info.job_id, limit, merger.seconds), indent=1),
                            "slurm")
        bundle.manifest["trace"] = trace.steps
        bundle.save()
        source = {"type": "check", "slurm_job": info.job_id, "host": socket.gethostname(), "nodes": info.nodes,
                  "level": level}
        report = analyze(facts_mod.items_from_bundle(bundle), source, None, list(bundle.manifest["probes"]),
                         rules_dirs, trace)
        return finish(report, trace, bundle, out, False)
    finally:
        if shared is not None:
            shutil.rmtree(shared, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
