"""``read_evidence``: one evidence item of a bundle or folder, confined, scrubbed and capped.

An agent asks for files by name, and a name it was handed by a log or a ticket may be hostile
(``../../home/me/.aws/credentials``, ``/proc/self/environ``, a symlink planted in an unpacked
archive). So an item is always a path relative to what the caller named, checked by the same
rules a bundle manifest is (``bundle.bad_relpath``: no absolute path, no ``..``;
``bundle.bad_file``: no symlink, FIFO or device, nothing that resolves outside), and what is
returned went through the kind's own scrubbing and the generic secret scrubber first.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from doctor.evidence.errors import UserError

#: A listing stops here: an agent needs names to choose from, not a 100,000-line inventory.
MAX_LIST = 2000
#: Read whole (the kind's own scrubbing, e.g. env's allowlist, needs the whole file) up to this.
SCRUB_WHOLE = 16 * 2**20


def _kind_of(path: Path) -> str:
    """The evidence kind that claims the file by content, as diagnosis decides it ('' if none)."""
    from doctor.engine.facts import dispatch
    from doctor.evidence import plugins
    from doctor.evidence.contract import Sample

    try:
        owner, _ = dispatch(Sample.read(path), plugins.probes())
    except OSError:
        return ""
    return owner.name if owner is not None else ""


def _listing(root: Path, bundle: Any) -> list[dict[str, Any]]:
    if bundle is not None:
        rows = [{"item": str(a.get("path")), "kind": str(a.get("kind") or ""), "size": int(a.get("size") or 0),
                 "rank": a.get("rank") if isinstance(a.get("rank"), int) else None, "host": str(a.get("host") or "")}
                for a in bundle.manifest.get("artifacts", []) if isinstance(a, dict)]
        return rows[:MAX_LIST]
    from doctor.engine.facts import items_from_folder

    rows = []
    for it in items_from_folder(root):
        if getattr(it, "skip", None):
            continue
        rows.append({"item": it.rel, "kind": _kind_of(it.path), "size": it.path.stat().st_size,
                     "rank": None, "host": ""})
        if len(rows) >= MAX_LIST:
            break
    return rows


def _read_one(file: Path, rel: str, limit: int) -> dict[str, Any]:
    from doctor.evidence.bundle import scrub_for_kind
    from doctor.evidence.redact import is_text, scrub

    size = file.stat().st_size
    try:
        fd = os.open(file, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise UserError(f"{rel}: cannot be read ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(SCRUB_WHOLE)
    kind = _kind_of(file)
    out: dict[str, Any] = {"item": rel, "kind": kind, "size": size, "truncated": size > len(data), "text": None}
    if data[:2] == b"\x1f\x8b":
        out["note"] = "compressed (gzip); not shown - diagnose reads it, and the report holds its facts"
        return out
    if not is_text(data):
        out["note"] = "binary (e.g. a pickled flight-recorder dump); not shown - the report holds its facts"
        return out
    text = scrub(scrub_for_kind(kind, data).decode("utf-8", errors="replace"))
    if len(text) > limit:
        text, out["truncated"] = text[:limit], True
    out["text"] = text
    return out


def read(path: Path, item: str | None, limit: int) -> dict[str, Any]:
    """Without ``item``, the listing of ``path``; with it, that item (see the module docstring)."""
    from doctor.evidence.bundle import Bundle, bad_file, bad_relpath

    if not path.exists():
        raise UserError(f"{path}: no such file or folder")
    if path.is_file() and not Bundle.is_bundle(path):
        # One file named by the caller: it is the only item (read even through a link, as the CLI does).
        if item not in (None, "", path.name):
            raise UserError(f"{item}: {path} is a single file; its only item is {path.name}")
        if item is None:
            return {"path": str(path), "items": [{"item": path.name, "kind": _kind_of(path),
                                                 "size": path.stat().st_size, "rank": None, "host": ""}]}
        return {"path": str(path), **_read_one(path.resolve(), path.name, limit)}
    bundle = Bundle.load(path) if Bundle.is_bundle(path) else None
    try:
        root = bundle.root if bundle is not None else path
        if item is None:
            return {"path": str(path), "items": _listing(root, bundle)}
        why = bad_relpath(item)
        if why or "\\" in item:
            # The item is named last: a name such as /etc/passwd followed by words would read
            # as "passwd: value" to the secret scrubber and be masked out of the message.
            raise UserError(f"refused ({why or 'backslashes are not path separators here'}): an item is a "
                            f"path relative to {path}, not {item!r}")
        why = bad_file(root, item)
        if why:
            raise UserError(f"refused: the item {why}: {item!r}")
        file = root / item
        if not file.is_file():
            raise UserError(f"{item}: no such item in {path} (call read_evidence without item to list them)")
        return {"path": str(path), **_read_one(file, item, limit)}
    finally:
        if bundle is not None and bundle.unpacked is not None:
            shutil.rmtree(bundle.unpacked, ignore_errors=True)
