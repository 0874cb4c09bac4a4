"""``mldoctor collect``: node-local collection into a bundle (fragment), nothing diagnosed.

This is what ``diagnose --slurm-job`` runs on every node through srun; it must always produce a
fragment, even when the node has no rank of the job (that absence is evidence too).
"""

from __future__ import annotations

import io
import shutil
import socket
import sys
import tarfile
import tempfile
from pathlib import Path

from doctor import targets
from doctor.agent import collect_job
from doctor.bundle import Bundle, ProbeRun
from doctor.diagnose import Trace
from doctor.errors import UserError


def collect_local(pids: list[int] | None = None, slurm_job: str | None = None, job: str | None = None,
                  out: Path | str = "-", logs: list[Path] | None = None) -> Path | None:
    host = socket.gethostname()
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
            collect_job(the_job, bundle, trace, {"logs": [str(p) for p in logs or []]}, None)
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
