"""The contract between the engine and an evidence kind (a probe package).

One evidence kind lives in one package of ``probes/`` and exposes a ``PROBE`` object, a subclass
of :class:`Probe`. The engine never knows kinds by name: it asks each registered probe whether a
file is its own (by content, with the file name only as a hint), lets it parse the file, and
lets it add its namespace to the facts. Everything else the engine and the live layer need to
know about a kind is declared here too, so that adding a kind never means editing them: whether
it runs in the first live round, the follow-ups rules may ask of it, whether and how it shows the
job's state, how it scrubs its own artifacts (sos's ``postproc``), and what it shows in a report
(``report_sections``, ``rank_states``: see :mod:`doctor.evidence.sections`), so that adding a kind
never means editing a renderer either.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

from doctor.evidence.sections import Section, SectionContext

SNIFF_BYTES = 64 * 1024

_RANK_RE = re.compile(r"(?:^|[^a-z])(?:rank|rk)[-_ ]?(\d{1,6})(?!\d)", re.I)
_DUMP_RANK_RE = re.compile(r"(?:^|[_-])dump_(\d{1,6})$")
_HOST_RE = re.compile(r"(?:^|[^a-z0-9])((?:node|host|gpu-?node|worker|compute)[-_]?\d{1,5}[a-z0-9-]*)", re.I)
_HOST_WORDS = ("node", "host", "worker", "compute")


@dataclass(frozen=True)
class Sample:
    """The start of a file, enough to recognize its kind without reading it all.

    The dispatcher reads it once and every probe's ``sniff`` sees the same object, so what
    several sniffers derive from it (the decoded text) is computed once and cached.
    """

    path: Path
    name: str
    raw: bytes
    size: int

    @cached_property
    def text(self) -> str:
        return self.raw.decode("utf-8", errors="replace")

    @property
    def is_binary(self) -> bool:
        # find within bounds: no 4 KiB slice copied for each of the sniffers that ask
        return self.raw.find(b"\x00", 0, 4096) != -1 and not self.raw.startswith(b"\x80")

    @classmethod
    def read(cls, path: Path) -> Sample:
        # os-level calls rather than open(): a buffered file object per file costs about as much
        # as the read itself when a folder holds 16k small dumps. Same bytes: read until
        # SNIFF_BYTES or end of file, as a buffered read does; same errors (a directory fails
        # with the path named, as open() names it).
        fd = os.open(path, _READ_FLAGS)
        try:
            try:
                raw = os.read(fd, SNIFF_BYTES)
                st = os.fstat(fd)
                # A short read is the whole file when the size says so; otherwise (a pipe-like
                # or procfs file reports 0, a growing file more) read on until the end or the cap.
                # Asking the size first spares one empty read per small file (16k dumps at scale).
                if len(raw) < SNIFF_BYTES and raw and not 0 < st.st_size <= len(raw):
                    parts = [raw]
                    got = len(raw)
                    while got < SNIFF_BYTES:
                        more = os.read(fd, SNIFF_BYTES - got)
                        if not more:
                            break
                        parts.append(more)
                        got += len(more)
                    raw = b"".join(parts)
                    st = os.fstat(fd)
            except IsADirectoryError as exc:
                raise IsADirectoryError(exc.errno, exc.strerror, path) from None
        finally:
            os.close(fd)
        if st.st_size <= len(raw):
            _whole[:] = [path, raw, st.st_size, st.st_mtime_ns]
        return cls(path=path, name=path.name, raw=raw, size=st.st_size)


#: Read-only, binary where the platform tells text from binary (Windows); os.open's descriptors
#: are not inherited by child processes, as open()'s are not.
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_BINARY", 0)

#: The last file a ``Sample`` held whole: its path, bytes, and the size and mtime it had then.
_whole: list[Any] = [None, b"", -1, -1]


def read_whole(path: Path) -> bytes:
    """All of a file's bytes, for a probe's ``parse``. When the dispatcher's sample just held the
    whole file and the file is unchanged since (same size and mtime), its bytes are reused: a
    folder of 16k small stack dumps then opens each file once, not twice."""
    last, raw, size, mtime = _whole
    # the dispatcher hands the same Path object to the sample and to the parse: identity first
    # (comparing two Paths builds their case-folded parts, once per file otherwise)
    if last is path or (last is not None and last == path):
        st = os.stat(path)
        if st.st_size == size and st.st_mtime_ns == mtime:
            return bytes(raw)
    return path.read_bytes()


@dataclass(frozen=True)
class Hints:
    """What the file's place and name tell about it; the manifest's word wins when present."""

    rank: int | None = None
    host: str | None = None
    pid: int | None = None

    @classmethod
    def from_path(cls, rel: str) -> Hints:
        """Take rank and host from names like ``rank3``, ``trace-node07-1.out``, ``_dump_12``."""
        rank = host = None
        parts = rel.replace("\\", "/").split("/")
        for part in reversed(parts):
            stem = part.rsplit(".", 1)[0] if "." in part else part
            if rank is None:
                m = _RANK_RE.search(stem) or _DUMP_RANK_RE.search(stem)
                if m:
                    rank = int(m.group(1))
            # _HOST_RE cannot match without one of its words (case-folded as re.I folds them: the
            # long s and the Kelvin sign fold to "s" and "k" both ways): one cheap test per name
            if host is None and any(w in stem.casefold() for w in _HOST_WORDS):
                m = _HOST_RE.search(stem)
                if m:
                    host = m.group(1)
        return cls(rank=rank, host=host)


@dataclass
class Parsed:
    """One parsed file: what it says, and where it came from."""

    kind: str
    path: str
    data: Any
    rank: int | None = None
    host: str | None = None
    notes: list[str] = field(default_factory=list)


class Probe:
    """Base class for an evidence kind.

    Subclasses set the class attributes and override ``sniff``/``parse``/``build``; ``collect``
    only where the kind can be gathered from a live process or host.
    """

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    #: What the probe collects, in one sentence (shown by ``mldoctor facts --schema``).
    collects: ClassVar[str] = ""
    #: Higher runs first when several probes could claim a file.
    priority: ClassVar[int] = 50
    #: Files above this size are not parsed whole; streaming kinds raise it.
    max_bytes: ClassVar[int] = 256 * 1024 * 1024
    #: Kinds whose files this probe's optional ``also_sniff(sample)`` is asked about besides
    #: their owner (a trainer log is the logs kind's and carries loss for metrics too); files
    #: no kind claims are always asked about. ``None`` asks about every file. Why declare it: the
    #: dispatcher then never runs a co-reader's check on files that cannot be its (16,384 stack
    #: dumps each checked for metric lines cost more than parsing them).
    also_reads: ClassVar[frozenset[str] | None] = None
    #: Order in which ``build`` runs (lower first): env builds early so world size is known.
    build_order: ClassVar[int] = 50
    #: Documented fact paths this probe writes: ``"env.vars": "map<string,string>: ..."``.
    facts_schema: ClassVar[dict[str, str]] = {}
    #: Glob patterns (relative to the repository root) naming captured files of this kind. The
    #: conformance test (``tests/test_conformance.py``) checks that the dispatcher hands each of
    #: them to this probe and that no probe ahead of it in dispatch order claims it, so a new or
    #: loosened ``sniff`` cannot quietly take another kind's evidence. Empty for a third-party
    #: probe that ships no fixtures.
    fixtures: ClassVar[tuple[str, ...]] = ()
    #: Adjacent blocks of one ticket that this kind claims are read as one file (a log pasted
    #: over two fences is one log); kinds whose file is one process's dump keep them apart.
    joins_pieces: ClassVar[bool] = False
    #: Reads the prose of a ticket or paste (``doctor.evidence.ticket``): the sentences around
    #: the blocks, handed over as a text file with the block lines blanked.
    reads_prose: ClassVar[bool] = False

    # -- live collection ------------------------------------------------------------------------
    #: Runs in the first live round, before any rule has asked for it.
    live_first_round: ClassVar[bool] = False
    #: Takes part in the repeated snapshot rounds that tell hung from slow (collect() then gets
    #: a ``snapshot`` option: 0, 1, 2, ...).
    live_snapshots: ClassVar[bool] = False
    #: Symptoms (``--symptom``) for which this probe runs right after the first snapshots even
    #: though no rule asked yet (the sampling window for ``slow``).
    live_for_symptoms: ClassVar[tuple[str, ...]] = ()
    #: ``collect`` runs for the ``--duration`` window before it answers (a sampling profile), so
    #: its timeout is the window plus the usual probe time.
    runs_for_duration: ClassVar[bool] = False
    #: Follow-up names rules and playbooks may ask for, and the ``collect`` options each means.
    follow_ups: ClassVar[dict[str, dict[str, Any]]] = {}

    # -- the job's state ------------------------------------------------------------------------
    #: This kind can show what state a job is in (hung, slow, crashed), not only its settings;
    #: with no rule fired and no such kind in the evidence, the verdict is "unknown", not healthy.
    shows_state: ClassVar[bool] = False
    #: Order in which probes are asked for ``observed_state`` (lower first; first answer wins).
    state_order: ClassVar[int] = 50
    #: What this kind would settle about a stuck or failing job, and the command that gathers
    #: it, in one sentence ("every rank's Python stack: py-spy dump --pid PID on each rank").
    #: With no rule fired on partial evidence, the verdict names the absent kinds through this
    #: rather than just "nothing found"; the engine never names a kind itself.
    settles: ClassVar[str] = ""

    def sniff(self, sample: Sample) -> bool:
        """Is this file evidence of my kind? Decide from content; names are only hints."""
        return False

    def parse(self, path: Path, rel: str, hints: Hints) -> Parsed | list[Parsed]:
        """Read one file. Raise ``EvidenceError`` with a short reason when it is unusable."""
        raise NotImplementedError

    def build(self, parsed: list[Parsed], facts: dict[str, Any]) -> None:
        """Add this kind's namespace to the facts from all of its parsed files."""
        raise NotImplementedError

    def collect(self, ctx: Any) -> Any:
        """Gather this evidence from a live target; ``None`` means not applicable here."""
        return None

    @classmethod
    def collects_live(cls) -> bool:
        """Whether this kind overrides ``collect`` (others are read from files only)."""
        return cls.collect is not Probe.collect

    def observed_state(self, facts: dict[str, Any]) -> str:
        """What this kind saw of the job live: ``hung``, ``progressing``, ``crashed``, or ``""``
        when it has no opinion. Only kinds that watch the running job (snapshots, sampling
        windows, process tables) answer; the engine takes the first answer by ``state_order``."""
        return ""

    def wants_another_look(self, facts: dict[str, Any]) -> bool:
        """Live: is this kind's evidence ambiguous in a way a later snapshot would settle (some
        ranks frozen, some moving)? The loop then takes another snapshot after a longer gap."""
        return False

    def unexplained_state(self, facts: dict[str, Any]) -> dict[str, str] | None:
        """With no rule fired: does this kind's evidence still show the job is not healthy?
        Return ``{"state": ..., "what": ...}`` (e.g. a log with a failure no rule names), or
        ``None``. Keeps "errors in the evidence are never a healthy verdict" out of the engine."""
        return None

    def coverage(self) -> list[dict[str, Any]]:
        """How much of the upstream message families this kind's pattern library recognizes:
        one row per family (``family``, ``templates``, ``fault_templates``, ``covered``,
        ``coverage``, ``uncovered``...). Kinds without a pattern library return no rows; the
        ``mldoctor rules coverage`` command reads every kind through here, never by name."""
        return []

    def scrub(self, data: bytes) -> bytes:
        """Kind-specific scrubbing applied before an artifact of this kind is stored or copied
        (sos's ``postproc``); the generic secret scrubber runs after it on every artifact."""
        return data

    # -- the report -----------------------------------------------------------------------------
    #: Order in which probes are asked where each rank is (lower first; first answer wins).
    rank_state_order: ClassVar[int] = 50

    def report_sections(self, facts: dict[str, Any], context: SectionContext) -> list[Section]:
        """The report sections this kind contributes (a table, groups of ranks, series...), built
        from its own facts namespace; renderers draw them by presentation type only, so adding a
        kind never means editing a renderer. ``context`` carries what it may highlight (culprit
        ranks, GPUs findings name)."""
        return []

    def rank_states(self, facts: dict[str, Any]) -> dict[int, str]:
        """Where each rank is, as this kind saw it (``collective: barrier``, ``sleeping``), for the
        rank grid. The default reads ``state``/``where``/``phase``/``status`` (and ``op``) from the
        namespace's ``by_rank`` map; kinds with a richer picture (stack groups) override it."""
        out: dict[int, str] = {}
        ns = facts.get(self.name)
        by_rank = ns.get("by_rank") if isinstance(ns, dict) else None
        for rank_s, entry in (by_rank.items() if isinstance(by_rank, dict) else ()):
            if not isinstance(entry, dict) or not str(rank_s).lstrip("-").isdigit():
                continue
            for key in ("state", "where", "phase", "status"):
                value = entry.get(key)
                if isinstance(value, str) and value:
                    out[int(rank_s)] = where_label(self.describe_state(value), entry.get("op"))
                    break
        return out

    def describe_state(self, value: str) -> str:
        """A rank state word as people read it (procs turns ``D`` into ``uninterruptible (D)``)."""
        return value

    def rank_details(self, facts: dict[str, Any]) -> dict[str, dict[int, str]]:
        """Extra per-rank columns for the TUI's rank table: ``{column: {rank: text}}``. A column
        is returned even when empty, so the table keeps its shape whatever the evidence."""
        return {}

    def job_label(self, facts: dict[str, Any]) -> str:
        """A job identifier this kind's evidence names (a SLURM job id), for report file names."""
        return ""

    def host_names(self, facts: dict[str, Any]) -> list[str]:
        """Host names this kind's facts mention, so the report scrubber can alias them."""
        return []


