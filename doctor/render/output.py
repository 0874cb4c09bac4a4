"""What ``--out DIR`` writes: the reports and the evidence bundle for the incident ticket.

    OUT/report.md         Markdown for GitHub/GitLab/Jira (under 65,536 characters)
    OUT/report.html       one self-contained file
    OUT/report.json       mldoctor.report/1 with the facts (doctor/engine/schemas/report.schema.json)
    OUT/mldoctor-<job>-<time>.tar.gz (+ .sha256)   the bundle: manifest, checksums, artifacts
    OUT/host-map.json     only with --redact-hosts: real name -> alias; never inside the archive

Every file is written mode 0600, created new (O_EXCL, O_NOFOLLOW): mldoctor never overwrites a
file it did not write, never writes through a planted symlink and never blocks on a FIFO. When
OUT already holds a report.md/html/json (the user's, or an earlier run's), this run's files go
to a new folder OUT/mldoctor-<time>/ instead. Secrets: the report model is scrubbed string by string before
rendering (scrubbing rendered HTML or JSON text could cut through markup or escapes), and every
artifact copied into the bundle is scrubbed again (text) or masked in place (binary).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from doctor.engine.findings import Finding
from doctor.engine.report import SCHEMA as REPORT_SCHEMA
from doctor.engine.report import Report, doc_problem
from doctor.evidence.bundle import Bundle, open_new, scrub_for_kind, sha256_file
from doctor.evidence.errors import UserError
from doctor.evidence.redact import HostRedactor, is_text, scrub, scrub_bytes

#: Loose files above this size are left out of the bundle (noted in the manifest).
MAX_LOOSE_COPY = 256 * 1024**2


_REPORT_NAMES = ("report.md", "report.html", "report.json", "host-map.json")
#: A compressed log is unpacked to scrub it up to this size; a bigger one is left out.
MAX_GUNZIP = 256 * 1024**2


def _write(path: Path, data: bytes | str, replace: bool = False) -> Path:
    """Write a file readable by its owner only; see ``bundle.open_new`` for what is refused."""
    if isinstance(data, str):
        data = data.encode()
    try:
        with os.fdopen(open_new(path, replace), "wb") as fh:
            fh.write(data)
    except OSError as exc:
        raise UserError(f"{path}: cannot be written ({exc.strerror or exc})") from None
    return path


def _run_folder(out_dir: Path) -> Path:
    """``out_dir``, or a new ``out_dir/mldoctor-<time>[-n]/`` when a report name is taken there."""
    if not any(os.path.lexists(out_dir / n) for n in _REPORT_NAMES):
        return out_dir
    for n in range(100):
        run = out_dir / (f"mldoctor-{_stamp()}" + (f"-{n}" if n else ""))
        try:
            run.mkdir(mode=0o700)
            return run
        except FileExistsError:
            continue
    raise UserError(f"{out_dir}: no free run folder name; use another --out")


def _utf16(data: bytes) -> str | None:
    """The UTF-16 codec of ``data`` (BOM, or NULs in every other byte of ASCII text), else None."""
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return "utf-16"
    head = data[:4096]
    if len(head) >= 8:
        for codec, zeros, chars in (("utf-16-le", head[1::2], head[0::2]), ("utf-16-be", head[0::2], head[1::2])):
            if zeros.count(0) >= 0.9 * len(zeros) and chars.count(0) <= 0.1 * len(chars):
                return codec
    return None


def _gunzip(data: bytes) -> bytes | None:
    """The content of a gzip file, or None when it is damaged or unpacks past MAX_GUNZIP."""
    d = zlib.decompressobj(wbits=47)
    try:
        out = d.decompress(data, MAX_GUNZIP + 1)
    except zlib.error:
        return None
    return None if len(out) > MAX_GUNZIP or d.unconsumed_tail else out


#: Values nested deeper than this in the facts are cut (a 5 KB gpu.json nested 500 levels would
#: otherwise reach Python's recursion limit here or in json.dumps: an internal error, no report).
MAX_CLEAN_DEPTH = 64
CUT_DEEP = "(nested too deeply; cut)"


def clean_value(obj: Any, fn: Callable[[str], str], depth: int = 0) -> Any:
    """Apply ``fn`` to every string (keys included) of a JSON-shaped value; anything nested
    deeper than MAX_CLEAN_DEPTH becomes ``CUT_DEEP`` (no real fact is that deep)."""
    if isinstance(obj, str):
        return fn(obj)
    if isinstance(obj, (dict, list, tuple)) and depth >= MAX_CLEAN_DEPTH:
        return CUT_DEEP
    if isinstance(obj, dict):
        return {(fn(k) if isinstance(k, str) else k): clean_value(v, fn, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean_value(v, fn, depth + 1) for v in obj]
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
        rule_results=clean_value(report.rule_results, fn),
    )


def report_from_json(doc: dict[str, Any]) -> Report:
    """Rebuild the report model from a written ``report.json`` (to render it again)."""
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith("mldoctor.report/"):
        raise UserError(f"not an mldoctor report (schema {doc.get('schema') if isinstance(doc, dict) else None!r})")
    problem = doc_problem(doc)
    if problem:
        raise UserError(f"report.json does not match {REPORT_SCHEMA}: {problem[:200]}")
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
        rule_results=doc.get("rule_results") or [],
        key=doc["incident_key"] if isinstance(doc.get("incident_key"), str) else "",
        timing={k: float(v) for k, v in (doc.get("timing_s") or {}).items() if isinstance(v, (int, float))},
        created=doc.get("created") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


def load_report_json(path: Path) -> Report:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: not a readable report.json ({str(exc)[:200]})") from None
    except RecursionError:
        raise UserError(f"{path}: report.json is nested too deeply to be one") from None
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
    from doctor.render import view  # lazy, as below: --help must not load the registry

    names += view.host_names(report)  # what each kind's facts name (env: HOSTNAME, MASTER_ADDR, ...)
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


def _prepare(data: bytes, kind: str, redactor: HostRedactor | None) -> tuple[bytes, bool] | None:
    """Bytes to store and whether ``Bundle.add_artifact`` should treat them as text; None when
    the file cannot be scrubbed and must be left out.

    Text that ``scrub`` would not see is opened first: a gzip-rotated log is unpacked, scrubbed
    and packed again, a UTF-16 log is decoded and re-encoded. Never copied raw.
    """
    if data[:2] == b"\x1f\x8b":
        raw = _gunzip(data)
        inner = _prepare(raw, kind, redactor) if raw is not None else None
        if inner is None:
            return None
        body = scrub(inner[0].decode("utf-8", errors="replace")).encode() if inner[1] else inner[0]
        return gzip.compress(body, mtime=0), False
    codec = _utf16(data)
    if codec is not None:
        body = scrub(data.decode(codec, errors="replace"))
        if redactor is not None:
            body = redactor(body)
        return body.encode(codec), False
    text = is_text(data)
    data = scrub_for_kind(kind, data)  # the kind's own first (Bundle.add_artifact applies it too)
    if not text:
        data = scrub_bytes(data)
    if redactor is not None:
        data = redactor.redact_bytes(data)
    return data, text


#: Files above this are scrubbed in chunks straight into the bundle (``Bundle.add_artifact_file``)
#: instead of in memory; below it the whole-file path keeps its exact output.
STREAM_MIN = 8 * 1024**2


def _streamed(stage: Bundle, path: Path, size: int, kind: str, rel: str, redactor: HostRedactor | None,
              **art: Any) -> bool:
    """Copy a big plain file in chunks; False when it must go the whole-file way: small, gzip or
    UTF-16 (opened first, capped by MAX_GUNZIP / MAX_LOOSE_COPY), or a kind with its own
    scrubbing, which needs the whole file."""
    from doctor.evidence import plugins
    from doctor.evidence.contract import Probe

    if size <= STREAM_MIN:
        return False
    probe = plugins.probe(kind) if kind else None
    if probe is not None and type(probe).scrub is not Probe.scrub:
        return False
    with open(path, "rb") as fh:
        head = fh.read(8192)
    if head[:2] == b"\x1f\x8b" or _utf16(head) is not None:
        return False
    stage.add_artifact_file(rel, path, kind, text=is_text(head), rewrite=redactor, **art)
    return True


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
            if item.skip:  # a link, FIFO, unreadable folder or past the cap: never copied
                stage.note(f"{item.rel}: {item.skip}")
                continue
            rel = f"{prefix}/{item.rel}"
            host = item.hints.host or ""
            if redactor is not None:
                rel = redactor(rel)
                host = redactor(host) if host else ""
            try:
                size = item.path.stat().st_size
                if size > MAX_LOOSE_COPY:
                    stage.note(f"{item.rel}: {size / 2**20:.0f} MiB, above the {MAX_LOOSE_COPY // 2**20} MiB "
                               "copy limit; left out of the bundle")
                    continue
                kind = claim(item.path)
                if _streamed(stage, item.path, size, kind, rel, redactor, host=host, rank=item.hints.rank,
                             meta={"source": "loose"}):
                    continue
                data = item.path.read_bytes()
            except OSError as exc:
                stage.note(f"{item.rel}: could not be copied ({exc.strerror or exc})")
                continue
            prepared = _prepare(data, kind, redactor)
            if prepared is None:
                stage.note(f"{scrub(item.rel)}: compressed and damaged or too large to scrub; left out")
                continue
            data, text = prepared
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
        kind = art.get("kind") or ""
        rel = art["path"]
        host = art.get("host") or ""
        if redactor is not None:
            rel, host = redactor(rel), (redactor(host) if host else "")
        try:
            if _streamed(stage, p, p.stat().st_size, kind, rel, redactor, host=host, rank=art.get("rank"),
                         meta=clean_value(art.get("meta") or {}, fn)):
                continue
            data = p.read_bytes()
        except OSError as exc:
            stage.note(f"{art.get('path')}: could not be copied ({exc.strerror or exc})")
            continue
        prepared = _prepare(data, kind, redactor)
        if prepared is None:
            stage.note(f"{scrub(art['path'])}: compressed and damaged or too large to scrub; left out")
            continue
        data, text = prepared
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

    base = out_dir = Path(out_dir)
    try:
        created = not out_dir.exists()
        out_dir.mkdir(parents=True, exist_ok=True)
        if created:
            os.chmod(out_dir, 0o700)
        out_dir = _run_folder(out_dir)
    except OSError as exc:
        raise UserError(f"{out_dir}: cannot write the reports there ({exc.strerror or exc})") from None
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
        if bundle is not None and _inside(bundle.root, base):
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
            except (OSError, ValueError, AttributeError, RecursionError):
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
    """Write one report file (mode 0600), creating its folder. The user named this file, so an
    existing regular file is replaced; a symlink, FIFO or folder there is refused in one line."""
    path = Path(path)
    try:
        if path.parent and not path.parent.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{path.parent}: cannot be created ({exc.strerror or exc})") from None
    return _write(path, text, replace=True)
