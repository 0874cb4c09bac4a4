"""Turn evidence files into the facts document, the rules' whole vocabulary.

Each file goes to the probe that recognizes it (by content), each probe adds its own namespace,
and the engine adds ``meta``, ``job`` and ``evidence``. A file that cannot be used becomes a
one-line entry in ``evidence.errors``; it never stops the rest.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from doctor.evidence import plugins, ticket
from doctor.evidence.bundle import Bundle
from doctor.evidence.contract import Hints, Parsed, Sample, one_line, set_world_size  # noqa: F401 (re-exported)
from doctor.evidence.errors import EvidenceError

FACTS_SCHEMA = "mldoctor.facts/1"
MAX_LOOSE_FILES = 20000

BASE_SCHEMA: dict[str, str] = {
    "meta.schema": "string: facts schema version",
    "meta.source": "string: where the evidence came from: bundle | loose | live",
    "meta.symptom": "string: the user's hint (hang | slow | crash | diverge) or empty",
    "job.world_size": "int: ranks in the job (from WORLD_SIZE or the evidence), 0 when unknown",
    "job.ranks_seen": "list<int>: ranks some evidence speaks for",
    "job.n_ranks_seen": "int: how many ranks some evidence speaks for",
    "job.missing_ranks": "list<int>: ranks below world_size that no evidence speaks for",
    "job.hosts": "list<string>: hosts some evidence came from",
    "job.rank_hosts": "map<string,string>: rank -> the host most of its evidence came from",
    "job.observed_state": "string: what live snapshots saw: hung (most ranks' stacks frozen), progressing, crashed (no rank alive), or empty",
    "evidence.kinds": "list<string>: evidence kinds found",
    "evidence.files": "int: files used",
    "evidence.ignored": "list<string>: files no probe recognized",
    "evidence.documents": "list<string>: (only when a ticket was read) pieces of tickets and pastes and the kind each was read as ('issue.md block 2, lines 9-40: logs')",
    "evidence.errors": "list<string>: one line per file that could not be used",
    "evidence.incomplete": "bool: some evidence was found and left unread (past a cap): never a healthy verdict",
    "evidence.unread": "int: entries found and not read (links, FIFOs, unreadable folders, files past the cap)",
    "evidence.probes": "list<map>: live probe runs: name, status (ok|failed|skipped), reason, host",
    "evidence.probes[].name": "string: probe name",
    "evidence.probes[].status": "string: ok | failed | skipped",
    "evidence.probes[].reason": "string: why it failed or was skipped",
    "evidence.probes[].host": "string: host it ran on",
}


@dataclass
class Item:
    """A file to consider as evidence, or (``skip`` set) one that was found and not read."""

    path: Path
    rel: str
    kind: str | None = None
    hints: Hints = Hints()
    #: Why this entry is not read (a symlink, a FIFO, an unreadable folder, the file cap):
    #: it becomes a line of ``evidence.ignored`` so no evidence is lost without a word.
    skip: str = ""
    #: This entry stands for files left unread at the cap: the evidence is incomplete.
    cut: bool = False


def schema() -> dict[str, str]:
    """Every documented fact path, engine and probes together."""
    out = dict(BASE_SCHEMA)
    for p in plugins.probes():
        out.update(p.facts_schema)
    return out


def empty_facts(source: str, symptom: str | None) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "meta": {"schema": FACTS_SCHEMA, "source": source, "symptom": symptom or ""},
        "job": {"world_size": 0, "ranks_seen": [], "n_ranks_seen": 0, "missing_ranks": [], "hosts": [],
                "rank_hosts": {}, "observed_state": ""},
        "evidence": {"kinds": [], "files": 0, "ignored": [], "errors": [], "probes": [], "unread": 0,
                     "incomplete": False},
    }
    return facts


def items_from_folder(folder: Path) -> list[Item]:
    """Every regular file under ``folder`` with hints from its path; hidden entries are left out
    by design, everything else that is not read (links, FIFOs, devices, unreadable folders, files
    past the cap) comes back as a skipped item with the reason."""
    if folder.is_file():  # named by the user: read even through a link (links *inside* are not)
        return [Item(folder, folder.name, None, Hints.from_path(folder.name))]
    items: list[Item] = []
    skipped: list[Item] = []
    n_files = 0

    def unreadable(err: OSError) -> None:
        rel = Path(err.filename or folder).relative_to(folder).as_posix() if err.filename else "."
        skipped.append(Item(Path(err.filename or folder), rel, skip=f"cannot list ({err.strerror or err})"))

    top = os.fspath(folder)
    for dirpath, dirs, files in _walk(top, unreadable):
        base = Path(dirpath)
        # the relative name as a string (what relative_to(folder).as_posix() gives): building a
        # second path per file to take it apart again cost a third of this walk at 16k files
        under = dirpath[len(top):].lstrip(os.sep)
        prefix = under.replace(os.sep, "/") + "/" if under else ""
        dirs[:] = sorted((d for d in dirs if not d.name.startswith(".")), key=lambda e: e.name)
        for d in dirs:
            if d.is_symlink():
                skipped.append(Item(base / d.name, (base / d.name).relative_to(folder).as_posix(),
                                    skip="symbolic link: not followed"))
        for entry in sorted(files, key=lambda e: e.name):
            name = entry.name
            if name.startswith("."):
                continue
            p = base / name
            rel = prefix + name
            # the directory entry's type, as lstat would give it (no second system call per file)
            try:
                link, regular = entry.is_symlink(), entry.is_file(follow_symlinks=False)
            except OSError as exc:
                skipped.append(Item(p, rel, skip=f"cannot read ({exc.strerror or exc})"))
                continue
            if link:
                skipped.append(Item(p, rel, skip="symbolic link: not followed"))
            elif not regular:
                skipped.append(Item(p, rel, skip="not a regular file (FIFO, socket or device): not read"))
            else:
                n_files += 1
                if n_files <= MAX_LOOSE_FILES:
                    items.append(Item(p, rel, None, Hints.from_path(rel)))
    if n_files > MAX_LOOSE_FILES:
        skipped.append(Item(folder, ".", skip=f"{n_files - MAX_LOOSE_FILES} of {n_files} files not read: "
                                               f"more than {MAX_LOOSE_FILES} in one folder", cut=True))
    return items + skipped


def _walk(top: str, onerror: Callable[[OSError], None]) -> Iterator[tuple[str, list[os.DirEntry[str]], list[os.DirEntry[str]]]]:
    """``os.walk(top, onerror=onerror, followlinks=False)``, top-down, with the directory entries
    instead of their names: an entry knows whether it is a link or a regular file from the
    directory listing itself, where a name needs one ``lstat`` per file (16k at scale). Same
    order, same pruning (the caller edits the list of directories in place), same errors; a
    stack rather than recursion, so no depth of nesting raises RecursionError."""
    stack = [top]
    while stack:
        path = stack.pop()
        try:
            listing = os.scandir(path)
        except OSError as exc:
            onerror(exc)
            continue
        dirs: list[os.DirEntry[str]] = []
        files: list[os.DirEntry[str]] = []
        with listing:
            failed = False
            while True:
                try:
                    entry = next(listing)
                except StopIteration:
                    break
                except OSError as exc:
                    onerror(exc)
                    failed = True
                    break
                try:
                    is_dir = entry.is_dir()
                except OSError:
                    is_dir = False
                (dirs if is_dir else files).append(entry)
        if failed:  # as os.walk: a folder that fails midway is reported and not yielded
            continue
        yield path, dirs, files
        for d in reversed(dirs):  # popped in the caller's (sorted) order
            try:
                link = d.is_symlink()
            except OSError:  # as os.path.islink: an entry that cannot be read is walked (and reported)
                link = False
            if not link:
                stack.append(d.path)


def items_from_bundle(bundle: Bundle) -> list[Item]:
    items = []
    for art in bundle.manifest.get("artifacts", []):
        h = Hints.from_path(art["path"])
        hints = Hints(
            rank=art.get("rank") if art.get("rank") is not None else h.rank,
            host=art.get("host") or h.host,
            pid=art.get("pid"),
        )
        items.append(Item(bundle.artifact_path(art), art["path"], art.get("kind") or None, hints))
    return items


#: The probes' sniffs in priority order, as ``(probe, sniff)``.
Sniffers = list[tuple[Any, Callable[[Sample], Any]]]
#: The probes with an ``also_sniff``, in priority order, as ``(probe, also_sniff, also_reads)``.
CoReaders = list[tuple[Any, Callable[[Sample], Any], Any]]


def _sniffers(probes: tuple[Any, ...]) -> Sniffers:
    return [(p, p.sniff) for p in probes]


def _co_readers(probes: tuple[Any, ...]) -> CoReaders:
    return [(p, p.also_sniff, getattr(p, "also_reads", None)) for p in probes if getattr(p, "also_sniff", None)]


def _claim(sample: Sample, probes: tuple[Any, ...], sniffers: Sniffers | None = None) -> Any | None:
    """The highest-priority probe whose sniff says yes. ``sniffers`` is ``_sniffers(probes)``
    when the caller dispatches many files (``build`` looks the methods up once, not per file)."""
    if sample.size == 0:
        return None
    for p, sniff in _sniffers(probes) if sniffers is None else sniffers:
        try:
            if sniff(sample):
                return p
        except Exception:  # a faulty sniff must not hide the file from the others
            continue
    return None


def _also(sample: Sample, probes: tuple[Any, ...], owner: Any | None, readers: CoReaders | None = None) -> list[Any]:
    """Probes that read a file besides its owner (an optional ``also_sniff(sample)``): a trainer
    log is evidence both of what failed (logs) and of how the loss went (metrics). A probe that
    declares ``also_reads`` is asked only about the files of those kinds and unclaimed ones.
    ``readers`` is ``_co_readers(probes)``, looked up once by a caller with many files."""
    if not sample.size:
        return []
    owner_name = owner.name if owner is not None else None
    out = []
    for p, also_sniff, kinds in _co_readers(probes) if readers is None else readers:
        if p is owner:
            continue
        if owner_name is not None and kinds is not None and owner_name not in kinds:
            continue
        try:
            if also_sniff(sample):
                out.append(p)
        except Exception:  # same as sniff: never let one probe hide a file
            continue
    return out


def dispatch(sample: Sample, probes: tuple[Any, ...]) -> tuple[Any | None, list[Any]]:
    """The probe that owns a file (the highest-priority one whose sniff claims it) and the
    probes that read it besides (``also_sniff``): what ``build`` does with every file."""
    owner = _claim(sample, probes)
    return owner, _also(sample, probes, owner)


def build(items: list[Item], source: str, symptom: str | None = None,
          probe_runs: list[dict[str, Any]] | None = None) -> tuple[dict[str, Any], dict[str, float]]:
    """Parse every item and assemble the facts; returns (facts, seconds spent per kind).

    The cyclic garbage collector is paused meanwhile: parsing thousands of dumps allocates
    millions of small acyclic objects (frames, lines), and each full collection would walk all of
    them again, for nothing (about a tenth of the time at 16,384 ranks). Collections resume after.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _build(items, source, symptom, probe_runs)
    finally:
        if was_enabled:
            gc.enable()


