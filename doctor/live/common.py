"""What the local loop, the node collector and the SLURM fan-out share (so none imports another)."""

from __future__ import annotations

import os
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

from doctor.engine.report import Report
from doctor.engine.trace import Trace
from doctor.evidence.bundle import Bundle
from doctor.evidence.errors import UserError
from doctor.render.output import write_outputs

#: Set by ``diagnose --slurm-job`` for a follow-up round: JSON ``[[probe, {options}], ...]``.
FOLLOW_UP_ENV = "MLDOCTOR_COLLECT_REQUESTS"

#: Where progress goes (one line per step, for stderr); None: quiet.
Progress = Callable[[str], None] | None

#: Names a live ``--out DIR`` writes; when one is taken, the run goes to a new folder instead.
_OUT_NAMES = ("bundle", "report.md", "report.html", "report.json", "host-map.json")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a live run, carrying the report of what was collected until then, so the
    command line can still print it (and exit 130)."""

    def __init__(self, report: Report) -> None:
        super().__init__("interrupted")
        self.report = report


def out_folder(out: Path) -> Path:
    """The folder a live run writes into: ``out`` when none of its names is taken there, else a
    new ``out/mldoctor-<time>[-n]/``; either way its ``bundle/`` is created here, new (mode
    0700), so a run never deletes or writes into a folder it did not create (the same policy as
    ``doctor.render.output`` for offline reports)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{out}: cannot be used as the output folder ({exc.strerror or exc})") from None
    if not any(os.path.lexists(out / n) for n in _OUT_NAMES):
        try:
            (out / "bundle").mkdir(mode=0o700)
            return out
        except FileExistsError:  # created between the check and now: take a run folder
            pass
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for n in range(100):
        run = out / (f"mldoctor-{stamp}" + (f"-{n}" if n else ""))
        try:
            run.mkdir(mode=0o700)
        except FileExistsError:
            continue
        (run / "bundle").mkdir(mode=0o700)
        return run
    raise UserError(f"{out}: no free run folder name; use another --out")


def finish(report: Report, trace: Trace, bundle: Bundle, out: Path | None, redact_hosts: bool) -> Report:
    """Seal the bundle, attach the trace, and write the reports and archive when asked."""
    report.trace = trace.steps
    bundle.save()
    report.source["bundle"] = str(bundle.root) if out is not None else ""
    if out is not None:
        write_outputs(report, out, bundle=bundle, redact_hosts=redact_hosts)
    return report


def import_cel_core() -> None:
    """Import the CEL library without its command-line module. ``cel/__init__.py`` imports
    ``cel.cli`` (typer, prompt_toolkit, rich, pygments: 0.15 s alone, 0.6-1.3 s on a host whose
    cores the job keeps busy), which mldoctor never uses; the rules' first compile waits for it.
    A placeholder stands in for ``cel.cli`` during the import and is removed after, so a later
    ``import cel.cli`` still gets the real module."""
    if "cel" in sys.modules:
        return
    stub = types.ModuleType("cel.cli")
    sys.modules["cel.cli"] = stub
    try:
        import cel  # noqa: PLC0415 - the point is where and how it is imported
    except ImportError:  # the analysis reports a missing library, once
        return
    finally:
        if sys.modules.get("cel.cli") is stub:
            del sys.modules["cel.cli"]
    if getattr(cel, "cli", None) is stub:
        delattr(cel, "cli")
