"""The TUI's model: one evidence source, the user's answers, and the latest report.

No textual import here, so the walkthrough can be tested without a screen. The session only
calls the engine (``diagnose.gather_items``/``analyze`` offline, ``agent.diagnose_live`` live);
the user's answers change the symptom hint or the evidence paths it passes, or become notes in
the report. They never become findings.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from doctor.engine.report import Report
from doctor.evidence.bundle import Bundle
from doctor.evidence.errors import UserError

if TYPE_CHECKING:
    from doctor.engine.trace import Trace

#: A finding at or above this confidence counts as "a rule fired with high confidence": the
#: walkthrough then stops asking open questions (what changed, did it ever work at this scale).
HIGH_CONFIDENCE = 0.8


@dataclass
class Note:
    """One answer the user gave, kept in the report as a user note."""

    question: str
    answer: str
    text: str = ""

    def line(self) -> str:
        return f"{self.question} -> {self.answer}" + (f" ({self.text})" if self.text else "")


@dataclass
class Session:
    """Where the evidence comes from and what the user told us about it.

    ``path`` None means live: the job on this host (or ``pids``), probed by the agent.
    """

    path: Path | None = None
    pids: list[int] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    job: str | None = None
    budget: float = 30.0
    rules_dirs: list[Path] = field(default_factory=list)
    symptom: str | None = None
    notes: list[Note] = field(default_factory=list)
    answered: list[str] = field(default_factory=list)
    #: What the answers told, as ``symptoms.*`` facts: (list, value, pattern id, label).
    told: list[tuple[str, str, str, str]] = field(default_factory=list)
    report: Report | None = None
    saved: Report | None = None
    trace: Trace | None = None
    runs: int = 0
    _tmp: Path | None = None
    _root: Path | None = None  # the bundle folder to read (an archive unpacked into _tmp)
    _live_out: Path | None = None

    @property
    def live(self) -> bool:
        return self.path is None

    def label(self) -> str:
        if self.live:
            return "live: " + (f"pid {', '.join(map(str, self.pids))}" if self.pids else "this host")
        assert self.path is not None
        return f"offline: {self.path.name or self.path}"

    def tmp(self) -> Path:
        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix="mldoctor-tui-"))
        return self._tmp

    def close(self) -> None:
        """Remove what the session unpacked or collected (the user's files are never touched)."""
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    # -- opening -------------------------------------------------------------------------------
    def open(self) -> Report | None:
        """Check the path and return the report saved inside a bundle, if it carries one.

        A bundle written by ``--out`` holds ``reports/report.json``: the verdict given when it was
        collected. It is shown at once and replaced when this install's rules have re-checked it.
        """
        if self.live:
            return None
        assert self.path is not None
        if not self.path.exists():
            raise UserError(f"{self.path}: no such file or folder")
        if not Bundle.is_bundle(self.path):
            return None
        bundle = Bundle.load(self.path, workdir=self.tmp()) if self.path.is_file() else Bundle.load(self.path)
        self._root = bundle.root
        for rep in bundle.manifest.get("reports") or []:
            if isinstance(rep, dict) and str(rep.get("path", "")).endswith("report.json"):
                from doctor.render.output import load_report_json

                try:
                    saved = load_report_json(bundle.root / str(rep["path"]))
                except UserError:
                    return None
                saved.source = {**saved.source, "path": str(self.path)}
                self.saved = saved
                return saved
        return None

    # -- diagnosing ----------------------------------------------------------------------------
    def diagnose(self, trace: Trace | None = None) -> Report:
        """One full diagnosis with the current hint and evidence; blocking (run it in a thread).

        Pass ``trace`` (made on the UI thread) to poll its steps while this runs.
        """
        from doctor.engine.trace import Trace

        trace = trace if trace is not None else Trace()
        self.trace = trace
        self.runs += 1
        if self.live:
            from doctor.live import agent

            self._live_out = self.tmp() / "live"
            report = agent.diagnose_live(
                pids=self.pids or None, symptom=self.symptom, logs=self.logs or None,
                rules_dirs=self.rules_dirs or None, budget=self.budget, job=self.job,
                out=self._live_out, trace=trace,
            )
            # a second run finds live/bundle taken and writes into a new run folder: follow it
            self._live_out = Path(report.source.get("bundle") or self._live_out / "bundle").parent
        else:
            report = self._diagnose_path(trace)
        self.report = report
        return report

    def _diagnose_path(self, trace: Trace) -> Report:
        from doctor.engine.diagnose import analyze, gather_items

        assert self.path is not None
        if self._root is None and Bundle.is_bundle(self.path):
            self.open()
        where = self._root or self.path
        items, source, probe_runs, bundle = gather_items(where, self.logs or None)
        if bundle is not None:
            for problem in bundle.verify():
                trace.add("verify", problem)
        source = {**source, "path": str(self.path)}
        trace.add("gather", f"{len(items)} file(s) from {source['type']} {self.path}")
        return analyze(items, source, self.symptom, probe_runs, self.rules_dirs or None, trace,
                       extra_facts={"symptoms": self.symptom_facts()} if self.told else None)

    def symptom_facts(self) -> dict[str, Any]:
        """The answers as the ``symptoms`` namespace a ticket's prose fills (same lists and
        phrase records), so the symptom rules read a clicked answer like a written sentence."""
        lists: dict[str, list[str]] = {k: [] for k in ("states", "when", "where", "changed", "fixes", "tried",
                                                       "topics")}
        for fact, value, _, _ in self.told:
            if fact in lists and value not in lists[fact]:
                lists[fact].append(value)
        phrases = [{"id": pid, "fact": fact, "value": value, "text": label, "where": "walkthrough answer",
                    "asserted": True, "why_not": ""} for fact, value, pid, label in self.told]
        return {**lists, "state": lists["states"][0] if lists["states"] else "", "healthy": False, "after_steps": None,
                "phrases": phrases, "sources": ["walkthrough answers"]}

    # -- answers -------------------------------------------------------------------------------
    def answer(self, qid: str, question: str, answer: str, *, symptom: str | None = None,
               sets_symptom: bool = False, note: str = "", text: str = "", path: str = "",
               facts: tuple[tuple[str, str], ...] = (), pattern_id: str = "") -> bool:
        """Record an answer; True when it calls for a new diagnosis (new hint, new evidence, or
        new symptom facts for the rules; live runs take the facts on their next run)."""
        self.answered.append(qid)
        new = [(f, v, pattern_id, answer) for f, v in facts if (f, v) not in {(t[0], t[1]) for t in self.told}]
        self.told.extend(new)
        rerun = bool(new) and not self.live
        if sets_symptom and symptom != self.symptom:
            self.symptom = symptom
            rerun = True
        if path:
            p = Path(path).expanduser()
            if not p.exists():
                raise UserError(f"{p}: no such file or folder")
            self.logs.append(p)
            rerun = True
        if note or text or path:
            self.notes.append(Note(question, note or answer, text or path))
        return rerun

    def view(self) -> Report | None:
        """The latest report (or the saved one) with the user's notes added, as exports see it."""
        base = self.report or self.saved
        if base is None:
            return None
        if not self.notes:
            return base
        t = max((float(s.get("t", 0) or 0) for s in base.trace), default=0.0)
        steps = [{"t": t, "action": "user", "detail": f"the user answered: {n.line()}"} for n in self.notes]
        return replace(base, source={**base.source, "user_notes": [n.line() for n in self.notes]},
                       trace=[*base.trace, *steps])

    def facts_context(self) -> dict[str, Any]:
        """What the questions' conditions may read besides the facts (the ``session`` map)."""
        rep = self.report or self.saved
        top = rep.findings[0] if rep and rep.findings else None
        from doctor.engine.findings import ACTIONABLE

        actionable = [f for f in (rep.findings if rep else []) if f.severity in ACTIONABLE]
        return {
            "symptom": self.symptom or "",
            "live": self.live,
            "has_report": rep is not None,
            "state": str(rep.verdict.get("state", "")) if rep else "",
            "n_findings": len(actionable),
            "top_cause": top.cause if top else "",
            "top_confidence": float(top.confidence) if top else 0.0,
            "high_confidence": any(f.confidence >= HIGH_CONFIDENCE for f in actionable),
            "answered": list(self.answered),
        }

    # -- export --------------------------------------------------------------------------------
    def export(self, fmt: str, dest: Path) -> dict[str, Path]:
        """Write the report as md, html, or ``all`` (reports + the evidence bundle) under ``dest``."""
        from doctor.render.output import render_as, write_file, write_outputs

        report = self.view()
        if report is None:
            raise UserError("nothing to export yet: the diagnosis has not finished")
        dest = Path(dest).expanduser()
        if fmt in ("md", "html"):
            return {fmt: write_file(dest / f"report.{fmt}", render_as(report, fmt))}
        if fmt != "all":
            raise UserError(f"unknown export format {fmt!r} (md, html or all)")
        if self.live:
            root = (self._live_out / "bundle") if self._live_out else None
            bundle = Bundle.load(root) if root is not None and (root / "manifest.json").is_file() else None
            return write_outputs(report, dest, bundle=bundle)
        return write_outputs(report, dest, from_path=self.path, logs=self.logs or None)


def stamp() -> str:
    """A default export folder name."""
    return "mldoctor-report-" + time.strftime("%Y%m%dT%H%M%S", time.localtime())