def _build(items: list[Item], source: str, symptom: str | None,
           probe_runs: list[dict[str, Any]] | None) -> tuple[dict[str, Any], dict[str, float]]:
    facts = empty_facts(source, symptom)
    ev = facts["evidence"]
    ev["probes"] = [
        {k: r.get(k, "") for k in ("name", "status", "reason", "host")} for r in (probe_runs or [])
    ]
    probes = plugins.probes()
    items, scratch = list(items), ticket.Scratch()  # tickets add their pieces; files removed after
    by_name = {p.name: p for p in probes}
    sniffers, readers = _sniffers(probes), _co_readers(probes)  # looked up once, not per file
    parsed: dict[str, list[Parsed]] = {}
    timing: dict[str, float] = {}
    for item in items:
        if item.skip:
            ev["ignored"].append(f"{item.rel} ({item.skip})")
            ev["unread"] += 1
            if item.cut:
                ev["errors"].append(f"{item.rel}: {item.skip}")
                ev["incomplete"] = True
            continue
        t0 = time.perf_counter()
        try:
            sample = Sample.read(item.path)  # read once: the owner's sniff and the extra readers share it
            if item.kind is None and ticket.is_document(sample):  # a ticket or paste: dispatch its pieces
                items.extend(_pieces(item, probes, scratch, ev))
                continue
            probe = by_name.get(item.kind) if item.kind else _claim(sample, probes, sniffers)
        except OSError as exc:
            ev["errors"].append(f"{item.rel}: cannot read ({exc.strerror or exc})")
            continue
        try:
            extra = _also(sample, probes, probe, readers)
        except OSError:
            extra = []
        if probe is None and not item.kind and _written_note(sample):
            # No reader owns it: read it as a ticket, whose blocks reach every reader (a co-reader
            # such as metrics alone would take its numbers and drop its words and log lines).
            items.extend(_pieces(item, probes, scratch, ev, note=True))
            continue
        if probe is None and not extra:
            if item.kind and item.kind not in by_name:
                ev["ignored"].append(f"{item.rel} (kind {item.kind!r} has no installed probe)")
            elif not item.kind:
                ev["ignored"].append(item.rel)
            continue
        used = False
        for reader in ([probe] if probe is not None else []) + extra:
            out = _parse_one(reader, item, ev["errors"], sample.size)
            timing[reader.name] = timing.get(reader.name, 0.0) + time.perf_counter() - t0
            t0 = time.perf_counter()
            if out is None:
                continue
            parsed.setdefault(reader.name, []).extend(out if isinstance(out, list) else [out])
            used = True
        ev["files"] += int(used)

    for probe in sorted(probes, key=lambda p: getattr(p, "build_order", 50)):
        if probe.name not in parsed:
            continue
        t0 = time.perf_counter()
        try:
            probe.build(parsed[probe.name], facts)
            ev["kinds"].append(probe.name)
        except Exception as exc:
            ev["errors"].append(f"{probe.name}: could not combine its evidence ({one_line(exc)})")
        timing[probe.name] = timing.get(probe.name, 0.0) + time.perf_counter() - t0

    _derive_job(facts, parsed)
    return facts, timing


