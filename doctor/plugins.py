"""Find evidence kinds and rule packs: built-in ones register exactly like third-party ones.

Probes come from the ``mldoctor.probes`` entry-point group (``name = "module:PROBE"``); rule
packs from ``mldoctor.rules`` (a package holding YAML rules) and from directories named in
``MLDOCTOR_RULES_PATH`` or ``--rules``.
"""

from __future__ import annotations

import importlib
import os
from functools import lru_cache
from importlib import metadata, resources
from pathlib import Path

from doctor.evidence import Probe

PROBE_GROUP = "mldoctor.probes"
RULES_GROUP = "mldoctor.rules"


#: Probes that are registered but failed to load: ``(entry point, one-line reason)``.
load_errors: list[tuple[str, str]] = []


@lru_cache(maxsize=1)
def probes() -> tuple[Probe, ...]:
    """Every registered probe, highest priority first; a broken plugin is skipped and noted."""
    found: dict[str, Probe] = {}
    for ep in metadata.entry_points(group=PROBE_GROUP):
        try:
            probe = ep.load()
        except Exception as exc:  # a third-party probe must not take the engine down
            load_errors.append((f"{ep.name} = {ep.value}", f"{type(exc).__name__}: {exc}"))
            continue
        if isinstance(probe, type):
            probe = probe()
        found.setdefault(probe.name or ep.name, probe)
    return tuple(sorted(found.values(), key=lambda p: (-p.priority, p.name)))


def probe(name: str) -> Probe | None:
    return next((p for p in probes() if p.name == name), None)


def rule_dirs(extra: list[Path] | None = None) -> list[Path]:
    """Directories to read rules from, built-in pack first."""
    dirs: list[Path] = []
    for ep in metadata.entry_points(group=RULES_GROUP):
        pkg = importlib.import_module(ep.value)
        dirs.append(Path(str(resources.files(pkg))))
    for item in os.environ.get("MLDOCTOR_RULES_PATH", "").split(os.pathsep):
        if item:
            dirs.append(Path(item))
    dirs.extend(extra or [])
    seen: list[Path] = []
    for d in dirs:
        if d.resolve() not in [s.resolve() for s in seen]:
            seen.append(d)
    return seen


def playbook_dir() -> Path:
    return Path(str(resources.files("doctor.playbooks")))
