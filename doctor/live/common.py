"""What the local loop, the node collector and the SLURM fan-out share (so none imports another)."""

from __future__ import annotations

from pathlib import Path

from doctor.engine.report import Report
from doctor.engine.trace import Trace
from doctor.evidence.bundle import Bundle
from doctor.render.output import write_outputs

#: Set by ``diagnose --slurm-job`` for a follow-up round: JSON ``[[probe, {options}], ...]``.
FOLLOW_UP_ENV = "MLDOCTOR_COLLECT_REQUESTS"


def finish(report: Report, trace: Trace, bundle: Bundle, out: Path | None, redact_hosts: bool) -> Report:
    """Seal the bundle, attach the trace, and write the reports and archive when asked."""
    report.trace = trace.steps
    bundle.save()
    report.source["bundle"] = str(bundle.root) if out is not None else ""
    if out is not None:
        write_outputs(report, out, bundle=bundle, redact_hosts=redact_hosts)
    return report
