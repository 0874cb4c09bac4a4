"""Thread stacks of every rank: py-spy dumps (text, ``--json``, ``--native``, ``--locals``,
``--subprocesses``), Python faulthandler dumps and gdb ``thread apply all bt`` output, and the
looser shapes pasted into issue threads: a bare gdb ``bt`` of one thread, gdb ``py-bt``, py-spy
text without thread ids, traceback-style stacks (``traceback.format_stack``) and IDE call stacks.

Where each rank's main thread waits is the most direct evidence of a hang: peers in a collective,
the odd rank in its DataLoader, a checkpoint write, a lock. ``build`` classifies every thread
(``doctor.probes.stacks.classify``), groups ranks STAT-style by stack signature, and names the majority and
the outliers, so rules read a handful of groups instead of thousands of ranks.

Live, ``collect`` runs ``py-spy dump --json`` on every rank in parallel (py-spy ptraces and
pauses the process for the dump's duration, measured as ``pause_s``; it never signals it).
Local variables (``--locals``) are never kept: they are where secrets live.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar

from doctor.probes.stacks import live, report
from doctor.probes.stacks.analyze import analyze
from doctor.probes.stacks.formats import (
    JSON_START,
    SNIFF_FH,
    SNIFF_GDB,
    SNIFF_GDB_BARE,
    SNIFF_PYSPY,
    SNIFF_PYSPY_FRAME,
    SNIFF_TB,
    has_interrupted,
    ide_frames,
    interrupted,
    is_server_stacks,
    mostly_dump,
    parse_json,
    parse_text,
    search_lines,
    tb_is_exception,
)
from doctor.probes.stacks.live import classify_failure, dump_pid, find_pyspy
from doctor.probes.stacks.model import DumpError, ProcDump, ThreadSum
from doctor.probes.stacks.summary import summarize, to_dump

from doctor.evidence.contract import Hints, Parsed, Probe, Sample, read_whole
from doctor.evidence.errors import EvidenceError
from doctor.evidence.sections import Section, SectionContext

#: Names other evidence kinds and the tests read from the probe's package.
__all__ = ["PROBE", "DumpError", "ProcDump", "StacksProbe", "ThreadSum", "analyze", "classify_failure",
           "dump_pid", "find_pyspy", "parse_json", "parse_text", "summarize", "tb_is_exception"]

_SNAP = re.compile(r"snap(?:shot)?[-_]?(\d{1,4})(?!\d)", re.I)
#: a line that is a bare ``KeyboardInterrupt`` (after a launcher prefix): the end of a Ctrl-C traceback
_KBI_LINE = re.compile(r"(?m)^(?:\[[^\]\n]{1,40}\]:\s?){0,3}\s*KeyboardInterrupt\s*$")
#: a traceback frame line, also behind launcher/excepthook prefixes (``[rank3]:   File "...", line
#: N, in f``: torch 2.2+ prints uncaught tracebacks of torchrun workers that way), so a Ctrl-C
#: traceback pasted from such a log is sniffed like a bare one
_TB_FRAME_PREFIXED = re.compile(r'(?m)^(?:\[[^\]\n]{1,40}\]:\s?){0,3}[ \t]*File:? "[^"\n]+", line \d+, in \S')
#: ``pyspy-worker0-of-rank3.txt``, ``pyspy-worker4242-of-rank3-snap0.json``: a rank's child process
_WORKER_NAME = re.compile(r"worker\d*[-_]of[-_]", re.I)


class StacksProbe(Probe):
    name: ClassVar[str] = "stacks"
    title: ClassVar[str] = "Thread stacks"
    collects: ClassVar[str] = (
        "Every rank's thread stacks (py-spy dump --json, optionally --native; DataLoader workers "
        "on request) with the pause each dump caused; also reads saved py-spy text/JSON, "
        "faulthandler and gdb dumps. Local variables are never kept."
    )
    priority: ClassVar[int] = 60
    build_order: ClassVar[int] = 50
    live_first_round: ClassVar[bool] = True
    live_snapshots: ClassVar[bool] = True
    follow_ups: ClassVar[dict[str, dict[str, Any]]] = {
        "stacks": {}, "stacks_native": {"native": True}, "stacks_workers": {"workers": True}}
    shows_state: ClassVar[bool] = True
    settles: ClassVar[str] = ("every rank's stack tells where each one is (in a collective, data loading, I/O, a lock, "
                             "a CUDA wait): py-spy dump --pid PID on each rank, twice 10 s apart "
                             "(--native for C frames), or mldoctor diagnose --pid")
    state_order: ClassVar[int] = 30
    max_bytes: ClassVar[int] = 64 * 1024 * 1024
    fixtures: ClassVar[tuple[str, ...]] = (
        "tests/fixtures/evidence/*/pyspy-*",
        "tests/fixtures/stacks/*/pyspy-*",
        "tests/fixtures/stacks/*/gdb-*.txt",
        "tests/fixtures/stacks/faulthandler_tee*/torchrun.log",
        "tests/fixtures/stacks/public_formats/*.txt",
        "tests/fixtures/slow/*/bundle/hosts/*/stacks/pyspy-*",
    )
    facts_schema: ClassVar[dict[str, str]] = {
        "stacks.n_ranks": "int: ranks with a main-thread stack (latest snapshot)",
        "stacks.n_members": "int: processes analysed as ranks, including dumps whose rank is unknown",
        "stacks.n_unranked": "int: rank processes whose rank could not be told (no prefix, RANK= line, manifest or file name)",
        "stacks.formats": "list<string>: dump formats read: pyspy_text, pyspy_json, faulthandler, gdb (thread apply all bt, or a bare bt), gdb_pybt (gdb py-bt), traceback (traceback-style Python stacks: format_stack/print_stack), keyboard_interrupt (the main thread's traceback at a Ctrl-C: where it was when someone interrupted a stuck job), ide (an IDE's call-stack copy)",
        "stacks.native": "bool: some dump has native (C/C++) frames (py-spy --native, gdb)",
        "stacks.snapshots": "int: distinct snapshots (a file named *snap<k>*, or repeated dumps of one process in a file)",
        "stacks.states": "list<string>: every thread state the classifier knows (see probes/stacks/classify.py STATES)",
        "stacks.state_counts": "map<string,int>: main threads per state (every state present, 0 when none)",
        "stacks.state_ranks": "map<string,list<int>>: ranks per main-thread state (only states that occur)",
        "stacks.waiting_share": "float: share of main threads waiting on their peers: in a collective, or in a GPU wait (with NCCL a collective is asynchronous, so a rank whose peer is missing blocks later in .item()/synchronize rather than in the Python collective call)",
        "stacks.majority_state": "string: the state most main threads are in (ties: collective, init, dataloader_wait, io, lock_wait, cuda_sync, ... in that order)",
        "stacks.majority_share": "float: share of main threads in majority_state (0-1)",
        "stacks.majority_op": "string: the most common op among main threads in a collective ('' when none)",
        "stacks.majority_group": "string: id of the largest stack group (ByteRobust: the dominant group is presumed healthy)",
        "stacks.outliers": "list<int>: ranks not in the largest stack group (the suspects)",
        "stacks.groups": "list<map>: STAT-style equivalence classes of main-thread stacks (function+file, no lines), largest first, at most 48 (the rest merged per state)",
        "stacks.groups[].id": "string: group id (g0 is the largest)",
        "stacks.groups[].state": "string: the members' state",
        "stacks.groups[].op": "string: what in that state: collective op (all_reduce, barrier, ...), io kind (torch.save, socket, ...), lock kind, dataloader phase",
        "stacks.groups[].ranks": "list<int>: member ranks",
        "stacks.groups[].size": "int: members, ranked or not",
        "stacks.groups[].share": "float: size / stacks.n_members",
        "stacks.groups[].majority": "bool: this is the largest group",
        "stacks.groups[].top": "string: innermost Python frame with line of the lowest member, 'func (file:line)'",
        "stacks.groups[].anchor": "string: the frame that decided the state, with line",
        "stacks.groups[].site": "string: the innermost frame of the user's own code (where it called into the library)",
        "stacks.groups[].frames": "list<string>: the first 8 frames of the signature, 'func (file)'",
        "stacks.groups[].n_active": "int: members whose main thread was running (py-spy active) rather than blocked",
        "stacks.groups[].active": "bool: most members were running (a busy rank, not a blocked one)",
        "stacks.groups[].native": "bool: some member's dump has native frames",
        "stacks.groups[].n_frozen": "int: members whose stack was identical in all of 2+ snapshots",
        "stacks.groups[].workers_blocked": "int: members with DataLoader worker evidence showing a blocked worker and no busy one",
        "stacks.groups[].workers_idle": "int: members whose DataLoader workers were all waiting in their loop (the batch is in transit, not stuck)",
        "stacks.groups[].unranked": "list<string>: 'host:pid' of members whose rank is unknown (at most 16)",
        "stacks.by_rank": "map<string,map>: per rank: state, op, top, group, active, frozen, workers_blocked, and pin_memory ('state (op) at frame' of the DataLoader pin-memory thread, when there is one)",
        "stacks.by_rank[].state": "string: state of the rank's main thread (collective, dataloader_wait, io, ...)",
        "stacks.by_rank[].op": "string: what in that state (collective op, io kind, lock kind, dataloader phase), or ''",
        "stacks.by_rank[].top": "string: innermost Python frame with line, 'func (file:line)'",
        "stacks.by_rank[].group": "string: id of its stack group (stacks.groups[].id)",
        "stacks.by_rank[].active": "bool: py-spy saw the main thread running rather than blocked",
        "stacks.by_rank[].frozen": "bool: its stack was identical in all of 2+ snapshots",
        "stacks.by_rank[].workers_blocked": "bool: its DataLoader workers show a blocked one and no busy one",
        "stacks.by_rank[].pin_memory": "string: 'state (op) at frame' of its DataLoader pin-memory thread, when there is one",
        "stacks.collective_splits": "list<map>: main threads in a typed, non-p2p collective, split by (op, call site); more than one entry means ranks wait in different collectives",
        "stacks.collective_splits[].key": "string: op@site",
        "stacks.collective_splits[].op": "string: the collective op",
        "stacks.collective_splits[].site": "string: the user's call site with line",
        "stacks.collective_splits[].ranks": "list<int>: ranks in it",
        "stacks.collective_splits[].size": "int: members",
        "stacks.collective_splits[].majority": "bool: the largest split",
        "stacks.frozen": "list<int>: ranks whose main stack (frames and lines) was identical across 2+ snapshots",
        "stacks.moving": "list<int>: ranks whose main stack changed between snapshots",
        "stacks.progress": "string: frozen (most ranks with 2+ snapshots unchanged: hung, or very slow), moving (most changed: progressing), unknown (one snapshot)",
        "stacks.lock_holders": "list<map>: for ranks whose main thread waits on a lock or the GIL: the other threads of that process that could hold it (running, owning the GIL, or blocked outside a plain wait; for the GIL only its owner); outlier ranks first, at most 64",
        "stacks.lock_holders[].rank": "int: the rank",
        "stacks.lock_holders[].thread": "string: thread name (or id)",
        "stacks.lock_holders[].state": "string: that thread's state",
        "stacks.lock_holders[].op": "string: that thread's op",
        "stacks.lock_holders[].top": "string: that thread's innermost frame",
        "stacks.lock_holders[].active": "bool: the thread was running",
        "stacks.lock_holders[].gil": "bool: the thread held the GIL",
        "stacks.workers": "map<string,map>: per rank with DataLoader worker dumps: n, waiting, busy, blocked, top (a blocked worker's innermost frame)",
        "stacks.workers[].n": "int: DataLoader worker dumps of the rank",
        "stacks.workers[].waiting": "int: workers idle in their loop, waiting for an index",
        "stacks.workers[].busy": "int: workers fetching a batch",
        "stacks.workers[].blocked": "int: workers stuck outside their loop (a lock, I/O, a dead peer)",
        "stacks.workers[].top": "string: innermost frame of a blocked worker, '' when none",
        "stacks.workers_blocked": "list<int>: ranks with a blocked DataLoader worker and no busy one",
        "stacks.missing_ranks": "list<int>: ranks below job.world_size with no stack dump (known only when world_size is)",
        "stacks.gone_ranks": "list<int>: ranks whose live dump failed because the process no longer exists",
        "stacks.dump_errors": "list<map>: live dumps that failed: rank, kind (gone|permission|unsupported|timeout|error), reason",
        "stacks.dump_errors[].rank": "int: the rank (-1 when unknown)",
        "stacks.dump_errors[].kind": "string: gone | permission | unsupported | timeout | error",
        "stacks.dump_errors[].reason": "string: py-spy's message, shortened",
        "stacks.notes": "list<string>: parsing remarks (truncated files, duplicate dumps, ranks from local prefixes)",
    }

    # -- recognize ----------------------------------------------------------------------------


    def wants_another_look(self, facts: dict[str, Any]) -> bool:
        """Some ranks frozen and some moving: a slow step or a real hang; another look tells.

        A rank whose stack repeated but whose main thread woke between the snapshots (the procs
        readings) is progressing too, as in ``observed_state``: when that leaves no frozen rank,
        progress is proven and further snapshots would only cost time (a healthy job's verdict)."""
        st = facts.get("stacks") or {}
        frozen = set(st.get("frozen") or []) - set((facts.get("procs") or {}).get("main_waking_ranks") or [])
        return bool(frozen) and bool(st.get("moving"))

    def observed_state(self, facts: dict[str, Any]) -> str:
        """Hung or progressing from two or more snapshots.

        A rank is frozen when its main-thread stack (with line numbers) is identical in every
        snapshot and, when /proc readings exist, its main thread did not wake up between them (a
        training loop in steady state can show the same line twice; a blocked thread never
        wakes). The job is hung when at least half of the ranks seen are frozen.
        """
        st = facts.get("stacks") or {}
        if int(st.get("snapshots") or 0) < 2:
            return ""
        n = int(st.get("n_ranks") or 0)
        if not n:
            return ""
        procs = facts.get("procs") or {}
        frozen = set(st.get("frozen") or []) - set(procs.get("main_waking_ranks") or [])
        return "hung" if len(frozen) / n >= 0.5 else "progressing"

    #: torch's debug server dumps and pages belong to the debug_server kind (who answered); the
    #: stacks inside them, one section per rank, are read here too so every stack rule applies.
    #: A log (the logs kind's file) that holds a traceback ending in KeyboardInterrupt is read too:
    #: a Ctrl-C on a stuck job leaves each rank's main-thread stack in the launcher's output.
    also_reads: ClassVar[frozenset[str] | None] = frozenset({"debug_server", "logs"})

    def also_sniff(self, sample: Sample) -> bool:
        if sample.is_binary:
            return False
        text = sample.text
        return is_server_stacks(text) or ("KeyboardInterrupt" in text and bool(_KBI_LINE.search(text))
                                          and bool(_TB_FRAME_PREFIXED.search(text)) and has_interrupted(text))

    def sniff(self, sample: Sample) -> bool:
        text = sample.text
        if JSON_START.match(text):
            head = text[:65536]
            return ('"frames"' in head and ('"owns_gil"' in head or '"os_thread_id"' in head)) \
                or '"mldoctor_stack_error"' in head[:4096]
        pyspy = search_lines(SNIFF_PYSPY, text, "Thread ") and (
            search_lines(SNIFF_PYSPY_FRAME, text, "    ") or text.find("Process ", 0, 4096) != -1)
        if pyspy or SNIFF_FH.search(text) or SNIFF_GDB.search(text) or SNIFF_GDB_BARE.search(text):
            return mostly_dump(text.splitlines()[:2000])
        # looser shapes pasted into issue threads: traceback-style Python stacks (py-bt,
        # format_stack) and IDE call stacks; an exception traceback is a log's crash report
        lines = text.splitlines()[:2000]
        if len(SNIFF_TB.findall(text)) >= 2 and (not tb_is_exception(lines) or interrupted(lines)):
            return mostly_dump(lines)
        if ide_frames(lines) >= 2:
            return mostly_dump(lines)
        return False

    # -- parse --------------------------------------------------------------------------------

    def parse(self, path: Path, rel: str, hints: Hints) -> list[Parsed]:
        raw = read_whole(path)  # the dispatcher's sample when it held the whole dump
        if raw.find(b"\x00", 0, 4096) != -1:
            raise EvidenceError(rel, "binary data, not a stack dump")
        text = raw.decode("utf-8", errors="replace")
        snap_m = _SNAP.search(rel.rsplit("/", 1)[-1])
        snapshot = int(snap_m.group(1)) if snap_m else 0
        errors: list[DumpError] = []
        if JSON_START.match(text):
            procs, errors, notes = parse_json(text)
        else:
            procs, notes = parse_text(text)
        if not procs and not errors:
            raise EvidenceError(rel, "no thread stacks found (expected py-spy, faulthandler, gdb or traceback-style output)")
        dumps = [to_dump(p, snapshot, rel) for p in procs]
        if _WORKER_NAME.search(rel.rsplit("/", 1)[-1]):
            # a file of a rank's child process: never the rank itself, even when its stack does
            # not show a DataLoader worker loop (then it is some other child, left out)
            for d in dumps:
                if d.role == "rank":
                    d.role = "child"
        self._assign_ranks(dumps, hints, notes)
        out: list[Parsed] = []
        for d in dumps:
            d.host = hints.host
            r = d.rank if d.role in ("rank", "worker", "child") else None
            out.append(Parsed(self.name, rel, d, r, hints.host, list(notes)))
        for e in errors:
            if e.rank is None:
                e.rank = hints.rank
            e.snapshot = e.snapshot or snapshot
            out.append(Parsed(self.name, rel, e, e.rank, hints.host, list(notes)))
        return out

    @staticmethod
    def _assign_ranks(dumps: list[ProcDump], hints: Hints, notes: list[str]) -> None:
        """Content first (prefixes, RANK= lines), then the manifest's pid, then the file name;
        DataLoader workers take their parent's rank."""
        if hints.pid is not None and hints.rank is not None:
            for d in dumps:
                if d.pid == hints.pid and d.rank is None:
                    d.rank, d.rank_source = hints.rank, "manifest"
        ranks = [d for d in dumps if d.role == "rank"]
        by_pid = {d.pid: d for d in ranks if d.pid is not None}
        unranked = [d for d in ranks if d.rank is None]
        distinct_pids = {d.pid for d in ranks}
        if hints.rank is not None and unranked and len(distinct_pids) == 1:
            for d in unranked:
                d.rank, d.rank_source = hints.rank, "file name"
        for d in ranks:
            if d.rank is None and d.local_rank is not None:
                d.rank, d.rank_source = d.local_rank, "local prefix"
                notes.append(f"rank {d.rank} taken from a local-rank launcher prefix (single node assumed)")
        for d in dumps:
            if d.role in ("worker", "child") and d.rank is None:
                parent = by_pid.get(d.parent)
                if parent is not None and parent.rank is not None:
                    d.rank, d.rank_source = parent.rank, "parent"
                elif hints.rank is not None and not ranks:
                    d.rank, d.rank_source = hints.rank, "file name"

    # -- combine ------------------------------------------------------------------------------

    def build(self, parsed: list[Parsed], facts: dict[str, Any]) -> None:
        dumps = [p.data for p in parsed if isinstance(p.data, ProcDump)]
        errs = [p.data for p in parsed if isinstance(p.data, DumpError)]
        notes: list[str] = []
        for p in parsed:
            for n in p.notes:
                line = f"{p.path}: {n}"
                if line not in notes and len(notes) < 20:
                    notes.append(line)
        facts["stacks"] = analyze(dumps, errs, int((facts.get("job") or {}).get("world_size") or 0), notes)

    # -- live ---------------------------------------------------------------------------------
    def collect(self, ctx: Any) -> dict[str, Any]:
        return live.collect(ctx)

    # -- the report ---------------------------------------------------------------------------
    rank_state_order: ClassVar[int] = 10  # a stack group says most precisely where a rank is

    def report_sections(self, facts: dict[str, Any], context: SectionContext) -> list[Section]:
        return report.sections(facts, context)

    def rank_states(self, facts: dict[str, Any]) -> dict[int, str]:
        out = report.rank_states(facts)
        for rank, state in super().rank_states(facts).items():
            out.setdefault(rank, state)
        return out

    def rank_details(self, facts: dict[str, Any]) -> dict[str, dict[int, str]]:
        return report.rank_details(facts)


PROBE = StacksProbe()
