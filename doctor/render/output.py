"""What ``--out DIR`` writes: the reports and the evidence bundle for the incident ticket.

    OUT/report.md         Markdown for GitHub/GitLab/Jira (under 65,536 characters)
    OUT/report.html       one self-contained file
    OUT/report.json       mldoctor.report/1 with the facts (doctor/engine/schemas/report.schema.json)
    OUT/mldoctor-<job>-<time>.tar.gz (+ .sha256)   the bundle: manifest, checksums, artifacts
    OUT/host-map.json     only with --redact-hosts: real name -> alias; never inside the archive

Every file is written mode 0600. Secrets: the report model is scrubbed string by string before
rendering (scrubbing rendered HTML or JSON text could cut through markup or escapes), and every
artifact copied into the bundle is scrubbed again (text) or masked in place (binary).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from doctor.engine.findings import Finding
from doctor.engine.report import SCHEMA as REPORT_SCHEMA
from doctor.engine.report import Report
from doctor.evidence.bundle import Bundle, scrub_for_kind, sha256_file
from doctor.evidence.errors import UserError
from doctor.evidence.redact import HostRedactor, is_text, scrub, scrub_bytes

#: Loose files above this size are left out of the bundle (noted in the manifest).
MAX_LOOSE_COPY = 256 * 1024**2
_HOST_ENV_KEYS = ("HOSTNAME", "MASTER_ADDR", "SLURMD_NODENAME", "SLURM_LAUNCH_NODE_IPADDR",
                  "SLURM_SUBMIT_HOST", "SLURM_TOPOLOGY_ADDR")


def _write(path: Path, data: bytes | str) -> Path:
    """Write a file readable by its owner only (created so; never world-readable on the way)."""
    if isinstance(data, str):
        data = data.encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, 0o600)  # an existing file keeps its old mode through O_TRUNC
    return path


def clean_value(obj: Any, fn: Callable[[str], str]) -> Any:
    """Apply ``fn`` to every string (keys included) of a JSON-shaped value."""
    if isinstance(obj, str):
        return fn(obj)
    if isinstance(obj, dict):
        return {(fn(k) if isinstance(k, str) else k): clean_value(v, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean_value(v, fn) for v in obj]
    return obj


def _cleaner(redactor: HostRedactor | None) -> Callable[[str], str]:
    if redactor is None:
        return scrub
    return lambda s: redactor(scrub(s))


def sanitize_report(report: Report, redactor: HostRedactor | None = None) -> Report:
    """A copy of the report with every string scrubbed (and host names replaced if asked)."""
    fn = _cleaner(redactor)
    findings = [Finding(**clean_value(asdict(f), fn)) for f in report.findings]
    return replace(
        report, verdict=clean_value(report.verdict, fn), findings=findings,
        facts=clean_value(report.facts, fn), source=clean_value(report.source, fn),
        not_evaluable=clean_value(report.not_evaluable, fn), rule_errors=clean_value(report.rule_errors, fn),
        probes=clean_value(report.probes, fn), trace=clean_value(report.trace, fn),
    )


def report_from_json(doc: dict[str, Any]) -> Report:
    """Rebuild the report model from a written ``report.json`` (to render it again)."""
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith("mldoctor.report/"):
        raise UserError(f"not an mldoctor report (schema {doc.get('schema') if isinstance(doc, dict) else None!r})")
    known = {f.name for f in fields(Finding)}
    findings = []
    for raw in doc.get("findings") or []:
        if not isinstance(raw, dict):
            continue
        f = {k: v for k, v in raw.items() if k in known}
        f.setdefault("rule_name", "")
        f.setdefault("state", doc.get("verdict", {}).get("state", "unknown"))
        for key, default in (("cause", ""), ("rule", ""), ("title", raw.get("cause", "")), ("category", ""),
                             ("severity", "info"), ("confidence", 0.0), ("score", 0.0), ("summary", "")):
            f.setdefault(key, default)
        for key in ("ranks", "hosts", "gpus", "evidence", "fix", "also_fired"):
            f.setdefault(key, [])
        findings.append(Finding(**f))
    facts = doc.get("facts")
    if not isinstance(facts, dict):  # a report written without facts: rebuild what it carries
        facts = {"job": doc.get("job") or {}, "evidence": doc.get("evidence") or {}}
        for rank, per_ns in (doc.get("ranks") or {}).items():
            for ns, info in (per_ns or {}).items():
                facts.setdefault(ns, {}).setdefault("by_rank", {})[str(rank)] = info
    verdict = dict(doc.get("verdict") or {})
    verdict.setdefault("state", "unknown")
    verdict.setdefault("summary", "")
    return Report(
        verdict=verdict, findings=findings, facts=facts, source=doc.get("source") or {},
        not_evaluable=doc.get("not_evaluable") or [], rule_errors=doc.get("rule_errors") or [],
        probes=doc.get("probes") or [], trace=doc.get("trace") or [],
        timing={k: float(v) for k, v in (doc.get("timing_s") or {}).items() if isinstance(v, (int, float))},
        created=doc.get("created") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


def load_report_json(path: Path) -> Report:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: not a readable report.json ({exc})") from None
    try:
        return report_from_json(doc)
    except UserError as exc:
        raise UserError(f"{path}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise UserError(f"{path}: report.json does not match {REPORT_SCHEMA} ({exc})") from None


def host_redactor(report: Report, bundle: Bundle | None = None) -> HostRedactor:
    """A redactor primed with every host name the evidence names (IPs are found by shape)."""
    names: list[str] = []
    facts = report.facts
    names += [h for h in (facts.get("job") or {}).get("hosts", []) if isinstance(h, str)]
    env = facts.get("env") if isinstance(facts.get("env"), dict) else {}
    for key in _HOST_ENV_KEYS:
        names += [v for v in (env.get("values") or {}).get(key, []) if isinstance(v, str)]
    for per in (env.get("by_rank") or {}).values():
        if isinstance(per, dict):
            names += [per[k] for k in _HOST_ENV_KEYS if isinstance(per.get(k), str)]
    for f in report.findings:
        names += f.hosts
    if bundle is not None:
        names += [h for h in bundle.manifest.get("hosts", []) if isinstance(h, str)]
        names += [a.get("host") for a in bundle.manifest.get("artifacts", []) if a.get("host")]
        names += [p.get("host") for p in bundle.manifest.get("probes", []) if p.get("host")]
        target = bundle.manifest.get("target") or {}
        if isinstance(target.get("host"), str):
            names.append(target["host"])
    names.append(socket.gethostname())
    red = HostRedactor()
    for n in names:
        if isinstance(n, str) and len(n.strip()) >= 3:
            red.alias(n)
    return red


def _claimer() -> Callable[[Path], str]:
    """``path -> kind`` by the same content sniffing diagnosis uses ('' when no probe claims it)."""
    from doctor.evidence import plugins
    from doctor.evidence.contract import Sample

    probes = plugins.probes()

    def claim(path: Path) -> str:
        try:
            sample = Sample.read(path)
        except OSError:
            return ""
        if sample.size == 0:
            return ""
        for p in probes:
            try:
                if p.sniff(sample):
                    return p.name
            except Exception:  # a faulty sniff must not hide the file from the others
                continue
        return ""

    return claim


def _prepare(data: bytes, kind: str, redactor: HostRedactor | None) -> tuple[bytes, bool]:
    """Bytes to store and whether ``Bundle.add_artifact`` should treat them as text."""
    text = is_text(data)
    data = scrub_for_kind(kind, data)  # the kind's own first (Bundle.add_artifact applies it too)
    if not text:
        data = scrub_bytes(data)
    if redactor is not None:
        data = redactor.redact_bytes(data)
    return data, text


def _copy_loose(stage: Bundle, from_path: Path, redactor: HostRedactor | None,
                logs: list[Path] | None) -> None:
    """Every file of a loose folder (and the --logs paths) as an artifact under ``loose/``."""
    from doctor.engine import facts as facts_mod

    claim = _claimer()
    sets = [("loose", facts_mod.items_from_folder(from_path))]
    for i, extra in enumerate(logs or []):
        if extra.exists():
            sets.append((f"loose/logs{i}", facts_mod.items_from_folder(extra)))
    for prefix, items in sets:
        for item in items:
            try:
                size = item.path.stat().st_size
                if size > MAX_LOOSE_COPY:
                    stage.note(f"{item.rel}: {size / 2**20:.0f} MiB, above the {MAX_LOOSE_COPY // 2**20} MiB "
                               "copy limit; left out of the bundle")
                    continue
                data = item.path.read_bytes()
            except OSError as exc:
                stage.note(f"{item.rel}: could not be copied ({exc.strerror or exc})")
                continue
            kind = claim(item.path)
            data, text = _prepare(data, kind, redactor)
            rel = f"{prefix}/{item.rel}"
            host = item.hints.host or ""
            if redactor is not None:
                rel = redactor(rel)
                host = redactor(host) if host else ""
            stage.add_artifact(rel, data, kind, host=host, rank=item.hints.rank, text=text,
                               meta={"source": "loose"})


def _copy_bundle(stage: Bundle, src: Bundle, redactor: HostRedactor | None) -> None:
    """Re-export an existing bundle: every listed artifact, scrubbed again with today's patterns."""
    fn = _cleaner(redactor)
    for key in ("target", "hosts", "probes", "notes", "created"):
        if key in src.manifest:
            stage.manifest[key] = clean_value(src.manifest[key], fn)
    stage.manifest["hosts"] = []  # rebuilt by add_artifact
    for problem in src.verify():
        stage.note(f"source bundle: {problem}")
    for art in src.manifest.get("artifacts", []):
        p = src.artifact_path(art)
        try:
            data = p.read_bytes()
        except OSError as exc:
            stage.note(f"{art.get('path')}: could not be copied ({exc.strerror or exc})")
            continue
        kind = art.get("kind") or ""
        data, text = _prepare(data, kind, redactor)
        rel = art["path"]
        host = art.get("host") or ""
        if redactor is not None:
            rel, host = redactor(rel), (redactor(host) if host else "")
        stage.add_artifact(rel, data, kind, host=host, rank=art.get("rank"), pid=art.get("pid"),
                           text=text, meta=clean_value(art.get("meta") or {}, fn))
    for h in clean_value(src.manifest.get("hosts", []), fn):
        if h not in stage.manifest["hosts"]:
            stage.manifest["hosts"].append(h)


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def write_outputs(report: Report, out_dir: Path, from_path: Path | None = None, bundle: Bundle | None = None,
                  redact_hosts: bool = False, logs: list[Path] | None = None) -> dict[str, Path]:
    """Write the reports and the bundle archive to ``out_dir``; returns {name: path}.

    The bundle comes from ``bundle`` (the live agent's), else from ``from_path``: a bundle
    (folder or archive) is re-exported, a loose folder or file is copied in under ``loose/``
    with the kind of each file recorded when a probe claimed it.
    """
    from doctor.render import view
    from doctor.render.html import render_html
    from doctor.render.markdown import render_markdown

    out_dir = Path(out_dir)
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    if created:
        os.chmod(out_dir, 0o700)
    written: dict[str, Path] = {}

    with tempfile.TemporaryDirectory(prefix="mldoctor-out-") as tmp:
        tmp_path = Path(tmp)
        src_bundle = bundle
        if src_bundle is None and from_path is not None and Bundle.is_bundle(Path(from_path)):
            src_bundle = Bundle.load(Path(from_path), workdir=tmp_path)
        redactor = host_redactor(report, src_bundle) if redact_hosts else None
        safe = sanitize_report(report, redactor)
        job = (redactor(view.job_name(report)) if redactor else view.job_name(report))
        stage = None
        if src_bundle is not None or from_path is not None:
            stage = Bundle.create(tmp_path / "stage", {})
            if src_bundle is not None:
                _copy_bundle(stage, src_bundle, redactor)
            else:
                fp = Path(from_path)  # type: ignore[arg-type]
                stage.manifest["target"] = {"type": "loose", "name": redactor(fp.resolve().name) if redactor else fp.resolve().name}
                stage.note("built by `mldoctor diagnose --out` from loose evidence files; each file is under "
                           "loose/ as found, scrubbed; kind is the probe that recognized it ('' for none)")
                _copy_loose(stage, fp, redactor, logs)
            if redactor is not None:
                stage.note("host names and IP addresses replaced (--redact-hosts); the map is kept outside the bundle")

        stamp = _stamp()
        safe_job = "".join(c if c.isalnum() or c in "-_." else "_" for c in job)[:60] or "job"
        bundle_name = f"mldoctor-{safe_job}-{stamp}.tar.gz" if stage is not None else None
        rep_json = safe.to_json(include_facts=True)
        if bundle_name:
            rep_json["bundle"] = {"archive": bundle_name}
        md = render_markdown(safe, bundle_name=bundle_name)
        page = render_html(safe, bundle_name=bundle_name)
        json_text = json.dumps(rep_json, indent=1, default=str) + "\n"

        if stage is not None:
            # The verdict given when the bundle was written travels with it (not as evidence).
            reports = []
            for name, text in (("report.json", json_text), ("report.md", md)):
                rel = f"reports/{name}"
                (stage.root / "reports").mkdir(exist_ok=True)
                p = _write(stage.root / rel, text)
                reports.append({"path": rel, "sha256": sha256_file(p), "size": p.stat().st_size})
            stage.manifest["reports"] = reports
            archive = stage.archive(out_dir, job=safe_job, stamp=stamp)
            written["bundle"] = archive
            written["sha256"] = archive.with_name(archive.name + ".sha256")

    written["md"] = _write(out_dir / "report.md", md)
    written["html"] = _write(out_dir / "report.html", page)
    written["json"] = _write(out_dir / "report.json", json_text)
    if redactor is not None:
        written["host_map"] = _write(out_dir / "host-map.json", json.dumps(
            {"note": "real name -> alias used in the reports and the bundle; keep this file private",
             "mapping": redactor.mapping}, indent=1) + "\n")
        # The live agent's unredacted working copy would defeat the point of redaction.
        if bundle is not None and _inside(bundle.root, out_dir):
            shutil.rmtree(bundle.root, ignore_errors=True)
    return written


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
    except ValueError:
        return False
    return True



