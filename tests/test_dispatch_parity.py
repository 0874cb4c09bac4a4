"""The dispatcher's claims are unchanged by its speed-ups (issue #16: 16,384 stack dumps).

Every sniff that runs ahead of the stacks probe on each of 16k dumps was given cheap early rejects
(a needle or first-byte test before any regex over the sample), ``ticket.is_document`` a faster
marker search, and the dispatch loop a precomputed list of co-readers. None of that may change
which probe owns a file or which probes read it besides. Two checks, over every file of
``tests/fixtures`` and of the open benchmark cases (``bench/cases``, never the sealed ones) and
over every piece of every ticket among them:

- the recorded decisions of the code before the change (``dispatch_parity.json``: is it a
  document, which probes' ``sniff`` and ``also_sniff`` say yes) against today's, for the probes
  whose sniffs this change touched (the others are their owners' to change);
- ``dispatch`` against a plain reference of the priority order (the highest-priority probe whose
  sniff says yes owns the file; every other probe with an ``also_sniff`` that accepts the owner's
  kind reads it besides), so a faster loop cannot reorder or drop a claim.

Re-record when a sniff's decision is meant to change (or a recorded fixture's content does), with
the code to record first on the path: ``python tests/test_dispatch_parity.py --record``.
"""

from __future__ import annotations

import json
import os
import random
import re
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "tests" / "fixtures" / "dispatch_parity.json"
#: Probes whose sniffs the speed-up touched: their decisions must match the record exactly.
CHECKED = ("check", "flight_recorder", "system", "slurm", "debug_server", "gpu", "metrics", "samples", "env",
           "symptoms")


def evidence_files() -> list[tuple[str, Path]]:
    """Every regular file of the fixtures and of the open cases, as (key, path), sorted."""
    out: list[tuple[str, Path]] = []
    for top in (ROOT / "tests" / "fixtures", ROOT / "bench" / "cases"):
        for dirpath, dirnames, filenames in os.walk(top):
            # the sealed cases are never opened (reading them would spoil the evaluation)
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("sealed-") and d != "__pycache__")
            for name in sorted(filenames):
                p = Path(dirpath) / name
                if p == RECORD or p.is_symlink() or not p.is_file():
                    continue
                out.append((p.relative_to(ROOT).as_posix(), p))
    return out


def decisions(sample: Any) -> list[Any]:
    """[is_document, probes whose sniff says yes ("!name" for one that raised), co-readers]."""
    from doctor.evidence import plugins, ticket

    said: list[str] = []
    also: list[str] = []
    for p in plugins.probes():
        try:
            if p.sniff(sample):
                said.append(p.name)
        except Exception:
            said.append("!" + p.name)
        if getattr(p, "also_sniff", None):
            try:
                if p.also_sniff(sample):
                    also.append(p.name)
            except Exception:
                also.append("!" + p.name)
    return [bool(ticket.is_document(sample)), said, also]


def collect(on_sample: Any) -> dict[str, Any]:
    """``on_sample(key, sample)`` for every file, and for every piece of every file read as a
    ticket (a document, or a note no probe claims), keyed ``file#n`` in the order they are claimed."""
    from doctor.engine import facts as F
    from doctor.evidence import plugins, ticket
    from doctor.evidence.contract import Hints, Sample

    probes = plugins.probes()
    out: dict[str, Any] = {}
    for key, path in evidence_files():
        try:
            sample = Sample.read(path)
        except OSError:
            continue
        out[key] = on_sample(key, sample)
        owner = F._claim(sample, probes)
        note = getattr(F, "_written_note", lambda s: False)
        if not ticket.is_document(sample) and (owner is not None or F._also(sample, probes, owner) or not note(sample)):
            continue
        n = [0]

        def claim(s: Any, key: str = key, n: list[int] = n) -> str | None:
            n[0] += 1
            out[f"{key}#{n[0]}"] = on_sample(f"{key}#{n[0]}", s)
            return getattr(F._claim(s, probes), "name", None)

        ticket.expand(path, key, Hints(), ticket.Scratch(), claim, {p.name for p in probes if p.joins_pieces},
                      [p.name for p in probes if p.reads_prose])
    return out


def reference_dispatch(sample: Any, probes: tuple[Any, ...]) -> tuple[str | None, list[str]]:
    """The dispatch order as the contract states it, written plainly."""
    owner = None
    if sample.size:
        for p in probes:
            try:
                if p.sniff(sample):
                    owner = p
                    break
            except Exception:
                continue
    also: list[str] = []
    if sample.size:
        for p in probes:
            if p is owner or not getattr(p, "also_sniff", None):
                continue
            kinds = getattr(p, "also_reads", None)
            if owner is not None and kinds is not None and owner.name not in kinds:
                continue
            try:
                if p.also_sniff(sample):
                    also.append(p.name)
            except Exception:
                continue
    return (owner.name if owner is not None else None), also