def _parse_one(probe: Any, item: Item, errors: list[str], size: int | None = None) -> Parsed | list[Parsed] | None:
    """Parse one file; on any failure add a one-line error and return None. ``size`` is the one
    the dispatcher's sample saw (no second stat per file)."""
    try:
        size = item.path.stat().st_size if size is None else size
        if size > probe.max_bytes:
            raise EvidenceError(item.rel, f"{size / 2**20:.0f} MiB is over the {probe.name} limit "
                                f"of {probe.max_bytes / 2**20:.0f} MiB; skipped")
        return probe.parse(item.path, item.rel, item.hints)
    except EvidenceError as exc:
        errors.append(f"{item.rel}: {exc.what}")
    except RecursionError:
        errors.append(f"{item.rel}: nested too deeply to parse as {probe.name}")
    except Exception as exc:  # bad input must never take the diagnosis down
        errors.append(f"{item.rel}: could not parse as {probe.name} ({one_line(exc)})")
    return None


#: Names of files people write by hand: when no reader claims one, it is read as a ticket.
_NOTE_SUFFIXES = (".md", ".markdown", ".txt", ".rst")


def _written_note(sample: Sample) -> bool:
    """A text file no probe claims and that :func:`ticket.is_document` did not take (one long
    paragraph with the error inside a sentence, a traceback in single backticks, a pasted script
    longer than the prose) is still what someone wrote about the incident: splitting it like a
    ticket hands its machine lines to the probes and its sentences to the symptoms reader,
    instead of dropping the whole file. Project docs (README, LICENSE...) stay ignored."""
    name = sample.name.lower()
    return ticket.is_text_note(sample) and (name.endswith(_NOTE_SUFFIXES) or "." not in name)