def where_label(state: str, op: Any) -> str:
    """``collective: barrier``: a state, and what in it when known."""
    return f"{state}: {op}" if isinstance(op, str) and op and op != state else state



#: Follow-up names that the live loop itself answers (another stack/process snapshot after a
#: longer gap); every other follow-up name belongs to some probe's ``follow_ups``.
LOOP_FOLLOW_UPS = ("snapshots", "stacks_snapshot")


def set_world_size(facts: dict[str, Any], value: int | None) -> None:
    """Probes call this when their evidence names the world size; the largest credible wins."""
    if value and value > 0:
        facts["job"]["world_size"] = max(int(facts["job"].get("world_size") or 0), int(value))


def one_line(exc: BaseException) -> str:
    """A message fit for one line of a report."""
    msg = str(exc).strip().splitlines()
    return (msg[0] if msg else type(exc).__name__)[:300]


@dataclass
class RankProcess:
    """One process of the job as seen on this host (a rank, or a launcher/worker for context)."""

    pid: int
    rank: int | None
    local_rank: int | None = None
    world_size: int | None = None
    host: str = ""
    cmdline: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # allowlisted only
    role: str = "rank"  # rank | launcher | worker
    parent: int | None = None


class ProbeSkipped(Exception):
    """The probe does not apply here (no GPU, no NVML, nothing to read); the reason is kept."""


