"""Did the job go on after an error? Progress counters and recovery messages after each error.

Why: a log's scariest line is not always what ended the job. Programs catch a CUDA OOM and go
on (fairseq's trainer, Lightning's and accelerate's batch-size finders), torchrun restarts a
failed worker group and the second attempt trains to the end, a warning is printed with a
stack. What tells those apart from a death is what the same stream says *after* the error:
training steps still counting up, or a recovery message followed by steps. An error followed
only by teardown, or at the end of the log, is not survived.

How it stays cheap: past the first few progress lines of a file, they are only looked at while
an error waits to be shown survived (:attr:`Survival.pending`). The scanner calls :meth:`Survival.progress` for each progress-signature hit
(``train_progress``, patterns/training.yaml) and :meth:`Survival.recovered` for each recovery
message (``recovered``, patterns/recovered.yaml), which only bump counters. At each error it
takes a snapshot of the counters (a tuple); at the end of the file each snapshot is compared with
the final counters. Nothing is kept per line, so a 2 GB log costs no memory.

Streams: a line prefixed with a rank (``[rank1]:``, ``[default1]:``) belongs to that rank's
stream, and an error on it is survived only by that rank's progress; an error without a prefix
(a launcher's line, a one-rank log) is survived by progress on any stream. Recovery messages
count for every stream (a worker-group restart restarts every rank).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PROGRESS_KIND = "train_progress"
RECOVERED_KIND = "recovered"
#: Progress lines needed after an error, with the counter moved, when no recovery message
#: followed it: one or two step lines can still be printed by a dying rank's other threads or
#: buffered output; three with a different counter are a loop that went on.
MIN_PROGRESS = 3
#: After a recovery message, one progress line (counter moved or not) shows the recovery worked.
MIN_AFTER_RECOVERY = 1

# A snapshot: (stream, progress lines on it, counter changes on it, all progress lines, counter
# changes on any stream, recovery messages so far)
Snap = tuple[Any, int, int, int, int, int]


@dataclass
class Survival:
    """Counters the scanner folds lines into, and the snapshots taken at errors."""

    n_stream: dict[Any, int] = field(default_factory=dict)
    val_stream: dict[Any, str | None] = field(default_factory=dict)
    moves_stream: dict[Any, int] = field(default_factory=dict)  # times its counter changed
    n_total: int = 0
    val_total: str | None = None
    moves_total: int = 0
    n_recovered: int = 0
    total_at_recovery: int = 0
    kind_last: dict[str, Snap] = field(default_factory=dict)   # kind -> snapshot at its last hit
    event_snaps: dict[int, Snap] = field(default_factory=dict)  # index in scan.events -> snapshot
    tb_snaps: dict[int, Snap] = field(default_factory=dict)     # index in scan.tracebacks
    exit_snaps: dict[int, Snap] = field(default_factory=dict)   # index in scan.exits
    #: per stream, the latest snapshot not yet shown survived: while any is waiting, progress
    #: lines are counted; otherwise (past the first few) they are skipped, which keeps a log of
    #: millions of step lines as cheap to scan as before
    pending: dict[Any, Snap] = field(default_factory=dict)

    def progress(self, stream: Any, counter: str) -> None:
        self.n_stream[stream] = self.n_stream.get(stream, 0) + 1
        prev = self.val_stream.get(stream)
        if prev is not None and prev != counter:  # a stream's first counter is no move yet
            self.moves_stream[stream] = self.moves_stream.get(stream, 0) + 1
        self.val_stream[stream] = counter
        self.n_total += 1
        if self.val_total is not None and self.val_total != counter:
            self.moves_total += 1
        self.val_total = counter
        for key in (stream, None):
            snap = self.pending.get(key)
            if snap is not None and self.survived(snap):
                del self.pending[key]

    def counts(self, stream: Any) -> bool:
        """Is a progress line on this stream wanted now (an error on it, or on no stream, is
        still waiting to be shown survived)?"""
        return stream in self.pending or None in self.pending

    def recovered(self) -> None:
        self.n_recovered += 1
        self.total_at_recovery = self.n_total

    def snapshot(self, stream: Any) -> Snap:
        """The counters now; the counter values seen so far are forgotten, so that only a change
        after this error counts as the loop moving on (lines skipped while nothing was pending
        left those values stale anyway)."""
        self.val_stream[stream] = None
        self.val_total = None
        snap = (stream, self.n_stream.get(stream, 0), self.moves_stream.get(stream, 0),
                self.n_total, self.moves_total, self.n_recovered)
        self.pending[stream] = snap
        return snap

    def kind_hit(self, kind: str, stream: Any) -> Snap:
        snap = self.snapshot(stream)
        self.kind_last[kind] = snap
        return snap

    def mark(self, index: int, snap: Snap) -> None:
        self.event_snaps[index] = snap

    def mark_traceback(self, index: int, stream: Any) -> None:
        self.tb_snaps[index] = self.snapshot(stream)

    def mark_exit(self, index: int) -> None:
        self.exit_snaps[index] = self.snapshot(None)  # the launcher's line: any rank's progress

    def survived(self, snap: Snap) -> bool:
        """Progress after the snapshot: MIN_PROGRESS lines with the counter moved since, or a
        recovery message and then MIN_AFTER_RECOVERY progress line."""
        stream, n_at, moves_at, total_at, total_moves_at, rec_at = snap
        if stream is None:
            after, moved = self.n_total - total_at, self.moves_total > total_moves_at
        else:
            after = self.n_stream.get(stream, 0) - n_at
            moved = self.moves_stream.get(stream, 0) > moves_at
        if after >= MIN_PROGRESS and moved:
            return True
        return (self.n_recovered > rec_at and self.n_total - self.total_at_recovery >= MIN_AFTER_RECOVERY
                and after >= MIN_AFTER_RECOVERY)

    def apply(self, events: list[dict[str, Any]], tracebacks: list[dict[str, Any]],
              exits: list[dict[str, Any]]) -> None:
        """Flag every error record the file went on after (``survived``)."""
        for records, snaps in ((events, self.event_snaps), (tracebacks, self.tb_snaps), (exits, self.exit_snaps)):
            for i, snap in snaps.items():
                if i < len(records) and self.survived(snap):
                    records[i]["survived"] = True

    def summary(self) -> dict[str, Any]:
        """Per file: progress lines, and the error kinds whose last hit was survived or not."""
        survived = sorted(k for k, s in self.kind_last.items() if self.survived(s))
        return {"progress_lines": self.n_total, "survived_kinds": survived,
                "unsurvived_kinds": sorted(set(self.kind_last) - set(survived))}