def _pieces(item: Item, probes: tuple[Any, ...], scratch: ticket.Scratch, ev: dict[str, Any],
            note: bool = False) -> list[Item]:
    """A ticket's blocks and prose as items (``doctor.evidence.ticket``), each block already
    claimed by content; ``evidence.documents`` says which piece went where. ``note``: a written
    note no reader owns, whose words are the reporter's even when too short to read as prose."""
    pieces = ticket.expand(item.path, item.rel, item.hints, scratch, lambda s: getattr(_claim(s, probes), "name", None),
                           {p.name for p in probes if p.joins_pieces}, [p.name for p in probes if p.reads_prose],
                           any_words=note)
    ev.setdefault("documents", []).extend(f"{rel}: {kind or 'not recognized'}" for _, rel, kind, _ in pieces)
    return [Item(f, rel, kind, hints) for f, rel, kind, hints in pieces]


def _derive_job(facts: dict[str, Any], parsed: dict[str, list[Parsed]]) -> None:
    job = facts["job"]
    ranks = set(job.get("ranks_seen") or [])
    hosts = set(job.get("hosts") or [])
    votes: dict[int, dict[str, int]] = {}
    for records in parsed.values():
        for r in records:
            if r.rank is not None:
                ranks.add(r.rank)
            if r.host:
                hosts.add(r.host)
                if r.rank is not None:
                    votes.setdefault(r.rank, {}).setdefault(r.host, 0)
                    votes[r.rank][r.host] += 1
    ws = int(job.get("world_size") or 0)
    if ranks and ws < max(ranks) + 1 and ws:
        ws = max(ranks) + 1
    job["world_size"] = ws
    job["ranks_seen"] = sorted(ranks)
    job["n_ranks_seen"] = len(ranks)
    job["missing_ranks"] = sorted(set(range(ws)) - ranks) if ws and ranks else []
    job["hosts"] = sorted(hosts)
    job["rank_hosts"] = {str(r): max(v, key=lambda h: (v[h], h)) for r, v in sorted(votes.items())}
    job["observed_state"] = observed_state(facts)


