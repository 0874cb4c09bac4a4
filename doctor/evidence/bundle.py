"""Evidence bundles: a directory (or .tar.gz of it) with a manifest and redacted artifacts.

Everything after the bundle is offline and pure, so ``diagnose --from BUNDLE`` on a laptop gives
the verdict the cluster gave. The manifest records what each probe did (ok/failed/skipped, why,
how long) because a missing piece of evidence is itself a clue.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import tarfile
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from doctor import __version__
from doctor.evidence import plugins
from doctor.evidence.errors import UserError
from doctor.evidence.redact import scrub, scrub_bytes, scrub_stream

SCHEMA = "mldoctor.bundle/1"
MANIFEST = "manifest.json"
MAX_ARCHIVE_MEMBER = 2 * 1024**3
#: An archive may unpack to at most ARCHIVE_RATIO times its own size, never below
#: MIN_ARCHIVE_TOTAL nor above MAX_ARCHIVE_TOTAL; text logs gzip 5-30x, a gzip bomb 1000x.
MAX_ARCHIVE_TOTAL = 4 * 1024**3
MIN_ARCHIVE_TOTAL = 256 * 1024**2
ARCHIVE_RATIO = 100
MAX_ARCHIVE_MEMBERS = 100_000
#: A manifest is a few KiB per artifact; anything this big is not one.
MAX_MANIFEST = 64 * 1024**2


def bad_relpath(rel: object) -> str | None:
    """Why ``rel`` cannot be the path of an artifact inside a bundle; None when it can.

    Shared by ``Bundle.load`` and the SLURM fragment merger: a manifest comes from a node, a
    ticket or a stranger, and must never name a file outside the bundle (``/etc/shadow``,
    ``../../secret``, ``/proc/self/environ``).
    """
    if not isinstance(rel, str) or not rel:
        return "the path is not a non-empty string"
    if "\x00" in rel:
        return "the path holds a NUL byte"
    if rel.startswith("/") or ".." in PurePosixPath(rel).parts:
        return "the path is absolute or climbs out with '..'"
    return None


def bad_file(root: Path, rel: str) -> str | None:
    """Why ``root/rel`` must not be read as an artifact (symlink, FIFO, device, outside the
    root through a linked folder); None when it is a regular file inside or missing.

    Symlinks are never followed: a ``tar -x`` of a hostile archive plants them, and reading
    their target would put an outside file (or a FIFO that blocks, or /dev/zero that never
    ends) into the diagnosis and the re-exported archive. A missing file is not refused here:
    ``verify`` and the parsers already report it as missing.
    """
    path = root / rel
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be checked ({exc.strerror or exc})"
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink; not followed"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file (a FIFO, device or folder); skipped"
    try:
        inside = path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):
        inside = False
    return None if inside else "leads outside the bundle through a linked folder; skipped"


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


def open_new(path: Path, replace: bool = False) -> int:
    """A write fd on ``path`` (mode 0600) that never follows a symlink, never blocks on a FIFO,
    and, unless ``replace``, never opens a file that already exists (O_EXCL): a planted
    ``report.md -> /etc/something`` or a user's own file gives a one-line UserError instead."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | (0 if replace else os.O_EXCL), 0o600)
    except FileExistsError:
        raise UserError(f"{path}: already exists and was not written by this run; not overwriting it") from None
    except OSError as exc:
        why = {errno.ELOOP: "is a symlink; not writing through it", errno.ENXIO: "is a FIFO; not writing to it",
               errno.EISDIR: "is a folder"}.get(exc.errno, f"cannot be written ({exc.strerror or exc})")
        raise UserError(f"{path}: {why}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UserError(f"{path}: is not a regular file; not writing to it")
    if replace:
        os.ftruncate(fd, 0)
    os.fchmod(fd, 0o600)  # an existing file keeps its old mode otherwise
    return fd


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
        #: Artifacts the manifest lists that were not read, one line each (see ``load``).
        self.skipped: list[str] = []
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
        rel = scrub(str(PurePosixPath(rel)))  # a token in a file name is a token too
        if bad_relpath(rel):
            raise UserError(f"{rel}: artifact path escapes the bundle")
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
        return self._register(Artifact(rel, kind, hashlib.sha256(data).hexdigest(), len(data), host, rank, pid,
                                       meta or {}))

    def _register(self, art: Artifact) -> Artifact:
        """List a written artifact in the manifest (replacing an earlier one at the same path)."""
        self.manifest["artifacts"] = [a for a in self.manifest["artifacts"] if a["path"] != art.path]
        self.manifest["artifacts"].append(asdict(art))
        if art.host and art.host not in self.manifest["hosts"]:
            self.manifest["hosts"].append(art.host)
        if art.rank is not None and art.rank not in self.manifest["ranks"]:
            self.manifest["ranks"].append(art.rank)
        return art

    def add_artifact_file(
        self,
        rel: str,
        src: Path,
        kind: str,
        *,
        host: str = "",
        rank: int | None = None,
        text: bool = True,
        meta: dict[str, Any] | None = None,
        rewrite: Callable[[str], str] | None = None,
    ) -> Artifact:
        """Copy a big file in as an artifact, scrubbed in chunks (``redact.scrub_stream``):
        memory stays at a few MiB whatever the file's size, where ``add_artifact`` holds the
        file about four times over. ``rewrite`` (host redaction) is applied to each scrubbed
        text piece. Kinds with their own scrubbing (``Probe.scrub``) need the whole file: the
        caller copies those with ``add_artifact``."""
        rel = scrub(str(PurePosixPath(rel)))
        if bad_relpath(rel):
            raise UserError(f"{rel}: artifact path escapes the bundle")
        dest = self.root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        h = hashlib.sha256()
        size = 0
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out, open(src, "rb") as fh:
            def write(piece: bytes) -> None:
                nonlocal size
                if rewrite is not None and text:
                    piece = rewrite(piece.decode("utf-8")).encode("utf-8")
                h.update(piece)
                size += len(piece)
                out.write(piece)

            scrub_stream(fh.read, write, text)
        return self._register(Artifact(rel, kind, h.hexdigest(), size, host, rank, None, meta or {}))

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
        """Open a bundle directory or archive; archives are unpacked safely into ``workdir``.

        Every manifest is checked once here, before anything reads an artifact: a manifest of
        the wrong shape, or an artifact path that is absolute or has ``..``, is a UserError that
        names the bundle and the artifact (the whole bundle is refused: such a manifest was
        made to read outside it). An artifact that is a symlink, FIFO or device is skipped
        and listed in ``skipped`` (``verify`` reports it). An archive's temporary folder is
        removed on any error, Ctrl-C or SIGTERM included (the CLI turns SIGTERM into SystemExit).
        """
        if not _is_tar(path):
            return cls._open(path, path)
        dest = Path(tempfile.mkdtemp(prefix="mldoctor-bundle-", dir=workdir))
        try:
            bundle = cls._open(_safe_extract(path, dest), path)
        except BaseException:
            shutil.rmtree(dest, ignore_errors=True)
            raise
        bundle.unpacked = dest
        return bundle

    @classmethod
    def _open(cls, root: Path, label: Path) -> Bundle:
        """Read and check the manifest under ``root``; errors name ``label`` (the user's path)."""
        mpath = root / MANIFEST
        where = mpath if root == label else f"{label} ({MANIFEST})"
        if bad_file(root, MANIFEST):
            raise UserError(f"{where}: the manifest {bad_file(root, MANIFEST)}")
        try:
            with open(mpath, "rb") as fh:
                raw = fh.read(MAX_MANIFEST + 1)
        except FileNotFoundError:
            raise UserError(f"{label}: not a bundle (no {MANIFEST})") from None
        except OSError as exc:
            raise UserError(f"{where}: cannot read the manifest ({exc.strerror or exc})") from None
        if len(raw) > MAX_MANIFEST:
            raise UserError(f"{where}: manifest is larger than {MAX_MANIFEST // 2**20} MiB; refusing")
        try:
            manifest = json.loads(raw.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"{where}: manifest is not valid JSON ({exc})") from None
        except RecursionError:
            raise UserError(f"{where}: manifest is nested too deeply to be one") from None
        if not isinstance(manifest, dict) or not str(manifest.get("schema", "")).startswith("mldoctor.bundle/"):
            raise UserError(f"{where}: unknown manifest schema {manifest.get('schema') if isinstance(manifest, dict) else None!r}")
        bundle = cls(root, manifest)
        bundle.skipped = _check_manifest(manifest, root, where)
        return bundle

    def verify(self) -> list[str]:
        """Checksum problems, one line each (empty when the bundle is intact)."""
        problems = list(self.skipped)
        for art in self.manifest.get("artifacts", []):
            p = self.root / art["path"]
            if not p.is_file():
                problems.append(f"{art['path']}: listed in the manifest but missing")
            elif sha256_file(p) != art.get("sha256"):
                problems.append(f"{art['path']}: sha256 does not match the manifest (modified after collection)")
        for rep in self.manifest.get("reports", []):  # the reports written with the bundle
            if not isinstance(rep, dict) or bad_relpath(rep.get("path")) or bad_file(self.root, rep["path"]):
                continue
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
        fd = open_new(dest)
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
            top = dest.name[: -len(".tar.gz")]
            for p in sorted(self.root.rglob("*")):
                if p.is_file() and not p.is_symlink() and not bad_file(self.root, p.relative_to(self.root).as_posix()):
                    info = tar.gettarinfo(str(p), arcname=f"{top}/{p.relative_to(self.root).as_posix()}")
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    with open(p, "rb") as fh:
                        tar.addfile(info, fh)
        digest = sha256_file(dest)
        side = dest.with_name(dest.name + ".sha256")
        fd = open_new(side)
        with os.fdopen(fd, "w") as fh:
            fh.write(f"{digest}  {dest.name}\n")
        return dest

    def artifact_path(self, art: dict[str, Any]) -> Path:
        return self.root / art["path"]


def _check_manifest(manifest: dict[str, Any], root: Path, where: object) -> list[str]:
    """Refuse a manifest of the wrong shape (UserError); drop and return the artifacts that
    are not regular files inside ``root``. Keeps every later reader free of type checks."""
    for key, typ in (("artifacts", list), ("probes", list), ("hosts", list), ("ranks", list),
                     ("notes", list), ("reports", list), ("target", dict)):
        if manifest.get(key) is None:
            manifest[key] = typ()
        elif not isinstance(manifest[key], typ):
            raise UserError(f"{where}: manifest {key!r} is a {type(manifest[key]).__name__}, "
                            f"not a {typ.__name__}")
    if not all(isinstance(p, dict) for p in manifest["probes"]):
        raise UserError(f"{where}: every entry of the manifest's 'probes' must be an object")
    kept, skipped = [], []
    for i, art in enumerate(manifest["artifacts"]):
        if not isinstance(art, dict):
            raise UserError(f"{where}: manifest artifact #{i} is a {type(art).__name__}, not an object")
        rel = art.get("path")
        why = bad_relpath(rel)
        if why:
            raise UserError(f"{where}: manifest artifact {rel!r}: {why}; refusing the bundle")
        if not isinstance(art.get("kind"), (str, type(None))):
            raise UserError(f"{where}: manifest artifact {rel!r}: 'kind' is not a string")
        why = bad_file(root, rel)  # type: ignore[arg-type]
        if why:
            skipped.append(f"{rel}: {why}")
        else:
            kept.append(art)
    manifest["artifacts"] = kept
    return skipped


def _is_tar(path: Path) -> bool:
    return path.is_file() and (path.name.endswith((".tar.gz", ".tgz", ".tar")))


def _safe_extract(archive: Path, dest: Path) -> Path:
    """Unpack only regular files and folders that stay inside ``dest``; return the bundle root.

    Bounded while unpacking, not after: at most MAX_ARCHIVE_MEMBERS members and a total of
    ``archive_limit`` bytes (a 4 MB gzip of zeros must not fill /tmp). Errors name ``archive``;
    the caller removes ``dest``.
    """
    limit = archive_limit(archive.stat().st_size)
    total = count = 0
    try:
        with tarfile.open(archive, "r:*") as tar:
            for m in tar:  # streamed: getmembers() would inflate the whole archive first
                count += 1
                if count > MAX_ARCHIVE_MEMBERS:
                    raise UserError(f"{archive}: more than {MAX_ARCHIVE_MEMBERS} members; refusing")
                parts = PurePosixPath(m.name).parts
                if m.name.startswith("/") or ".." in parts:
                    raise UserError(f"{archive}: member {m.name!r} would escape the folder; refusing")
                if not (m.isfile() or m.isdir()):
                    continue
                if m.size > MAX_ARCHIVE_MEMBER:
                    raise UserError(f"{archive}: member {m.name!r} is larger than 2 GiB; refusing")
                total += m.size
                if total > limit:
                    raise UserError(f"{archive}: unpacks to more than {limit / 2**20:.0f} MiB "
                                    f"({ARCHIVE_RATIO}x its size, at most 4 GiB); refusing")
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
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        msg = str(exc).replace(str(dest), "<unpacked>")
        raise UserError(f"{archive}: not a readable archive ({msg})") from None
    manifests = sorted(dest.rglob(MANIFEST), key=lambda p: len(p.parts))
    if not manifests:
        raise UserError(f"{archive}: archive holds no {MANIFEST}")
    return manifests[0].parent


def archive_limit(archive_size: int) -> int:
    """The most bytes an archive of ``archive_size`` bytes may unpack to."""
    return min(MAX_ARCHIVE_TOTAL, max(MIN_ARCHIVE_TOTAL, ARCHIVE_RATIO * archive_size))
