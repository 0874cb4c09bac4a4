"""The architecture's one-way rules, checked on the source (docs/architecture.md).

import-linter (``lint-imports``, run by .ci/run) pins the layers inside doctor/. It walks doctor/
only, so the probes (installed as ``doctor.probes`` from probes/) are checked here, from the
source with ``ast``: every import counts, function-level ones too, so a lazy import can never
hide a cycle.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
#: Modules of doctor/ allowed to import a probe package by name, and why.
PROBE_IMPORTERS = {
    # the SLURM fan-out reads host lists and scontrol output with the slurm kind's own readers
    "doctor.live.slurm",
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] == "probes":
        parts = ["doctor", "probes", *parts[1:]]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    out = {}
    for top in ("doctor", "probes"):
        for p in sorted((ROOT / top).rglob("*.py")):
            out[_module_name(p)] = p
    return out


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Modules of ours that ``name`` imports (the most specific existing module per import)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name and t.startswith("doctor"):
                found.add(t)
    return found


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(name, path, known) for name, path in known.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_doctor_or_probes() -> None:
    graph = _graph()
    assert len(graph) > 40  # the scan really read the tree
    assert _cycles(graph) == []


def test_probes_import_only_the_evidence_layer_and_probes() -> None:
    bad = []
    for name, deps in _graph().items():
        if not name.startswith("doctor.probes"):
            continue
        bad += [f"{name} -> {d}" for d in deps if not d.startswith(("doctor.evidence", "doctor.probes"))
                and d != "doctor"]
    assert bad == []


def test_the_engine_and_renderers_never_import_a_probe_by_name() -> None:
    bad = [f"{name} -> {d}" for name, deps in _graph().items()
           if not name.startswith("doctor.probes") and name not in PROBE_IMPORTERS
           for d in deps if d.startswith("doctor.probes")]
    assert bad == []


def test_every_package_is_listed_for_installation() -> None:
    """The probes/ mapping defeats setuptools' discovery: a package missing from pyproject's
    list works in the editable install and is silently absent from a wheel."""
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(conf["packages"])
    dirs = {v: k for k, v in conf["package-dir"].items()}  # source folder -> package
    found = set()
    for folder, pkg in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([pkg, *rel.parts]))
    assert found - listed == set()
    assert listed - found == set()
