"""How much of each message family the signature library recognizes (``templates/*.yaml``).

Why a harvest of its own: a signature written from one forum thread catches that thread's line and
little else. The messages a fault can leave are finite and written down upstream (the CUDA
runtime's error strings, NVIDIA's Xid catalog, the kernel's printk formats, PyTorch's
DataLoader errors), so each family's templates are harvested once from that primary source, into
``templates/<family>.yaml``, and the library is measured against the whole list:

```yaml
family: cuda_runtime
harvested_from: <upstream repo@commit or doc URL, and how the list was taken>
templates:
  - template: "an illegal memory access was encountered"   # the upstream text, placeholders kept
    source: <file:line or URL#anchor>
    fault: true        # false: informational (never a sign of a fault): outside the ratio
    example: "RuntimeError: CUDA error: an illegal memory access was encountered"
    kind: cuda_error   # optional: the signature kind the example must produce
```

A fault template is covered when its ``example``, written to a file and read by the real
scanner (:func:`.scan.scan_file`, the path every log file takes), yields at least one event of a
*specific* signature (of ``kind`` when the template names one). Catch-all signatures do not
count: a hit from them says "some error" and no rule can name a cause from it. A signature is a
catch-all when its entry says ``generic: true``, or when its kind is in :data:`GENERIC_KINDS`
(kinds that by construction take any message of a component, such as every ``NCCL WARN`` line).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from doctor.evidence.errors import UserError
from doctor.evidence.yamlsrc import safe_data

from .library import library
from .scan import scan_file

#: Kinds whose signatures take any message of a component ("NCCL WARN <anything>"): a template
#: they alone recognize is not covered, since nothing specific about the fault is known.
GENERIC_KINDS = frozenset({"nccl_warn"})

_TOP = ("family", "harvested_from", "templates")
_FIELDS = ("template", "source", "fault", "example", "kind", "note")


@dataclass(frozen=True)
class Template:
    """One harvested message template of a family."""

    family: str
    template: str
    source: str
    fault: bool
    example: str
    kind: str = ""
    note: str = ""


@dataclass(frozen=True)
class Family:
    """The harvested templates of one message family (one ``templates/*.yaml`` file)."""

    name: str
    harvested_from: str
    templates: tuple[Template, ...]
    file: str


def parse_family(name: str, text: str) -> Family:
    """One template file; every shape error is a one-line ``UserError`` naming file and entry,
    so a bad harvest fails its test instead of quietly lowering a coverage number."""
    try:
        data = safe_data(text)
    except Exception as exc:  # noqa: BLE001 - yaml's errors: one line for the user
        raise UserError(f"{name}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or any(k not in data for k in _TOP):
        raise UserError(f"{name}: a template file is a mapping with {', '.join(_TOP)}")
    family = str(data["family"])
    if Path(name).stem != family:
        raise UserError(f"{name}: family {family!r} must equal the file's stem")
    if not str(data["harvested_from"] or "").strip():
        raise UserError(f"{name}: harvested_from is empty")
    entries = data["templates"]
    if not isinstance(entries, list) or not entries:
        raise UserError(f"{name}: templates must be a non-empty list")
    out: list[Template] = []
    for i, e in enumerate(entries, 1):
        where = f"{name}: template {i}"
        if not isinstance(e, dict):
            raise UserError(f"{where}: must be a mapping")
        unknown = sorted(set(e) - set(_FIELDS))
        if unknown:
            raise UserError(f"{where}: unknown field(s) {', '.join(unknown)}")
        for key in ("template", "source", "example"):
            if not isinstance(e.get(key), str) or not e[key].strip():
                raise UserError(f"{where}: {key} must be a non-empty string")
        if not isinstance(e.get("fault"), bool):
            raise UserError(f"{where}: fault must be true or false")
        out.append(Template(family, e["template"], e["source"], e["fault"], e["example"],
                            str(e.get("kind") or ""), str(e.get("note") or "")))
    seen: set[str] = set()
    for t in out:
        if t.template in seen:
            raise UserError(f"{name}: template {t.template!r} is listed twice")
        seen.add(t.template)
    return Family(family, str(data["harvested_from"]).strip(), tuple(out), name)


def families() -> list[Family]:
    """Every ``templates/*.yaml`` of this package, by file name."""
    base = resources.files(__package__) / "templates"
    if not base.is_dir():
        return []
    return [parse_family(e.name, e.read_text(encoding="utf-8"))
            for e in sorted(base.iterdir(), key=lambda e: e.name) if e.name.endswith(".yaml")]


@lru_cache(maxsize=1)
def _generic_ids() -> frozenset[str]:
    """Ids of the catch-all signatures (see the module docstring)."""
    raw = resources.files(__package__) / "patterns"
    flagged: set[str] = set()
    for entry in raw.iterdir():
        if entry.name.endswith(".yaml"):
            data = safe_data(entry.read_text(encoding="utf-8")) or {}
            for e in data.get("patterns", data.get("signatures")) or []:
                if isinstance(e, dict) and e.get("generic") is True:
                    flagged.add(str(e.get("id")))
    return frozenset(flagged | {s.id for s in library().signatures if s.kind in GENERIC_KINDS})


def recognize(example: str, workdir: Path) -> list[dict[str, Any]]:
    """The events the scanner makes of one example line, read from a file like any log."""
    path = workdir / "example.log"
    path.write_text(example.rstrip("\n") + "\n", encoding="utf-8")
    return scan_file(path, "example.log").events


def check(t: Template, workdir: Path) -> dict[str, Any]:
    """Is one template covered? ``{"covered": bool, "sigs": [...], "kinds": [...]}``."""
    generic = _generic_ids()
    events = recognize(t.example, workdir)
    specific = [e for e in events if e["sig"] not in generic]
    if t.kind:
        specific = [e for e in specific if e["kind"] == t.kind]
    return {"covered": bool(specific), "sigs": sorted({e["sig"] for e in events}),
            "kinds": sorted({e["kind"] for e in events})}


def coverage_rows() -> list[dict[str, Any]]:
    """One row per family: templates harvested, fault templates, how many have a signature, and
    the uncovered ones (what to write next)."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mldoctor-coverage-") as tmp:
        work = Path(tmp)
        for fam in families():
            faults = [t for t in fam.templates if t.fault]
            missing = []
            covered = 0
            for t in faults:
                res = check(t, work)
                if res["covered"]:
                    covered += 1
                else:
                    missing.append({"template": t.template, "source": t.source, "example": t.example,
                                    "kind": t.kind, "got": res["sigs"]})
            rows.append({
                "probe": "logs", "signatures": len(library().signatures), "family": fam.name, "harvested_from": fam.harvested_from,
                "templates": len(fam.templates), "fault_templates": len(faults),
                "informational": len(fam.templates) - len(faults), "covered": covered,
                "coverage": round(covered / len(faults), 4) if faults else 1.0,
                "uncovered": missing,
            })
    return rows