class ProbeFailed(Exception):
    """The probe applied but could not do its work (permission, timeout); the reason is kept."""


@dataclass
class CollectContext:
    """What a live probe gets: the job's processes on this host and a place to write artifacts.

    ``add`` writes under ``hosts/<host>/<probe>/`` in the bundle, scrubbing text, and records the
    checksum, so probes never touch the bundle layout themselves.
    """

    bundle: Any  # doctor.evidence.bundle.Bundle
    host: str
    procs: list[RankProcess]
    options: dict[str, Any] = field(default_factory=dict)
    timeout: float = 10.0
    probe_name: str = ""
    round: int = 0  # 0 for the first pass; follow-ups count up
    written: int = 0  # artifacts this probe run wrote

    @property
    def ranks(self) -> list[RankProcess]:
        wanted = self.options.get("ranks")
        out = [p for p in self.procs if p.role == "rank"]
        if wanted:
            out = [p for p in out if p.rank in wanted]
        return out

    def add(self, name: str, data: bytes | str, *, rank: int | None = None, pid: int | None = None,
            text: bool = True, meta: dict[str, Any] | None = None, kind: str | None = None) -> Any:
        rel = f"hosts/{self.host}/{kind or self.probe_name}/{name}"
        self.written += 1
        return self.bundle.add_artifact(rel, data, kind or self.probe_name, host=self.host, rank=rank,
                                        pid=pid, text=text, meta=meta)
