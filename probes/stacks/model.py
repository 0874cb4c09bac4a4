"""What a dump holds on its way through the probe: the raw threads a format reader fills, and
the classified summaries the cross-rank analysis groups. Kept apart so the readers, the
analysis and the probe share them without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ThreadSum:
    """One thread, classified. ``sig`` groups stacks (function+file, no lines); ``exact`` (with
    lines) tells a frozen stack from a moving one across snapshots."""

    tid: str
    name: str
    active: bool | None
    gil: bool | None
    state: str
    op: str
    top: str
    anchor: str
    site: str
    sig: str
    exact: str
    frames: tuple[str, ...]
    worker: str = ""  # for a DataLoader worker's main thread: waiting | busy | blocked
    native: bool = False  # the stack has native frames
    role: str = "rank"  # the process's role if this is its main thread (classify.role_of)


@dataclass(slots=True)
class ProcDump:
    """One process's dump: its main thread and the others, with where the dump came from."""

    pid: int | None
    rank: int | None
    role: str  # rank | worker (DataLoader) | child (other child of a rank) | launcher | helper
    fmt: str  # pyspy_text | pyspy_json | faulthandler | gdb | gdb_pybt | traceback | keyboard_interrupt | ide
    native: bool
    snapshot: int
    main: ThreadSum | None
    others: list[ThreadSum]
    parent: int | None = None
    host: str | None = None
    local_rank: int | None = None
    rank_source: str = ""
    truncated: bool = False
    path: str = ""


@dataclass(slots=True)
class DumpError:
    """A rank whose live dump failed (written by ``collect``): the failure is itself evidence."""

    rank: int | None
    pid: int | None
    kind: str  # gone | permission | unsupported | timeout | error
    reason: str
    snapshot: int = 0


@dataclass(slots=True)
class RawThread:
    tid: str
    name: str = ""
    active: bool | None = None
    gil: bool | None = None
    current: bool = False
    frames: list[tuple[str, str, int, bool]] = field(default_factory=list)


@dataclass(slots=True)
class RawProc:
    pid: int | None
    fmt: str
    threads: list[RawThread] = field(default_factory=list)
    parent: int | None = None
    rank: int | None = None
    rank_source: str = ""
    local_rank: int | None = None
    seq: int = 0  # n-th dump of the same process in this file (a snapshot)
    truncated: bool = False
