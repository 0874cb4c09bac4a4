"""The contract between the engine and an evidence kind (a probe package).

One evidence kind lives in one package of ``probes/`` and exposes a ``PROBE`` object, a subclass
of :class:`Probe`. The engine never knows kinds by name: it asks each registered probe whether a
file is its own (by content, with the file name only as a hint), lets it parse the file, and
lets it add its namespace to the facts. Everything else the engine and the live layer need to
know about a kind is declared here too, so that adding a kind never means editing them: whether
it runs in the first live round, the follow-ups rules may ask of it, whether and how it shows the
job's state, how it scrubs its own artifacts (sos's ``postproc``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

SNIFF_BYTES = 64 * 1024

_RANK_RE = re.compile(r"(?:^|[^a-z])(?:rank|rk)[-_ ]?(\d{1,6})(?!\d)", re.I)
_DUMP_RANK_RE = re.compile(r"(?:^|[_-])dump_(\d{1,6})$")
_HOST_RE = re.compile(r"(?:^|[^a-z0-9])((?:node|host|gpu-?node|worker|compute)[-_]?\d{1,5}[a-z0-9-]*)", re.I)


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
        return b"\x00" in self.raw[:4096] and not self.raw.startswith(b"\x80")

    @classmethod
    def read(cls, path: Path) -> Sample:
        with open(path, "rb") as fh:
            raw = fh.read(SNIFF_BYTES)
        return cls(path=path, name=path.name, raw=raw, size=path.stat().st_size)


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
            if host is None:
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
    #: Order in which ``build`` runs (lower first): env builds early so world size is known.
    build_order: ClassVar[int] = 50
    #: Documented fact paths this probe writes: ``"env.vars": "map<string,string>: ..."``.
    facts_schema: ClassVar[dict[str, str]] = {}

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

    def scrub(self, data: bytes) -> bytes:
        """Kind-specific scrubbing applied before an artifact of this kind is stored or copied
        (sos's ``postproc``); the generic secret scrubber runs after it on every artifact."""
        return data



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
