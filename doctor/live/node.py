"""``mldoctor collect``: node-local collection into a bundle (fragment), nothing diagnosed.

This is what ``diagnose --slurm-job`` runs on every node through srun; it must always produce a
fragment, even when the node has no rank of the job (that absence is evidence too).
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
from pathlib import Path
from typing import Any

from doctor.engine.trace import Trace
from doctor.evidence.bundle import Bundle, ProbeRun
from doctor.evidence.errors import UserError
from doctor.live import targets
from doctor.live.agent import Collector, collect_job
from doctor.live.common import FOLLOW_UP_ENV


def follow_up_requests() -> list[tuple[str, dict[str, Any]]]:
    """The probe runs a follow-up round asks for (empty: the full first pass)."""
    raw = os.environ.get(FOLLOW_UP_ENV, "").strip()
    if not raw:
        return []
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        raise UserError(f"{FOLLOW_UP_ENV}: not valid JSON") from None
    if not isinstance(data, list) or not all(
            isinstance(r, list) and len(r) == 2 and isinstance(r[0], str) and isinstance(r[1], dict) for r in data):
        raise UserError(f"{FOLLOW_UP_ENV}: expected [[probe, {{options}}], ...]")
    return [(name, opts) for name, opts in data]


def collect_local(pids: list[int] | None = None, slurm_job: str | None = None, job: str | None = None,
                  out: Path | str = "-", logs: list[Path] | None = None, symptom: str | None = None,
                  duration: float = 10.0) -> Path | None:
    # Under srun the node name is the host (several slurmd may share one machine).
    host = (os.environ.get("SLURMD_NODENAME") if slurm_job else None) or socket.gethostname()
    to_stdout = str(out) == "-"
    tmp = Path(tempfile.mkdtemp(prefix="mldoctor-collect-")) if to_stdout else None
    root = (tmp / f"fragment-{host}") if tmp else Path(out)
    if root.exists() and any(root.iterdir()):
        raise UserError(f"{root}: folder exists and is not empty")
    trace = Trace()
    bundle = Bundle.create(root, {"type": "fragment", "host": host, "slurm_job": slurm_job or ""})
    try:
        jobs = targets.discover(pids or None, slurm_job=slurm_job)
        try:
            the_job = targets.pick_job(jobs, job)
        except UserError as exc:
            if not (slurm_job and not jobs):
                raise
            bundle.record_probe(ProbeRun("discover", "failed", f"no process of job {slurm_job} on {host}", 0.0, host))
            bundle.note(str(exc))
        else:
            trace.add("discover", the_job.describe())
            options = {"logs": [str(p) for p in logs or []], "duration": duration}
            requests = follow_up_requests()
            if requests:  # a follow-up round of diagnose --slurm-job: only what the rules asked for
                Collector(bundle, the_job, trace, options).run(requests, 2)
            else:
                collect_job(the_job, bundle, trace, options, symptom)
        bundle.manifest["trace"] = trace.steps
        bundle.save()
        if not to_stdout:
            return root
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            tar.add(str(root), arcname=root.name)
        sys.stdout.buffer.write(buf.getvalue())
        sys.stdout.buffer.flush()
        return None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
