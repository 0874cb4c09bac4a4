"""The sealed split of bench/cases: cases nobody may tune mldoctor on.

Why: every case that was looked at while rules were written stops measuring how mldoctor does on
incidents it has never seen (the "unseen" figure grew from fixing each miss and citing it). A
sealed case is collected blind: its label is written first, mldoctor's first answer on it is
recorded in the case the day it is added (``first_run``), and from then on

- no rule, signature, probe, playbook, test, fixture or doc may cite its thread or contain a
  distinctive line of its evidence (:func:`leaks`, run by ``tests/test_sealed.py`` in CI);
- its ``first_run`` block is never edited (:func:`first_run_problems` compares it with the
  version of ``truth.yaml`` that added the case, when git history is available);
- reports show sealed results only in aggregate (``bench/evaluate.py``), so a miss cannot be
  looked up and patched case by case.

A sealed case's folder is named ``sealed-<batch>-<nn>``: the name says nothing of its content.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "bench" / "cases"
PREFIX = "sealed-"
FIRST_RUN_KEYS = ("date", "commit", "state", "top", "top1", "top3", "right")
#: Where a sealed case must never be cited (bench/cases itself, where it lives, is not searched).
SEARCHED = ("rules", "probes", "playbooks", "doctor", "tests", "docs", "bench", "README.md")
TEXT_SUFFIXES = {".py", ".yaml", ".yml", ".md", ".txt", ".json", ".log", ".out", ".err", ".csv", ""}
_NAME = re.compile(r"^sealed-[a-z0-9]+-\d{2,3}$")
_WS = re.compile(r"\s+")
_VOLATILE = re.compile(r"\b(?:\d{4}-\d\d-\d\d[T ][\d:.,]+|\d{2}:\d{2}:\d{2}(?:[.,]\d+)?)\b")


@dataclass
class SealedCase:
    name: str
    folder: Path
    truth: dict[str, Any]

    @property
    def evidence_files(self) -> list[Path]:
        return sorted(p for p in self.folder.rglob("*") if p.is_file() and p.name not in ("truth.yaml", "README.md"))


def sealed_cases(root: Path = CASES) -> list[SealedCase]:
    out = []
    for tf in sorted(root.glob(f"{PREFIX}*/truth.yaml")):
        out.append(SealedCase(tf.parent.name, tf.parent, yaml.safe_load(tf.read_text()) or {}))
    return out


def is_sealed(name: str) -> bool:
    return name.startswith(PREFIX)


def _norm(line: str) -> str:
    return _WS.sub(" ", _VOLATILE.sub("", line)).strip()


def fingerprints(case: SealedCase, per_file: int = 3) -> list[str]:
    """A few long, specific lines of the case's evidence (timestamps dropped, spaces squeezed):
    copying one of them into a signature example or a fixture is a leak as much as citing the
    thread. A line counts only if it is specific to this incident: 50 characters or more, with a
    number in it (an address, a size, a rank, a line number), and not found in the evidence of
    any open case. A framework's fixed sentence ("This usually reflects invalid usage of NCCL
    library.") is in every such thread and in many fixtures; it identifies nothing."""
    common = _open_case_lines(case.folder.parent)
    out: list[str] = []
    for path in case.evidence_files:
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        cands = {_norm(ln) for ln in lines}
        cands = {c for c in cands if 50 <= len(c) <= 400 and _DIGITS.search(c) and c not in common}
        out += sorted(cands, key=lambda s: (-len(s), s))[:per_file]
    return out


_DIGITS = re.compile(r"\d{2,}")


@lru_cache(maxsize=4)
def _open_case_lines(cases_dir: Path) -> frozenset[str]:
    """Every normalized line of the evidence of the cases that are not sealed."""
    lines: set[str] = set()
    for folder in cases_dir.iterdir() if cases_dir.is_dir() else ():
        if folder.is_dir() and not is_sealed(folder.name):
            for p in folder.rglob("*"):
                if p.is_file() and p.name not in ("truth.yaml", "README.md") and p.stat().st_size < 5 * 2**20:
                    try:
                        lines.update(_norm(ln) for ln in p.read_text(errors="replace").splitlines())
                    except OSError:
                        continue
    return frozenset(lines)


def _thread_needles(url: str) -> list[str]:
    url = url.strip().rstrip("/")
    if not url.startswith("https://"):
        return []
    bare = url.split("://", 1)[1]
    return [bare, bare.replace("github.com/", "").replace("/issues/", "#")]


def _corpus(root: Path) -> Iterator[tuple[str, str]]:
    cases = root / "bench" / "cases"
    for entry in SEARCHED:
        base = root / entry
        paths = [base] if base.is_file() else sorted(base.rglob("*")) if base.is_dir() else []
        for p in paths:
            if not p.is_file() or p.suffix not in TEXT_SUFFIXES or cases in p.parents:
                continue
            if p.stat().st_size > 5 * 2**20:
                continue
            try:
                yield str(p.relative_to(root)), _norm_text(p.read_text(errors="replace"))
            except OSError:
                continue


def _norm_text(text: str) -> str:
    return "\n".join(_norm(ln) for ln in text.splitlines())


def leaks(root: Path = ROOT, cases: list[SealedCase] | None = None) -> list[str]:
    """Every place outside bench/cases that cites a sealed case's thread or holds one of its
    distinctive evidence lines."""
    cases = sealed_cases(root / "bench" / "cases") if cases is None else cases
    needles: list[tuple[str, str, str]] = []
    for case in cases:
        needles += [(n, case.name, "its thread") for n in _thread_needles(str(case.truth.get("source", "")))]
        needles += [(n, case.name, "a line of its evidence") for n in fingerprints(case)]
    if not needles:
        return []
    found = []
    for rel, text in _corpus(root):
        for needle, name, what in needles:
            if needle in text:
                found.append(f"{rel} cites sealed case {name} ({what})")
    return sorted(found)


def first_run_problems(case: SealedCase, root: Path = ROOT) -> list[str]:
    """The case's ``first_run`` is present and complete, and, where git knows the commit that
    added the case, equal to what that commit recorded."""
    fr = case.truth.get("first_run")
    if not isinstance(fr, dict):
        return [f"{case.name}: no first_run block (record it before any change: bench/evaluate.py --record-first-run)"]
    problems = [f"{case.name}: first_run lacks {k}" for k in FIRST_RUN_KEYS if k not in fr]
    if not _NAME.match(case.name):
        problems.append(f"{case.name}: sealed folders are named sealed-<batch>-<nn>")
    rel = (case.folder / "truth.yaml").relative_to(root)
    try:
        added = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--", str(rel)], cwd=root,
                               capture_output=True, text=True, timeout=30).stdout.split()
        if added:
            then = subprocess.run(["git", "show", f"{added[-1]}:{rel}"], cwd=root, capture_output=True,
                                  text=True, timeout=30).stdout
            if (yaml.safe_load(then) or {}).get("first_run") != fr:
                problems.append(f"{case.name}: first_run differs from the commit that added the case ({added[-1][:10]})")
    except (OSError, subprocess.SubprocessError, yaml.YAMLError):
        pass  # no git here (an sdist): the content checks above still ran
    return problems
