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
from typing import Any

from doctor.evidence.contract import LOOP_FOLLOW_UPS, Probe

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


def first_round() -> list[str]:
    """Probes the live loop runs before any rule asks (``Probe.live_first_round``)."""
    return [p.name for p in probes() if p.live_first_round and p.collects_live()]


def snapshot_probes() -> list[str]:
    """Probes that take part in every stack snapshot round (``Probe.live_snapshots``)."""
    return [p.name for p in probes() if p.live_snapshots and p.collects_live()]


def for_symptom(symptom: str | None) -> list[str]:
    """Probes to run early for this symptom (``Probe.live_for_symptoms``)."""
    return [p.name for p in probes() if symptom and symptom in p.live_for_symptoms and p.collects_live()]


def follow_ups() -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Follow-up name -> the probe runs it stands for, from every probe's ``follow_ups``; the
    loop's own names (another snapshot) map to no probe run."""
    out: dict[str, list[tuple[str, dict[str, Any]]]] = {name: [] for name in LOOP_FOLLOW_UPS}
    for p in probes():
        for name, opts in p.follow_ups.items():
            out.setdefault(name, []).append((p.name, dict(opts)))
    return out


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