def observed_state(facts: dict[str, Any]) -> str:
    """What the live evidence saw of the job: the first answer of the probes that watch it.

    "crashed" from any kind wins (no rank alive is final); otherwise the kinds are asked in
    their ``state_order`` (a sampling window sees more than two snapshots, so it answers first).
    """
    answers = []
    for probe in sorted(plugins.probes(), key=lambda p: (p.state_order, p.name)):
        try:
            state = probe.observed_state(facts)
        except Exception:  # a probe's opinion must never break the facts step
            continue
        if state:
            answers.append(state)
    if "crashed" in answers:
        return "crashed"
    return answers[0] if answers else ""


def schema_markdown() -> str:
    """The facts reference page (``mldoctor facts --schema``)."""
    lines = [
        "# mldoctor facts reference",
        "",
        f"Schema `{FACTS_SCHEMA}`. Rules see only these paths; a rule's `requires` names the ones",
        "it cannot do without. Generated from the code by `mldoctor facts --schema`.",
        "",
    ]
    groups: dict[str, list[tuple[str, str]]] = {}
    for path, doc in schema().items():
        groups.setdefault(path.split(".", 1)[0], []).append((path, doc))
    owners = {p.name: p for p in plugins.probes()}
    for ns in sorted(groups):
        lines.append(f"## `{ns}`")
        if ns in owners and owners[ns].collects:
            lines += ["", owners[ns].collects]
        lines += ["", "| path | type | meaning |", "| --- | --- | --- |"]
        for path, doc in groups[ns]:
            typ, _, meaning = doc.partition(": ")
            lines.append(f"| `{path}` | {typ} | {meaning} |")
        lines.append("")
    return "\n".join(lines)