def load_for_report(path: Path) -> tuple[Report, str | None]:
    """The report behind ``mldoctor report PATH`` and the bundle archive it names, if any.

    PATH is a ``report.json`` (rendered as written), or a bundle / loose folder, diagnosed again
    offline; an archive is unpacked into a temporary folder that is removed afterwards.
    """
    from doctor.engine.diagnose import diagnose_path

    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such file or folder")
    if path.is_file() and path.suffix == ".json":
        head = path.open("rb").read(4096)
        if b"mldoctor.report/" in head:
            report = load_report_json(path)
            doc_bundle = None
            try:
                doc_bundle = (json.loads(path.read_text(encoding="utf-8")).get("bundle") or {}).get("archive")
            except (OSError, ValueError, AttributeError):
                doc_bundle = None
            return report, doc_bundle if isinstance(doc_bundle, str) else None
    if path.is_file() and Bundle.is_bundle(path):
        with tempfile.TemporaryDirectory(prefix="mldoctor-report-") as tmp:
            b = Bundle.load(path, workdir=Path(tmp))
            report = diagnose_path(b.root)
        report.source = {**report.source, "type": "bundle", "path": str(path)}
        report.trace = [{**s, "detail": str(s.get("detail", "")).replace(str(b.root), str(path))} for s in report.trace]
        return report, path.name
    return diagnose_path(path), None


def render_as(report: Report, fmt: str, bundle_name: str | None = None) -> str:
    """The report in one format (md | html | json), scrubbed like the files ``--out`` writes."""
    from doctor.render.html import render_html
    from doctor.render.markdown import render_markdown

    safe = sanitize_report(report)
    if fmt == "md":
        return render_markdown(safe, bundle_name=bundle_name)
    if fmt == "html":
        return render_html(safe, bundle_name=bundle_name)
    if fmt == "json":
        doc = safe.to_json(include_facts=True)
        if bundle_name:
            doc["bundle"] = {"archive": bundle_name}
        return json.dumps(doc, indent=1, default=str) + "\n"
    raise UserError(f"unknown report format {fmt!r} (md, html or json)")


def write_file(path: Path, text: str) -> Path:
    """Write one report file (mode 0600), creating its folder."""
    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    return _write(path, text)
