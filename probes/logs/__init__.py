"""Job logs: launcher output (torchrun, SLURM), per-rank stdout/stderr, NCCL_DEBUG output,
kernel logs (dmesg/journal). Each file is scanned line by line against the signature library
(``patterns/*.yaml``, loaded by :mod:`.library`, matched by :mod:`.scan`), so a 2 GB log costs
time but no memory. ``build`` joins the files (:mod:`.facts`): which rank failed first and how,
which ranks only saw the aftermath (cascade), exit codes and signals, collective timeouts, NCCL
versions and transports per host, OOM kills, Xids, recompiles and loss-scale skips.

Live, ``collect`` copies the tail of the job's own log files (:mod:`.live`): those named with
``--logs`` and the regular files that the ranks' and the launcher's stdout/stderr point to
(``/proc/PID/fd/1,2``), plus ``NCCL_DEBUG_FILE`` targets. Pipes and terminals cannot be read back
and are skipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from doctor.evidence.contract import Hints, Parsed, Probe, Sample, set_world_size
from doctor.evidence.errors import EvidenceError

from . import live, scan, sniff
from .facts import build_facts

#: The fields of one signature hit. The same record appears in ``logs.events``, in the lists of
#: ``logs.by_kind`` and as ``logs.first_failure`` / ``logs.first_error``, so it is declared once
#: and spread over those four places below.
_EVENT_FIELDS: dict[str, str] = {
    "sig": "string: signature id (probes/logs/patterns/*.yaml)",
    "kind": "string: what the hit means, e.g. watchdog_timeout, gpu_oom, rank_exit",
    "role": "string: first_failure | cascade | context",
    "severity": "string: critical | high | medium | low | info",
    "priority": "int: lower is closer to a root cause",
    "rank": "int: the rank the line speaks for (prefix, message or file name), null when unknown",
    "host": "string: host from NCCL/syslog prefixes or the file's name",
    "file": "string: the log file",
    "line": "int: line number in the file",
    "time": "string: the line's timestamp as written, empty when none",
    "ts": "float: that timestamp as epoch seconds (UTC), null when none",
    "text": "string: the line, scrubbed and cut to 300 characters",
    "fields": "map<string,any>: named groups of the signature (seq, op, timeout_ms, code, pci, ...)",
    "pid": "int: process the line is about (NCCL prefix or the message), null when unknown",
    "survived": "bool: the same stream went on making training progress after this error (absent when not)",
}


class LogsProbe(Probe):
    name: ClassVar[str] = "logs"
    rank_state_order: ClassVar[int] = 30  # after stacks and the flight recorder
    title: ClassVar[str] = "Job logs"
    collects: ClassVar[str] = (
        "The tail of the job's log files (launcher and rank stdout/stderr when they are files, "
        "--logs paths, NCCL_DEBUG_FILE), scrubbed of secrets; offline, any text log: torchrun, "
        "SLURM, NCCL_DEBUG, dmesg/journal. Only signature hits and summaries reach the facts."
    )
    priority: ClassVar[int] = 30  # generic text: specific kinds (stacks, metrics, gpu) claim first
    joins_pieces: ClassVar[bool] = True  # one log or table pasted over two fences is one file
    build_order: ClassVar[int] = 40
    live_first_round: ClassVar[bool] = True
    follow_ups: ClassVar[dict[str, dict[str, Any]]] = {"logs": {}, "nccl_log": {}}
    shows_state: ClassVar[bool] = True
    settles: ClassVar[str] = ("every rank's log (the launcher's output, or torchrun --log-dir files) names the first "
                             "failure and which rank stopped talking; NCCL_DEBUG=INFO adds the NCCL side")
    max_bytes: ClassVar[int] = 1 << 40  # streamed: size costs time, never memory
    fixtures: ClassVar[tuple[str, ...]] = (
        "tests/fixtures/logs/*/*.log",
        "tests/fixtures/hang_partial/*/*.log",
        "tests/fixtures/logs/host_oom/dmesg.txt",
        "tests/fixtures/evidence/rank_exit/torchrun.log",
        "tests/fixtures/evidence/extra_collective/torchrun.log",
        "tests/fixtures/evidence/healthy/torchrun.log",
        "tests/fixtures/slow/*/bundle/hosts/*/logs/*.log",
        "tests/fixtures/metrics/*/*.log",
    )
    facts_schema: ClassVar[dict[str, str]] = {
        "logs.files": "int: log files read",
        "logs.lines": "int: lines read across the log files",
        "logs.events": "list<map>: signature hits, at most 20 per signature and file and 400 in all, in file order",
        **{f"logs.events[].{k}": v for k, v in _EVENT_FIELDS.items()},
        "logs.counts": "map<string,int>: hits per kind (every hit, not only the kept events)",
        "logs.sig_counts": "map<string,int>: hits per signature id",
        "logs.kinds": "list<string>: kinds seen",
        "logs.by_kind": "map<string,list<map>>: the first events of each kind (same fields as logs.events)",
        "logs.first_failure": "map: the earliest first-failure event (by timestamp where lines have one, else file order and kind priority); fields as logs.events",
        "logs.first_error": "map: the earliest event of any role with severity high or critical",
        **{f"logs.by_kind[][].{k}": v for k, v in _EVENT_FIELDS.items()},
        **{f"logs.first_failure.{k}": v for k, v in _EVENT_FIELDS.items()},
        **{f"logs.first_error.{k}": v for k, v in _EVENT_FIELDS.items()},
        "logs.tracebacks": "list<map>: Python tracebacks: rank, exc_type, message, last_frame, role, kinds, file, line",
        "logs.tracebacks[].rank": "int: rank of the [rankN]: stream or file, null when unknown",
        "logs.tracebacks[].exc_type": "string: exception type as printed",
        "logs.tracebacks[].message": "string: first line of the exception message",
        "logs.tracebacks[].last_frame": "string: innermost frame: file:line in function",
        "logs.tracebacks[].role": "string: first_failure | cascade (the message is a wait/peer symptom) | context (launcher)",
        "logs.tracebacks[].kinds": "list<string>: signature kinds the message matches",
        "logs.tracebacks[].file": "string: the log file",
        "logs.tracebacks[].line": "int: line of 'Traceback (most recent call last):'",
        "logs.tracebacks[].exc_line": "int: line of the exception",
        "logs.tracebacks[].survived": "bool: the stream went on making training progress after it (absent when not)",
        "logs.exited_ranks[].survived": "bool: training progress followed the exit (a restarted worker group): counted as cascade",
        "logs.survived_kinds": "list<string>: error kinds whose every hit the job went on after (progress counters advancing, or a recovery message then progress; logs/survival.py)",
        "logs.families": "list<string>: failure families the kinds seen belong to (hang, network, shm, cuda, native, memory, worker, gpu; probes/logs/facts.py FAMILIES)",
        "logs.timeout_explained_by": "list<string>: kinds seen that explain a collective timeout on their own (OOM, GPU/CUDA fault, worker death, network error, mismatch; probes/logs/facts.py TIMEOUT_EXPLAINERS)",
        "logs.prose_only_kinds": "list<string>: kinds whose every hit is a sentence of a ticket's prose quoting no machine message (an exception name, 'Tried to allocate', a CUDA error name): the reporter's paraphrase, not the machine's line",
        "logs.progress_lines": "int: training-progress lines counted (step/iteration/epoch counters, tqdm bars): the first 20 per signature and file, then only while an error waits to be shown survived",
        "logs.exited_ranks": "list<map>: rank exits reported by the launcher or scheduler",
        "logs.exited_ranks[].rank": "int: global rank (null when only the local rank is known)",
        "logs.exited_ranks[].local_rank": "int: local rank",
        "logs.exited_ranks[].host": "string: host",
        "logs.exited_ranks[].pid": "int: process id",
        "logs.exited_ranks[].exitcode": "int: exit code (negative: killed by that signal)",
        "logs.exited_ranks[].signal": "string: SIGKILL, SIGABRT, ... or empty",
        "logs.exited_ranks[].root_cause": "bool: the launcher named it the first observed failure",
        "logs.exited_ranks[].cascade": "bool: the exit followed someone else's failure (launcher teardown, external kill, or the rank's own evidence is only waiting for peers)",
        "logs.exited_ranks[].why": "string: why the exit counts as cascade or first failure",
        "logs.exited_ranks[].source": "string: launcher (torchrun/elastic) | slurm",
        "logs.exited_ranks[].time": "string: time of the exit as the launcher printed it",
        "logs.exited_ranks[].ts": "float: that time as epoch seconds, null when unknown",
        "logs.exited_ranks[].file": "string: the log file",
        "logs.exited_ranks[].line": "int: line of the failure-summary entry (0 when from a one-line message)",
        "logs.dead_ranks": "list<int>: ranks whose process exited or was killed on its own (not as a cascade)",
        "logs.failed_ranks": "list<int>: ranks with a first-failure event or traceback of their own",
        "logs.waiting_ranks": "list<int>: ranks whose errors are only waiting for peers (timeouts, closed peers)",
        "logs.launcher_failed": "bool: the launcher reported failed ranks (ChildFailedError, failure summary, srun error)",
        "logs.external_kill": "bool: the launcher or scheduler was told to stop the job (death signal, CANCELLED)",
        "logs.waits": "list<map>: collective timeouts, one per rank and sequence number: rank, backend (nccl|gloo), seq, op, numel_in, timeout_ms, ran_ms",
        "logs.waits[].rank": "int: rank that timed out",
        "logs.waits[].host": "string: host, when known",
        "logs.waits[].backend": "string: nccl | gloo",
        "logs.waits[].seq": "int: collective sequence number (NCCL watchdog), null for gloo",
        "logs.waits[].op": "string: ALLREDUCE, BROADCAST, ... (gloo: recv|send)",
        "logs.waits[].numel_in": "int: elements of the collective's input, null when not printed",
        "logs.waits[].timeout_ms": "int: the configured timeout",
        "logs.waits[].ran_ms": "int: how long it ran before timing out (NCCL), null for gloo",
        "logs.waits[].pg": "string: the process group the line names ('0(default_pg)', '3'), '' when it names none (torch < 2.2)",
        "logs.wait_groups": "list<map>: NCCL timeouts per process group, each rank's first: what the ranks of one group timed out in and whether they agree (logs/partial.py)",
        "logs.wait_groups[].pg": "string: the process group ('' when the lines name none)",
        "logs.wait_groups[].ranks": "list<int>: ranks of the group that timed out",
        "logs.wait_groups[].n": "int: how many",
        "logs.wait_groups[].seqs": "list<int>: distinct sequence numbers they timed out at",
        "logs.wait_groups[].ops": "list<string>: distinct op types",
        "logs.wait_groups[].seq_differs": "bool: ranks of one group timed out at different sequence numbers (lines without a group: only when op and size agree)",
        "logs.wait_groups[].op_differs": "bool: two ranks timed out at one sequence number in different ops",
        "logs.wait_groups[].numel_differs": "bool: two ranks timed out at one sequence number and op with different NumelIn",
        "logs.wait_groups[].behind_ranks": "list<int>: when seq_differs, the ranks at the lowest sequence number (they issued fewer collectives)",
        "logs.wait_groups[].ahead_ranks": "list<int>: when seq_differs, the other ranks",
        "logs.wait_groups[].barrier_like": "bool: every timeout is a barrier (OpType BARRIER, or a 1-element ALLREDUCE/BROADCAST, which ProcessGroupNCCL::barrier issues)",
        "logs.wait_groups[].first_seq": "bool: the timed-out collectives are among the first two of the group (the first after start-up)",
        "logs.quiet_ranks": "list<int>: ranks the logs show alive (any line of theirs) that never timed out while 2+ peers timed out at one sequence number, no more of them than waiters, none with a failure or exit of its own",
        "logs.unseen_ranks": "list<int>: with the world size known and every rank shown timing out at one sequence number, the few ranks (at most a quarter) the logs never mention",
        "logs.progress_groups": "list<map>: NCCL queue positions (last enqueued / last completed work, from 'Timeout at NCCL work', 'detected by watchdog at work' and dump-signal lines) compared per process group",
        "logs.progress_groups[].pg": "string: the process group ('' when the lines name none)",
        "logs.progress_groups[].ranks": "list<int>: ranks that reported their position",
        "logs.progress_groups[].n": "int: how many",
        "logs.progress_groups[].pending_ranks": "list<int>: ranks with enqueued work not completed",
        "logs.progress_groups[].max_pending": "int: most works enqueued and not completed on one rank",
        "logs.progress_groups[].stalled_ranks": "list<int>: ranks holding work that peers with nothing pending have completed: that rank's GPU did not finish it",
        "logs.progress_groups[].behind_ranks": "list<int>: a minority with nothing pending that never enqueued the collective the majority waits in (elsewhere)",
        "logs.progress_groups[].extra_ranks": "list<int>: a minority waiting in work no idle peer ever enqueued (an extra or reordered collective)",
        "logs.progress_groups[].positions": "list<string>: 'rank R: enqueued E, completed C', at most 16",
        "logs.short_timeout": "bool: a NCCL collective timed out under a timeout set below torch's default (10 minutes)",
        "logs.nccl_init": "map: NCCL communicator set-up per 'Init START' / 'Init COMPLETE' INFO lines (NCCL_DEBUG=INFO): which communicators never completed, whether the ranks agree on nranks",
        "logs.nccl_init.comms": "int: communicators (host, pid, comm pointer) that logged Init START or COMPLETE",
        "logs.nccl_init.completed": "int: of those, how many logged Init COMPLETE",
        "logs.nccl_init.incomplete_ranks": "list<int>: communicator ranks that logged Init START and never Init COMPLETE",
        "logs.nccl_init.incomplete": "list<string>: 'rank R of N (commId X)' for each of them, at most 32",
        "logs.nccl_init.nranks_differ": "list<string>: commIds whose ranks report different nranks",
        "logs.nccl_init.nranks_seen": "list<string>: 'commId X: nranks A, B' for each of those",
        "logs.nccl_progress": "map<string,any>: where NCCL_DEBUG=INFO output stops: set-up stage reached, whether lines follow, nodes, transports, drivers; InfiniBand fault lines and whether set-up or training got past them (ib_faults, ib_faults_passed, ib_devices_skipped); the addresses hosts advertise (addr_lines, addr_hosts, shared_addrs, shared_addr_hosts, loopback_hosts, local_ifaces) (logs/nccl_progress.py)",
        "logs.named_by_torch": "map: ranks torch itself names at a timeout (desync debug, monitored_barrier)",
        "logs.named_by_torch.lagging": "list<int>: desync debug: finished collective #k, never joined #k+1",
        "logs.named_by_torch.unfinished": "list<int>: desync debug: joined the collective the others wait in and never finished it",
        "logs.named_by_torch.never_joined": "list<int>: desync debug: never joined any collective of the group",
        "logs.named_by_torch.missed_barrier": "list<int>: monitored_barrier: failed to pass the barrier in time",
        "logs.wait_summary": "map: n, ranks, seqs, ops, min_timeout_ms, max_ran_ms, max_ran_ratio (ran/timeout), same_seq_ops_differ (bool), numel_differs (bool)",
        "logs.wait_summary.n": "int: collective timeouts seen",
        "logs.wait_summary.ranks": "list<int>: ranks that timed out",
        "logs.wait_summary.seqs": "list<int>: distinct sequence numbers",
        "logs.wait_summary.ops": "list<string>: distinct op types",
        "logs.wait_summary.min_timeout_ms": "int: smallest configured timeout",
        "logs.wait_summary.max_ran_ms": "int: longest wait reported",
        "logs.wait_summary.max_ran_ratio": "float: longest wait divided by its timeout (about 1.0 when the watchdog fired on time)",
        "logs.wait_summary.same_seq_ops_differ": "bool: two ranks report the same sequence number with different op types",
        "logs.wait_summary.numel_differs": "bool: two ranks report the same sequence number and op with different NumelIn",
        "logs.desync_lagging": "list<int>: ranks desync debug names as lagging (finished #k, never joined #k+1)",
        "logs.mismatch": "list<map>: collective mismatch reports: sig, ranks (named in the message), op, op2, shape, shape2, text",
        "logs.mismatch_culprits": "list<int>: ranks whose DETAIL fingerprint (op, shape) is the minority, when 3+ ranks are named and one fingerprint is rarest",
        "logs.init_timeouts": "list<map>: init/rendezvous timeouts: rank, world_size, joined, text",
        "logs.init_missing_ranks": "list<int>: ranks that never reported reaching init while the others timed out waiting (world size known, every waiter reported)",
        "logs.long_work": "list<map>: long legitimate work announced in the log (evaluation, checkpoint, preprocessing): rank, what, text",
        "logs.nccl": "map: what NCCL_DEBUG output says about versions, transports and interfaces (fields below)",
        "logs.nccl.versions": "map<string,list<string>>: NCCL versions per host ('' when the host is unknown)",
        "logs.nccl.distinct_versions": "list<string>: every NCCL version seen",
        "logs.nccl.version_hosts": "int: hosts whose NCCL version is known",
        "logs.nccl.version_lines": "list<string>: one line per host: 'node01: NCCL 2.21.5'",
        "logs.nccl.transports": "list<string>: channel transports seen (P2P/IPC, P2P/CUMEM, SHM/direct, NET/IB, NET/Socket, ...)",
        "logs.nccl.nets": "list<string>: NET plugins in use (IB, Socket, FastSocket, OFI, ...)",
        "logs.nccl.hosts": "list<string>: hosts with NCCL_DEBUG output",
        "logs.nccl.ifaces": "list<string>: interfaces NCCL's bootstrap uses (eth0, ib0, lo, docker0, ...)",
        "logs.nccl.init_complete": "int: processes that logged Init COMPLETE",
        "logs.nccl.warns": "list<string>: first NCCL WARN lines (scrubbed)",
        "logs.duplicate_gpu": "list<map>: ranks sharing one GPU: host, bus_id, ranks, source (warn|init_lines)",
        "logs.xids": "list<map>: Xid events: code, pci, host, rank, text",
        "logs.mismatch[].sig": "string: signature id (gloo_size_mismatch, fingerprint_mismatch, nccl_mismatched_collective)",
        "logs.mismatch[].ranks": "list<int>: ranks the message names",
        "logs.mismatch[].reporter": "int: rank whose log line it is (null for DETAIL fingerprints, which name both ranks)",
        "logs.mismatch[].op": "string: op type of the first rank named",
        "logs.mismatch[].op2": "string: op type of the second rank named",
        "logs.mismatch[].shape": "string: tensor shape of the first rank named",
        "logs.mismatch[].shape2": "string: tensor shape of the second rank named",
        "logs.mismatch[].text": "string: the log line",
        "logs.init_timeouts[].rank": "int: rank that timed out waiting at init",
        "logs.init_timeouts[].world_size": "int: world size the message names",
        "logs.init_timeouts[].joined": "int: ranks that had joined",
        "logs.init_timeouts[].text": "string: the log line",
        "logs.long_work[].rank": "int: rank that announced it",
        "logs.long_work[].what": "string: Evaluation, saving checkpoint, Running tokenizer on dataset, ...",
        "logs.long_work[].text": "string: the log line",
        "logs.duplicate_gpu[].host": "string: host",
        "logs.duplicate_gpu[].bus_id": "string: PCI bus id NCCL printed",
        "logs.duplicate_gpu[].ranks": "list<int>: ranks on that GPU",
        "logs.duplicate_gpu[].source": "string: 'NCCL warning' (Duplicate GPU detected) | 'NCCL init lines' (Init START/COMPLETE of one communicator)",
        "logs.duplicate_gpu[].text": "string: one line saying which ranks share which GPU",
        "logs.xids[].code": "int: Xid code",
        "logs.xids[].pci": "string: PCI address of the GPU (PCI:0000:3b:00)",
        "logs.xids[].host": "string: host (syslog prefix or file name)",
        "logs.xids[].rank": "int: rank of the process named, when the launcher maps its pid",
        "logs.xids[].text": "string: the kernel log line",
        "logs.xid_codes": "list<int>: distinct Xid codes seen",
        "logs.compile": "map: torch.compile recompilation messages (fields below)",
        "logs.compile.recompiles": "int: 'Recompiling function' lines",
        "logs.compile.limit_hits": "int: recompile/cache-size limit warnings",
        "logs.compile.functions": "map<string,int>: recompiles per function name",
        "logs.compile.reasons": "list<string>: last guard-failure reasons printed",
        "logs.amp": "map: fp16 loss-scaler messages (fields below)",
        "logs.amp.skips": "int: fp16 overflow skip messages",
        "logs.amp.min_scale": "float: smallest loss scale reported after a skip (null when none)",
        "logs.amp.at_minimum": "bool: a loss scaler reported it is at its minimum scale",
        "logs.by_rank": "map<string,map>: per rank: state (dead|failed|waiting|exited_cascade|seen), exitcode, signal, first_error, exception, kinds",
        "logs.by_rank[].state": "string: dead (exited on its own) | failed (an error of its own) | waiting (only waited for peers) | exited_cascade | seen",
        "logs.by_rank[].exitcode": "int: its exit code per the launcher, null when no exit was reported",
        "logs.by_rank[].signal": "string: the signal that ended it (SIGKILL, ...) or ''",
        "logs.by_rank[].exception": "string: 'ExcType: message' of its traceback (first failure preferred), or ''",
        "logs.by_rank[].first_error": "string: text of its first high or critical event, or ''",
        "logs.by_rank[].kinds": "list<string>: kinds of its own failures and of its waits",
        "logs.world_size": "int: largest world size a log names (NCCL nranks, store barrier, failure summary)",
    }

    # -- offline ---------------------------------------------------------------------------

    def unexplained_state(self, facts: dict[str, Any]) -> dict[str, str] | None:
        """Errors in the logs are not a healthy job, even when no rule can name their cause; nor
        are errors that only follow someone else's failure (a peer lost, a remote error). Ranks
        still waiting (and none exited) read as hung, anything else as crashed."""
        logs = facts.get("logs") or {}
        cascade = next((e for e in logs.get("events") or [] if e.get("role") == "cascade" and not e.get("survived")), None)
        first = logs.get("first_failure") or logs.get("first_error") or cascade
        if not (logs.get("waits") or first):
            return None
        state = "hung" if logs.get("waits") and not logs.get("exited_ranks") else "crashed"
        what = str((first or {}).get("text") or (first or {}).get("kind") or "errors")
        return {"state": state, "what": what}
    def sniff(self, sample: Sample) -> bool:
        return sniff.sniff(sample)

    def also_sniff(self, sample: Sample) -> bool:
        """Read a file another kind owns when it also holds failure evidence (see :mod:`.sniff`)."""
        return sniff.also_sniff(sample)

    def parse(self, path: Path, rel: str, hints: Hints) -> Parsed:
        try:
            result = scan.scan_file(path, rel, hints.rank, hints.host)
        except OSError as exc:
            raise EvidenceError(rel, f"cannot read ({exc.strerror or exc})") from None
        if result.lines == 0:
            raise EvidenceError(rel, "empty log")
        return Parsed(self.name, rel, result.to_json(), hints.rank, hints.host)

    def build(self, parsed: list[Parsed], facts: dict[str, Any]) -> None:
        facts[self.name] = build_facts([p.data for p in parsed])
        job = facts["job"]
        job["ranks_seen"] = sorted(set(job.get("ranks_seen") or [])
                                   | {r for p in parsed for r in p.data["ranks"]})
        job["hosts"] = sorted(set(job.get("hosts") or []) | {h for p in parsed for h in p.data["hosts"]
                                                             if h and h != "localhost"})
        set_world_size(facts, facts[self.name]["world_size"])

    def coverage(self) -> list[dict[str, Any]]:
        """Per message family, the harvested upstream templates the signatures recognize
        (``templates/*.yaml``, measured through the scanner: see :mod:`.coverage`)."""
        from .coverage import coverage_rows  # only `rules coverage` needs it

        return coverage_rows()

    # -- live ------------------------------------------------------------------------------
    def collect(self, ctx: Any) -> None:
        live.collect(ctx)


PROBE = LogsProbe()
