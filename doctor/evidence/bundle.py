"""Evidence bundles: a directory (or .tar.gz of it) with a manifest and redacted artifacts.

Everything after the bundle is offline and pure, so ``diagnose --from BUNDLE`` on a laptop gives
the verdict the cluster gave. The manifest records what each probe did (ok/failed/skipped, why,
how long) because a missing piece of evidence is itself a clue.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from doctor import __version__
from doctor.evidence import plugins
from doctor.evidence.errors import UserError
from doctor.evidence.redact import scrub, scrub_bytes

SCHEMA = "mldoctor.bundle/1"
MANIFEST = "manifest.json"
MAX_ARCHIVE_MEMBER = 2 * 1024**3


@dataclass
class ProbeRun:
    """One probe's outcome on one host."""

    name: str
    status: str  # ok | failed | skipped
    reason: str = ""
    duration_s: float = 0.0
    host: str = ""
    artifacts: int = 0


@dataclass
class Artifact:
    path: str  # relative to the bundle root, posix
    kind: str
    sha256: str
    size: int
    host: str = ""
    rank: int | None = None
    pid: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def scrub_for_kind(kind: str, data: bytes) -> bytes:
    """The owning probe's own scrubbing (``Probe.scrub``, sos's postproc) for an artifact kind."""
    probe = plugins.probe(kind) if kind else None
    return probe.scrub(data) if probe is not None else data