@pytest.fixture(scope="module")
def today() -> dict[str, Any]:
    from doctor.engine import facts as F
    from doctor.evidence import plugins

    probes = plugins.probes()

    def both(key: str, sample: Any) -> Any:
        owner, also = F.dispatch(sample, probes)
        got = ((owner.name if owner is not None else None), [p.name for p in also])
        return {"decisions": decisions(sample), "dispatch": got, "reference": reference_dispatch(sample, probes)}

    return collect(both)


def test_covers_the_evidence(today: dict[str, Any]) -> None:
    """The comparison sees hundreds of files and ticket pieces of every kind, not a handful."""
    assert len(today) > 800
    owners = {v["dispatch"][0] for v in today.values()}
    assert {"stacks", "logs", "metrics", "gpu", "slurm", "flight_recorder", "debug_server", "env"} <= owners
    assert any("#" in k for k in today)  # ticket pieces too


def test_dispatch_matches_the_priority_order(today: dict[str, Any]) -> None:
    wrong = {k: (v["dispatch"], v["reference"]) for k, v in today.items() if list(v["dispatch"]) != list(v["reference"])}
    assert not wrong, wrong


def test_sniff_decisions_match_the_record(today: dict[str, Any]) -> None:
    recorded = json.loads(RECORD.read_text())
    # files added since the record have no "before" (the reference order above still checks
    # them); the record must still cover nearly all of today's evidence
    common = set(recorded) & set(today)
    assert len(common) >= 0.9 * len(recorded) and len(common) > 800, sorted(set(recorded) ^ set(today))[:20]
    recorded = {k: recorded[k] for k in sorted(common)}

    def keep(names: list[str]) -> list[str]:
        return [n for n in names if n.lstrip("!") in CHECKED]

    wrong = {}
    for key, (doc, said, also) in recorded.items():
        now_doc, now_said, now_also = today[key]["decisions"]
        if doc != now_doc or keep(said) != keep(now_said) or keep(also) != keep(now_also):
            wrong[key] = {"recorded": [doc, said, also], "now": [now_doc, now_said, now_also]}
    assert not wrong, wrong


#: The marker search ``ticket.is_document`` ran before it was split in two (``ticket._marked``).
_OLD_MARKERS = re.compile(
    r"\n[ \t]{0,3}(?:```|~~~|> |>$|\{code|\{noformat\}|<details|<pre|<code>|<summary)"
    r"|&(?:lt|gt|quot)"
    r"|\n\[?\d{1,2}:\d\d(?::\d\d)?(?:\s?[AaPp][Mm])?\]?\s+(?:<[\w.@-]+>|[A-Za-z][\w.@-]{0,30}:)\s",
    re.M,
)


def test_marker_search_matches_the_single_alternation() -> None:
    """Over every evidence file's head and lines built to sit on each branch's edge (the first
    line, three and four blanks, a bare "&", a chat prefix), the split search finds a marker
    exactly where the old alternation did."""
    from doctor.evidence import ticket
    from doctor.evidence.contract import Sample

    texts = []
    for _, path in evidence_files():
        try:
            texts.append(Sample.read(path).text)
        except OSError:
            continue
    edges = ["```py", "   ```", "    ```", "~~~", "> quoted", ">", "\t>", "a > b", "{code}", "{noformat}",
             "<details>", "<pre>", "<code>", "<summary>", "&lt;", "&amp;", "& gt", "&quot;", "10:42 alice: hi",
             "[10:42] <bob> hi", "[9:05 PM] carol: x", "10:42alice: x", "1:2 x: y", "    all_reduce (x.py:3)",
             "Thread 1 (idle):", "", "\r\n> x", "x\n>\n"]
    texts += edges + [f"line one\n{e}\nlast" for e in edges] + [f"{e}\n" for e in edges]
    rng = random.Random(16)
    alphabet = "\n \t>&`~{}<[]:0123456789aApPmM lgtquo.-@_x"
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))) for _ in range(20000)]
    wrong = [t[:80] for t in texts if ticket._marked(t) != bool(_OLD_MARKERS.search("\n" + t))]
    assert not wrong, wrong[:10]
    found = sum(ticket._marked(t) for t in texts)
    assert 100 < found < len(texts) - 100  # both outcomes are exercised


def _reference_items(folder: Path, cap: int) -> list[tuple[str, str, Any, bool]]:
    """The folder walk as it was (``os.walk`` and one ``lstat`` per file), as comparable rows."""
    import stat

    from doctor.evidence.contract import Hints

    items: list[tuple[str, str, Any, bool]] = []
    skipped: list[tuple[str, str, Any, bool]] = []
    n_files = 0

    def unreadable(err: OSError) -> None:
        rel = Path(err.filename or folder).relative_to(folder).as_posix() if err.filename else "."
        skipped.append((rel, f"cannot list ({err.strerror or err})", None, False))

    for dirpath, dirnames, filenames in os.walk(folder, onerror=unreadable, followlinks=False):
        base = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for d in dirnames:
            if (base / d).is_symlink():
                skipped.append(((base / d).relative_to(folder).as_posix(), "symbolic link: not followed", None, False))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            p = base / name
            rel = p.relative_to(folder).as_posix()
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                skipped.append((rel, "symbolic link: not followed", None, False))
            elif not stat.S_ISREG(st.st_mode):
                skipped.append((rel, "not a regular file (FIFO, socket or device): not read", None, False))
            else:
                n_files += 1
                if n_files <= cap:
                    items.append((rel, "", Hints.from_path(rel), False))
    if n_files > cap:
        skipped.append((".", f"{n_files - cap} of {n_files} files not read: more than {cap} in one folder", None, True))
    return items + skipped


