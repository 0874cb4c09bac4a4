"""Playbooks: one YAML file per cause id, saying what it means, how to confirm it and how to fix it."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from doctor.engine import taxonomy
from doctor.evidence import plugins
from doctor.evidence.errors import UserError
from doctor.evidence.yamlsrc import safe_data

REQUIRED = ("cause", "title", "category", "means", "confirm", "fix", "references")


@lru_cache(maxsize=1)
def all_playbooks() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(plugins.playbook_dir().glob("*.yaml")):
        try:
            data = safe_data(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise UserError(f"{path}: invalid YAML ({exc})") from None
        if isinstance(data, dict):
            data["_path"] = str(path)
            out[path.stem] = data
    return out


def get(cause: str) -> dict[str, Any] | None:
    return all_playbooks().get(cause)


def problems() -> list[str]:
    """Lint: every cause has a playbook with the required keys, and no playbook is orphaned."""
    out = []
    books = all_playbooks()
    for cause, cat in taxonomy.causes().items():
        pb = books.get(cause)
        if pb is None:
            out.append(f"playbooks/{cause}.yaml: missing (every cause id needs a playbook)")
            continue
        for key in REQUIRED:
            if not pb.get(key):
                out.append(f"{Path(pb['_path']).name}: missing {key!r}")
        if pb.get("cause") != cause:
            out.append(f"{Path(pb['_path']).name}: cause field {pb.get('cause')!r} differs from the file name")
        if pb.get("category") != cat:
            out.append(f"{Path(pb['_path']).name}: category {pb.get('category')!r} but the taxonomy says {cat!r}")
    for name in books:
        if name not in taxonomy.causes():
            out.append(f"playbooks/{name}.yaml: no such cause id in the taxonomy")
    return out


def fix_steps(cause: str) -> list[str]:
    pb = get(cause) or {}
    return [str(s) for s in pb.get("fix", [])]


def confirm_probes(cause: str) -> list[str]:
    pb = get(cause) or {}
    return [str(p) for p in (pb.get("confirm") or {}).get("probes", [])]