class Bundle:
    """A bundle directory being written or read."""

    def __init__(self, root: Path, manifest: dict[str, Any] | None = None) -> None:
        self.root = root
        #: The temporary folder an archive was unpacked into (the caller removes it when done).
        self.unpacked: Path | None = None
        self.manifest: dict[str, Any] = manifest or {
            "schema": SCHEMA,
            "tool": {"name": "mldoctor", "version": __version__},
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "target": {},
            "hosts": [],
            "ranks": [],
            "probes": [],
            "artifacts": [],
            "notes": [],
        }

    # -- writing -----------------------------------------------------------------------------
    @classmethod
    def create(cls, root: Path, target: dict[str, Any] | None = None) -> Bundle:
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o700)
        b = cls(root)
        b.manifest["target"] = target or {}
        return b

    def add_artifact(
        self,
        rel: str,
        data: bytes | str,
        kind: str,
        *,
        host: str = "",
        rank: int | None = None,
        pid: int | None = None,
        text: bool = True,
        meta: dict[str, Any] | None = None,
    ) -> Artifact:
        """Write one artifact, scrubbed when it is text, and record its checksum."""
        rel = str(PurePosixPath(rel))
        if rel.startswith("/") or ".." in PurePosixPath(rel).parts:
            raise ValueError(f"artifact path escapes the bundle: {rel}")
        if isinstance(data, str):
            data = data.encode()
        data = scrub_for_kind(kind, data)  # the kind's own scrubbing first (env: the allowlist)
        if text:
            data = scrub(data.decode("utf-8", errors="replace")).encode()
        else:  # binary (pickles, /proc files): masked in place, same length
            data = scrub_bytes(data)
        dest = self.root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        art = Artifact(rel, kind, hashlib.sha256(data).hexdigest(), len(data), host, rank, pid, meta or {})
        self.manifest["artifacts"] = [a for a in self.manifest["artifacts"] if a["path"] != rel]
        self.manifest["artifacts"].append(asdict(art))
        if host and host not in self.manifest["hosts"]:
            self.manifest["hosts"].append(host)
        if rank is not None and rank not in self.manifest["ranks"]:
            self.manifest["ranks"].append(rank)
        return art

    def record_probe(self, run: ProbeRun) -> None:
        self.manifest["probes"].append(asdict(run))

    def note(self, text: str) -> None:
        self.manifest["notes"].append(scrub(text))

    def save(self) -> Path:
        self.manifest["ranks"] = sorted(set(self.manifest["ranks"]))
        path = self.root / MANIFEST
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(self.manifest, fh, indent=1, sort_keys=False)
        return path

    # -- reading -----------------------------------------------------------------------------
    @classmethod
    def is_bundle(cls, path: Path) -> bool:
        return (path.is_dir() and (path / MANIFEST).is_file()) or _is_tar(path)

    @classmethod
    def load(cls, path: Path, workdir: Path | None = None) -> Bundle:
        """Open a bundle directory or archive; archives are unpacked safely into ``workdir``."""
        if _is_tar(path):
            dest = Path(tempfile.mkdtemp(prefix="mldoctor-bundle-", dir=workdir))
            try:
                root = _safe_extract(path, dest)
            except UserError:
                shutil.rmtree(dest, ignore_errors=True)
                raise
        else:
            root = path
        mpath = root / MANIFEST
        try:
            manifest = json.loads(mpath.read_text())
        except FileNotFoundError:
            raise UserError(f"{path}: not a bundle (no {MANIFEST})") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"{mpath}: manifest is not valid JSON ({exc})") from None
        if not isinstance(manifest, dict) or not str(manifest.get("schema", "")).startswith("mldoctor.bundle/"):
            raise UserError(f"{mpath}: unknown manifest schema {manifest.get('schema') if isinstance(manifest, dict) else None!r}")
        bundle = cls(root, manifest)
        if _is_tar(path):
            bundle.unpacked = dest
        return bundle

    def verify(self) -> list[str]:
        """Checksum problems, one line each (empty when the bundle is intact)."""
        problems = []
        for art in self.manifest.get("artifacts", []):
            p = self.root / art["path"]
            if not p.is_file():
                problems.append(f"{art['path']}: listed in the manifest but missing")
            elif sha256_file(p) != art.get("sha256"):
                problems.append(f"{art['path']}: sha256 does not match the manifest (modified after collection)")
        for rep in self.manifest.get("reports", []):  # the reports written with the bundle
            p = self.root / rep["path"]
            if p.is_file() and sha256_file(p) != rep.get("sha256"):
                problems.append(f"{rep['path']}: sha256 does not match the manifest")
        return problems

    def archive(self, out_dir: Path, job: str = "job", stamp: str | None = None) -> Path:
        """Write ``mldoctor-<job>-<time>.tar.gz`` (mode 0600) and its ``.sha256`` beside it.

        ``stamp`` fixes the time part, so a report written before the archive can name it.
        """
        self.save()
        stamp = stamp or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        safe_job = "".join(c if c.isalnum() or c in "-_." else "_" for c in job)[:60] or "job"
        out_dir.mkdir(parents=True, exist_ok=True)
        dest = out_dir / f"mldoctor-{safe_job}-{stamp}.tar.gz"
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
            top = dest.name[: -len(".tar.gz")]
            for p in sorted(self.root.rglob("*")):
                if p.is_file() and not p.is_symlink():
                    info = tar.gettarinfo(str(p), arcname=f"{top}/{p.relative_to(self.root).as_posix()}")
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    with open(p, "rb") as fh:
                        tar.addfile(info, fh)
        digest = sha256_file(dest)
        side = dest.with_name(dest.name + ".sha256")
        fd = os.open(side, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(f"{digest}  {dest.name}\n")
        return dest

    def artifact_path(self, art: dict[str, Any]) -> Path:
        return self.root / art["path"]


def _is_tar(path: Path) -> bool:
    return path.is_file() and (path.name.endswith((".tar.gz", ".tgz", ".tar")))


def _safe_extract(archive: Path, dest: Path) -> Path:
    """Unpack only regular files and folders that stay inside ``dest``; return the bundle root."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            for m in tar.getmembers():
                parts = PurePosixPath(m.name).parts
                if m.name.startswith("/") or ".." in parts:
                    raise UserError(f"{archive}: member {m.name!r} would escape the folder; refusing")
                if not (m.isfile() or m.isdir()):
                    continue
                if m.size > MAX_ARCHIVE_MEMBER:
                    raise UserError(f"{archive}: member {m.name!r} is larger than 2 GiB; refusing")
                target = dest.joinpath(*parts)
                if m.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(m)
                if src is None:
                    continue
                with src, open(target, "wb") as fh:
                    while chunk := src.read(1 << 20):
                        fh.write(chunk)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise UserError(f"{archive}: not a readable archive ({exc})") from None
    manifests = sorted(dest.rglob(MANIFEST), key=lambda p: len(p.parts))
    if not manifests:
        raise UserError(f"{archive}: archive holds no {MANIFEST}")
    return manifests[0].parent