@pytest.mark.parametrize("cap", [20000, 5])
def test_folder_walk_matches_os_walk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cap: int) -> None:
    """Nested folders, hidden entries, links to files and folders, a dangling link and a FIFO:
    the walk over directory entries lists, skips and names exactly what the os.walk one did."""
    from doctor.engine import facts as F

    root = tmp_path / "ev"
    for rel in ("rank0.log", "b/node07/rank3.txt", "b/a.txt", "a/z/dump_12", ".hidden/x.log", "a/.dot.log",
                "c d/ünï rank4.log", "a/z/y/deep.txt", "b/c/d/e/f.log"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x\n")
    (root / "link.log").symlink_to(root / "rank0.log")
    (root / "linked_dir").symlink_to(root / "b", target_is_directory=True)
    (root / "b" / "dangling").symlink_to(root / "nowhere")
    if hasattr(os, "mkfifo"):
        os.mkfifo(root / "a" / "pipe")
    monkeypatch.setattr(F, "MAX_LOOSE_FILES", cap)
    got = [(i.rel, i.skip, None if i.skip else i.hints, i.cut) for i in F.items_from_folder(root)]
    assert got == _reference_items(root, cap)
    assert [i.path for i in F.items_from_folder(root) if not i.skip][:2] == [root / "rank0.log", root / "a" / "z" / "dump_12"]


def test_path_hints_match_the_plain_searches() -> None:
    """``Hints.from_path`` skips the host search for names without a host word: on names mixing
    the words, their case-folding look-alikes (long s, Kelvin sign), digits and separators it
    gives the hints the plain searches give."""
    from doctor.evidence import contract as C

    def reference(rel: str) -> tuple[int | None, str | None]:
        rank = host = None
        for part in reversed(rel.replace("\\", "/").split("/")):
            stem = part.rsplit(".", 1)[0] if "." in part else part
            if rank is None:
                m = C._RANK_RE.search(stem) or C._DUMP_RANK_RE.search(stem)
                rank = int(m.group(1)) if m else None
            if host is None:
                m = C._HOST_RE.search(stem)
                host = m.group(1) if m else None
        return rank, host

    rng = random.Random(7)
    words = ["node", "host", "gpu-node", "worker", "compute", "NODE", "ho\u017ft", "wor\u212aer", "Node07", "rank3",
             "rk_2", "dump_12", "trace-node07-1.out", "/", "."]
    alphabet = "nodehstwrkcmpuNODEHSTWRK-_0123456789./\u017f\u212a\u0131"
    names = ["".join(rng.choice(words) + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 5)))
                     for _ in range(rng.randint(1, 4))) for _ in range(20000)]
    wrong = [n for n in names if (lambda h: (h.rank, h.host))(C.Hints.from_path(n)) != reference(n)]
    assert not wrong, wrong[:10]
    assert sum(reference(n)[1] is not None for n in names) > 1000


def test_dispatch_claims_a_dump_among_look_alikes(tmp_path: Path) -> None:
    """The early rejects keep their kinds: a py-spy dump is the stacks probe's, a dump header
    with fenced blocks after it is still a ticket, and an empty file is nobody's."""
    from doctor.engine import facts as F
    from doctor.evidence import plugins, ticket
    from doctor.evidence.contract import Sample

    probes = plugins.probes()
    dump = tmp_path / "pyspy-rank5.txt"
    dump.write_text('Process 12: python train.py\nPython v3.11.7 (/usr/bin/python3)\n\n'
                    'Thread 13 (idle): "MainThread"\n    all_reduce (torch/distributed/distributed_c10d.py:3252)\n'
                    '    <module> (train.py:5)\n')
    s = Sample.read(dump)
    assert not ticket.is_document(s)
    assert F.dispatch(s, probes)[0].name == "stacks"
    ticket_file = tmp_path / "issue.md"
    ticket_file.write_text("Process 12: the job hangs and we do not know why, see the dump below.\n\n```\n"
                           + dump.read_text() + "```\n\nIt has been stuck for an hour on all ranks.\n")
    assert ticket.is_document(Sample.read(ticket_file))
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert F.dispatch(Sample.read(empty), probes) == (None, [])


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    rec = collect(lambda key, sample: decisions(sample))
    RECORD.write_text(json.dumps(rec, sort_keys=True, separators=(",", ":")).replace('],"', '],\n"') + "\n")
    print(f"{len(rec)} entries -> {RECORD}")
