"""Job logs: launcher output (torchrun, SLURM), per-rank stdout/stderr, NCCL_DEBUG output,
kernel logs (dmesg/journal). Each file is scanned line by line against the signature library
(``doctor/signatures/*.yaml``, matched by ``probes/logscan.py``), so a 2 GB log costs time but no
memory. ``build`` joins the files: which rank failed first and how, which ranks only saw the
aftermath (cascade), exit codes and signals, collective timeouts, NCCL versions and transports
per host, OOM kills, Xids, recompiles and loss-scale skips.

Live, ``collect`` copies the tail of the job's own log files: those named with ``--logs`` and the
regular files that the ranks' and the launcher's stdout/stderr point to (``/proc/PID/fd/1,2``),
plus ``NCCL_DEBUG_FILE`` targets. Pipes and terminals cannot be read back and are skipped.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
from pathlib import Path
from typing import Any, ClassVar

from doctor.probes.common.text import TB_START, strip_prefixes

from doctor.evidence.contract import Hints, Parsed, Probe, ProbeSkipped, Sample, set_world_size
from doctor.evidence.errors import EvidenceError

from . import logscan

DEFAULT_TAIL_BYTES = 16 * 2**20   # live: bytes read from the end of each log file
MAX_LIVE_FILES = 64
MAX_EVENTS = 400                  # events kept in the facts (all hits are counted)
EXAMPLES_PER_KIND = 8
FIRST_FAILURE_WINDOW_S = 30.0
SNIFF_TAIL = 64 * 1024            # bytes of a file's end also looked at when sniffing     # timestamped first failures closer than this are ordered by kind

# Evidence of waiting for someone else: a rank whose own evidence is only these died of the wait.
WAIT_KINDS = frozenset({
    "watchdog_timeout", "watchdog_progress", "gloo_timeout", "store_timeout", "init_timeout",
    "peer_connection_lost", "nccl_remote_error", "store_connection_lost", "nccl_teardown",
    "desync_report", "launcher_teardown", "process_abort",
})
TEARDOWN_SIGNALS = frozenset({"SIGTERM", "SIGINT", "SIGHUP"})

_KEYVAL = re.compile(r"^(?:export\s+|declare\s+-x\s+)?[A-Za-z_][A-Za-z0-9_]*=")
_PYSPY = re.compile(r"^Process \d+: ")
_STRONG = re.compile(
    r"^\[(?:rank|default)\d+\]:|^\[\d+,\d+\]<std(?:out|err)>:|Traceback \(most recent call last\):"
    r"|^[\w.-]+:\d+:\d+ \[\d+\] (?:[\w./-]+:\d+ )?NCCL (?:INFO|WARN)"
    r"|^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [\w/.]+:\d+\]"
    r"|^\[\s*\d+\.\d+\] |^[A-Z][a-z]{2} +\d+ \d\d:\d\d:\d\d \S+ kernel:"
    r"|Setting OMP_NUM_THREADS environment variable for each process",
    re.M,
)
_LOG_WORDS = re.compile(r"\b(?:INFO|WARN(?:ING)?|ERROR|DEBUG|CRITICAL|step|epoch|loss|iter(?:ation)?)\b", re.I)
_LOG_NAMES = (".log", ".out", ".err", ".txt", ".stdout", ".stderr")
# Source, config and document files quote log strings without being logs.
_NOT_LOG_NAMES = (".py", ".pyc", ".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".rs", ".go", ".js", ".ts",
                  ".java", ".sh", ".yaml", ".yml", ".toml", ".json", ".ipynb", ".html", ".css", ".md",
                  ".rst", ".pkl", ".pt", ".gz", ".zip", ".tar")


def _is_binary(raw: bytes) -> bool:
    sample = raw[:8192]
    if not sample:
        return False
    bad = sum(1 for b in sample if b < 9 or 13 < b < 32 and b != 27)
    return bad / len(sample) > 0.05


def _numeric(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, (int, float)):
        return True
    if isinstance(v, str):
        try:
            float(v)
        except ValueError:
            return False
        return True
    return False


def _numeric_table(lines: list[str]) -> bool:
    """CSV/TSV or JSON lines whose values are mostly numbers: a metrics file, not a log."""
    rows = [ln for ln in lines[:60] if ln.strip()]
    if len(rows) < 2:
        return False
    if sum(ln.lstrip().startswith("{") and ln.rstrip().endswith("}") for ln in rows) >= 0.8 * len(rows):
        values: list[Any] = []
        for ln in rows[:20]:
            try:
                obj = json.loads(ln)
            except ValueError:
                continue
            if isinstance(obj, dict):
                values.extend(obj.values())
        return bool(values) and sum(_numeric(v) for v in values) >= 0.5 * len(values)
    for delim in (",", "\t"):
        counts = [ln.count(delim) for ln in rows]
        if counts[0] >= 1 and sum(c == counts[0] for c in counts) >= 0.8 * len(counts):
            cells = [c.strip() for ln in rows[1:] for c in ln.split(delim)]
            if cells and sum(_numeric(c) for c in cells) >= 0.5 * len(cells):
                return True
    return False


class LogsProbe(Probe):
    name: ClassVar[str] = "logs"
    title: ClassVar[str] = "Job logs"
    collects: ClassVar[str] = (
        "The tail of the job's log files (launcher and rank stdout/stderr when they are files, "
        "--logs paths, NCCL_DEBUG_FILE), scrubbed of secrets; offline, any text log: torchrun, "
        "SLURM, NCCL_DEBUG, dmesg/journal. Only signature hits and summaries reach the facts."
    )
    priority: ClassVar[int] = 30  # generic text: specific kinds (stacks, metrics, gpu) claim first
    build_order: ClassVar[int] = 40
    live_first_round: ClassVar[bool] = True
    follow_ups: ClassVar[dict[str, dict[str, Any]]] = {"logs": {}, "nccl_log": {}}
    shows_state: ClassVar[bool] = True
    max_bytes: ClassVar[int] = 1 << 40  # streamed: size costs time, never memory
    facts_schema: ClassVar[dict[str, str]] = {
        "logs.files": "int: log files read",
        "logs.lines": "int: lines read across the log files",
        "logs.events": "list<map>: signature hits, at most 20 per signature and file and 400 in all, in file order",
        "logs.events[].sig": "string: signature id (doctor/signatures/*.yaml)",
        "logs.events[].kind": "string: what the hit means, e.g. watchdog_timeout, gpu_oom, rank_exit",
        "logs.events[].role": "string: first_failure | cascade | context",
        "logs.events[].severity": "string: critical | high | medium | low | info",
        "logs.events[].priority": "int: lower is closer to a root cause",
        "logs.events[].rank": "int: the rank the line speaks for (prefix, message or file name), null when unknown",
        "logs.events[].host": "string: host from NCCL/syslog prefixes or the file's name",
        "logs.events[].file": "string: the log file",
        "logs.events[].line": "int: line number in the file",
        "logs.events[].time": "string: the line's timestamp as written, empty when none",
        "logs.events[].ts": "float: that timestamp as epoch seconds (UTC), null when none",
        "logs.events[].text": "string: the line, scrubbed and cut to 300 characters",
        "logs.events[].fields": "map<string,any>: named groups of the signature (seq, op, timeout_ms, code, pci, ...)",
        "logs.events[].pid": "int: process the line is about (NCCL prefix or the message), null when unknown",
        "logs.counts": "map<string,int>: hits per kind (every hit, not only the kept events)",
        "logs.sig_counts": "map<string,int>: hits per signature id",
        "logs.kinds": "list<string>: kinds seen",
        "logs.by_kind": "map<string,list<map>>: the first events of each kind (same fields as logs.events)",
        "logs.first_failure": "map: the earliest first-failure event (by timestamp where lines have one, else file order and kind priority); fields as logs.events",
        "logs.first_error": "map: the earliest event of any role with severity high or critical",
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
        "logs.compile.recompiles": "int: 'Recompiling function' lines",
        "logs.compile.limit_hits": "int: recompile/cache-size limit warnings",
        "logs.compile.functions": "map<string,int>: recompiles per function name",
        "logs.compile.reasons": "list<string>: last guard-failure reasons printed",
        "logs.amp.skips": "int: fp16 overflow skip messages",
        "logs.amp.min_scale": "float: smallest loss scale reported after a skip (null when none)",
        "logs.amp.at_minimum": "bool: a loss scaler reported it is at its minimum scale",
        "logs.by_rank": "map<string,map>: per rank: state (dead|failed|waiting|exited_cascade|seen), exitcode, signal, first_error, exception, kinds",
        "logs.world_size": "int: largest world size a log names (NCCL nranks, store barrier, failure summary)",
    }

    # -- offline ---------------------------------------------------------------------------

    def unexplained_state(self, facts: dict[str, Any]) -> dict[str, str] | None:
        """Errors in the logs are not a healthy job, even when no rule can name their cause; nor
        are errors that only follow someone else's failure (a peer lost, a remote error). Ranks
        still waiting (and none exited) read as hung, anything else as crashed."""
        logs = facts.get("logs") or {}
        cascade = next((e for e in logs.get("events") or [] if e.get("role") == "cascade"), None)
        first = logs.get("first_failure") or logs.get("first_error") or cascade
        if not (logs.get("waits") or first):
            return None
        state = "hung" if logs.get("waits") and not logs.get("exited_ranks") else "crashed"
        what = str((first or {}).get("text") or (first or {}).get("kind") or "errors")
        return {"state": state, "what": what}

    def sniff(self, sample: Sample) -> bool:
        lines = self._text_lines(sample)
        if lines is None:
            return False
        text = "\n".join(lines)
        if _STRONG.search(text) or _signature_hit(lines):
            return True
        tail = _tail_lines(sample)  # a long training log whose crash is at the end
        if tail and (_STRONG.search("\n".join(tail)) or _signature_hit(tail)):
            return True
        if sample.name.lower().endswith(_LOG_NAMES):
            words = sum(bool(_LOG_WORDS.search(ln)) for ln in lines[:500])
            return words >= max(2, len(lines[:500]) // 10)
        return False

    def also_sniff(self, sample: Sample) -> bool:
        """Read a file another kind owns (a trainer log the metrics probe parses for loss) when
        it also holds failure evidence: a signature hit or a traceback, at its start or end."""
        lines = self._text_lines(sample, allow_table=True)
        if lines is None:
            return False
        tail = _tail_lines(sample) or []
        return any(_signature_hit(part) or any(ln.startswith(TB_START) for ln in part)
                   for part in (lines, tail))

    @staticmethod
    def _text_lines(sample: Sample, allow_table: bool = False) -> list[str] | None:
        """The sample's lines when it is plain text that no other kind owns by shape, else None."""
        raw = sample.raw
        if not raw or raw[:1] == b"\x80":  # pickles (flight recorder) are not logs
            return None
        if sample.name.lower().endswith(_NOT_LOG_NAMES):
            return None
        text_bytes = raw.replace(b"\x00", b"") if b"\x00" in raw else raw
        if len(text_bytes.strip()) < 8 or _is_binary(text_bytes):
            return None
        text = text_bytes.decode("utf-8", errors="replace")
        lines = text.splitlines()[:2000]
        first = next((ln for ln in lines if ln.strip()), "")
        if _PYSPY.match(first) or (first.lstrip()[:1] in "[{" and '"thread_id"' in text[:8192]):
            return None  # py-spy dumps belong to the stacks probe
        body = [ln for ln in lines[:300] if ln.strip() and not ln.startswith("#")]
        if body and sum(bool(_KEYVAL.match(ln)) for ln in body) / len(body) >= 0.7:
            return None  # an environment dump
        if not allow_table and _numeric_table(lines):
            return None  # metrics CSV/JSONL, even with a stray matching string
        return lines

    def parse(self, path: Path, rel: str, hints: Hints) -> Parsed:
        try:
            scan = logscan.scan_file(path, rel, hints.rank, hints.host)
        except OSError as exc:
            raise EvidenceError(rel, f"cannot read ({exc.strerror or exc})") from None
        if scan.lines == 0:
            raise EvidenceError(rel, "empty log")
        return Parsed(self.name, rel, scan.to_json(), hints.rank, hints.host)

    def build(self, parsed: list[Parsed], facts: dict[str, Any]) -> None:
        facts[self.name] = build_facts([p.data for p in parsed])
        job = facts["job"]
        job["ranks_seen"] = sorted(set(job.get("ranks_seen") or [])
                                   | {r for p in parsed for r in p.data["ranks"]})
        job["hosts"] = sorted(set(job.get("hosts") or []) | {h for p in parsed for h in p.data["hosts"]
                                                             if h and h != "localhost"})
        set_world_size(facts, facts[self.name]["world_size"])

    # -- live ------------------------------------------------------------------------------

    def collect(self, ctx: Any) -> None:
        tail = int(ctx.options.get("log_tail_bytes") or DEFAULT_TAIL_BYTES)
        sources = _live_sources(ctx)
        if not sources:
            raise ProbeSkipped("no log files to read: the job's stdout/stderr are pipes or terminals "
                               "and no --logs were given")
        for i, (path, rank, pid, why) in enumerate(sources[:MAX_LIVE_FILES]):
            try:
                data, size = _read_tail(path, tail)
            except OSError:
                continue
            name = f"{i:02d}-{_safe_name(why)}.log"
            ctx.add(name, data, rank=rank, pid=pid,
                    meta={"source": why, "size": size, "tail_bytes": len(data)})


def _matches_any(lib: logscan.Library, line: str) -> bool:
    body, _ = strip_prefixes(line)
    return any(s.regex.search(body) for s in lib.candidates(body))


def _signature_hit(lines: list[str]) -> bool:
    """Does any line, or two lines that read as one wrapped message, match a signature?"""
    lib = logscan.library()
    prev = ""
    for ln in lines:
        if _matches_any(lib, ln):
            return True
        body, _ = strip_prefixes(ln)
        if prev and logscan.wraps(prev, body):
            joined = prev + " " + body
            sigs = logscan.seam_candidates(lib, prev, body, lib.candidates(prev) + lib.candidates(body))
            if any(sig.regex.search(joined) for sig in sigs):
                return True
        prev = body
    return False


def _tail_lines(sample: Sample, nbytes: int = SNIFF_TAIL) -> list[str] | None:
    """The last lines of a file larger than its sample (None when the sample already was all)."""
    if sample.size <= len(sample.raw):
        return None
    try:
        data, _ = _read_tail(sample.path, nbytes)
    except OSError:
        return None
    if _is_binary(data.replace(b"\x00", b"")):
        return None
    return data.replace(b"\x00", b"").decode("utf-8", errors="replace").splitlines()[-2000:]


# -- building the facts ----------------------------------------------------------------------

def _ordered_events(scans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every kept event in file order; a line without a rank of its own gets one from its pid
    when the launcher's failure summary maps that pid to a rank (NCCL lines, OOM kills)."""
    pid_rank: dict[int, int] = {}
    for sc in scans:
        pid_rank.update({int(k): v for k, v in sc["pid_rank"].items()})
    out = []
    for fi, sc in enumerate(scans):
        # A file whose prefixed lines all speak for one rank (its own log, or a 1-rank job):
        # its unprefixed errors are that rank's too.
        only = sc["ranks"][0] if len(sc["ranks"]) == 1 else None
        for ev in sc["events"]:
            ev = {**ev, "_fi": fi}
            if ev["rank"] is None and ev.get("pid") in pid_rank:
                ev["rank"] = pid_rank[ev["pid"]]
            if ev["rank"] is None and only is not None and ev["role"] == "first_failure":
                ev["rank"] = only
            out.append(ev)
    out.sort(key=lambda e: (e["_fi"], e["line"]))
    return out


def _pick_first(cands: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The earliest candidate: timestamps order events further apart than the window; inside
    it (clock skew, second resolution) the kind's priority and then file order decide."""
    if not cands:
        return None
    stamped = [c for c in cands if c.get("ts") is not None]
    if len(stamped) >= 2:
        t0 = min(c["ts"] for c in stamped)
        cands = [c for c in cands if c.get("ts") is None or c["ts"] - t0 <= FIRST_FAILURE_WINDOW_S]
    return min(cands, key=lambda c: (c["priority"], c.get("_fi", 0), c["line"]))


def _clean(ev: dict[str, Any] | None) -> dict[str, Any] | None:
    if ev is None:
        return None
    return {k: v for k, v in ev.items() if not k.startswith("_")}


def build_facts(scans: list[dict[str, Any]]) -> dict[str, Any]:
    """Join the per-file scans into the ``logs`` namespace (see facts_schema)."""
    events = _ordered_events(scans)
    counts: dict[str, int] = {}
    sig_counts: dict[str, int] = {}
    for sc in scans:
        for k, v in sc["counts"].items():
            counts[k] = counts.get(k, 0) + v
        for k, v in sc["sig_counts"].items():
            sig_counts[k] = sig_counts.get(k, 0) + v
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for ev in events:
        lst = by_kind.setdefault(ev["kind"], [])
        if len(lst) < EXAMPLES_PER_KIND:
            lst.append(_clean(ev))
    tracebacks = [tb for sc in scans for tb in sc["tracebacks"]]
    external_kill = counts.get("external_kill", 0) > 0

    # Which ranks failed on their own, which only waited for others.
    own: dict[int, set[str]] = {}      # rank -> kinds of its own first-failure evidence
    waited: dict[int, set[str]] = {}   # rank -> kinds of its waiting evidence
    for ev in events:
        r = ev["rank"]
        if r is None or ev["kind"] in ("desync_lagging", "duplicate_gpu", "collective_mismatch", "rank_exit"):
            continue
        if ev["kind"] in WAIT_KINDS or ev["role"] == "cascade":
            waited.setdefault(r, set()).add(ev["kind"])
        elif ev["role"] == "first_failure":
            own.setdefault(r, set()).add(ev["kind"])
    for tb in tracebacks:
        r = tb["rank"]
        if r is None or tb["role"] == "context":
            continue
        kinds = set(tb["kinds"]) or {"python_exception"}
        if tb["role"] == "cascade" or kinds <= WAIT_KINDS:
            waited.setdefault(r, set()).update(kinds)
        else:
            own.setdefault(r, set()).update(kinds - WAIT_KINDS)

    exits = _merge_exits(scans)
    for ex in exits:
        r = ex["rank"]
        if external_kill:
            ex["cascade"], ex["why"] = True, "the launcher or scheduler was told to stop the job"
        elif ex["signal"] in TEARDOWN_SIGNALS and not ex["root_cause"]:
            ex["cascade"], ex["why"] = True, f"stopped by the launcher ({ex['signal']}) after another failure"
        elif r is not None and r not in own and r in waited:
            ex["cascade"] = True
            ex["why"] = "its own errors are only waiting for peers (" + ", ".join(sorted(waited[r])) + ")"
        elif ex["exitcode"] == 0:
            ex["cascade"], ex["why"] = False, "exited cleanly"
        else:
            ex["cascade"] = False
            ex["why"] = ("its own error: " + ", ".join(sorted(own[r]))) if r in own else "exited or was killed with no error of its own in the logs"
    dead = sorted({ex["rank"] for ex in exits if not ex["cascade"] and ex["exitcode"] not in (0, None)
                   and ex["rank"] is not None})
    failed = sorted(own)
    waiting = sorted(set(waited) - set(own))

    cands = []
    for ev in events:
        if ev["role"] == "first_failure" and not (ev["kind"] == "rank_exit"):
            cands.append(ev)
    for tb in tracebacks:
        if tb["role"] == "first_failure":
            cands.append({"sig": "python_traceback", "kind": "python_exception", "role": "first_failure",
                          "severity": "high", "priority": 40, "rank": tb["rank"], "host": "",
                          "file": tb["file"], "line": tb["exc_line"], "time": "", "ts": None,
                          "text": f"{tb['exc_type']}: {tb['message']}"[:300],
                          "fields": {"exc_type": tb["exc_type"], "last_frame": tb["last_frame"]},
                          "_fi": next((i for i, sc in enumerate(scans) if sc["path"] == tb["file"]), 0)})
    for ex in exits:
        if not ex["cascade"] and ex["exitcode"] not in (0, None):
            cands.append({"sig": "rank_exit", "kind": "rank_exit", "role": "first_failure",
                          "severity": "high", "priority": 50 if ex["root_cause"] else 55,
                          "rank": ex["rank"], "host": ex["host"], "file": ex.get("file", ""),
                          "line": ex.get("line") or 0, "time": ex.get("time", ""), "ts": ex.get("ts"),
                          "text": _exit_text(ex), "fields": {"exitcode": ex["exitcode"], "signal": ex["signal"]},
                          "_fi": ex.get("_fi", 0)})
    first = _pick_first(cands)
    errors = [ev for ev in events if ev["severity"] in ("critical", "high")]
    first_error = _pick_first(errors) if errors else None

    waits = [w for sc in scans for w in sc["waits"]]
    nccl = _nccl_facts(scans, events)
    out: dict[str, Any] = {
        "files": len(scans),
        "lines": sum(sc["lines"] for sc in scans),
        "events": [_clean(e) for e in _cap_events(events)],
        "counts": counts, "sig_counts": sig_counts, "kinds": sorted(counts), "by_kind": by_kind,
        "tracebacks": tracebacks[:200],
        "exited_ranks": [{k: v for k, v in ex.items() if not k.startswith("_")} for ex in exits],
        "dead_ranks": dead, "failed_ranks": failed, "waiting_ranks": waiting,
        "launcher_failed": bool(counts.get("launcher_failed") or exits),
        "external_kill": external_kill,
        "waits": _dedupe_waits(waits), "wait_summary": _wait_summary(waits),
        "desync_lagging": sorted({e["rank"] for e in events if e["kind"] == "desync_lagging" and e["rank"] is not None}),
        "mismatch": _mismatches(events),
        "mismatch_culprits": _mismatch_culprits(events),
        "long_work": [{"rank": e["rank"], "what": str(e["fields"].get("what", "")), "text": e["text"]}
                      for e in events if e["kind"] == "long_work"][:50],
        "nccl": nccl,
        "duplicate_gpu": _duplicates(scans, events),
        "xids": [{"code": e["fields"].get("code"), "pci": e["fields"].get("pci", ""), "host": e["host"],
                  "rank": e["rank"], "text": e["text"]} for e in events if e["kind"] == "xid"][:100],
        "compile": _compile_facts(scans, counts, events),
        "amp": _amp_facts(scans, counts),
        "world_size": max([sc["world_size"] for sc in scans] + [0]),
    }
    out["xid_codes"] = sorted({x["code"] for x in out["xids"] if isinstance(x["code"], int)})
    inits = [e for e in events if e["kind"] == "init_timeout"]
    out["init_timeouts"] = [{"rank": e["rank"], "world_size": e["fields"].get("world_size"),
                             "joined": e["fields"].get("joined"), "text": e["text"]} for e in inits][:50]
    out["init_missing_ranks"] = _init_missing(inits, out["world_size"])
    if first is not None:
        out["first_failure"] = _clean(first)
    if first_error is not None:
        out["first_error"] = _clean(first_error)
    out["by_rank"] = _by_rank(exits, own, waited, tracebacks, events, dead)
    return out


def _exit_text(ex: dict[str, Any]) -> str:
    who = f"rank {ex['rank']}" if ex["rank"] is not None else f"local rank {ex['local_rank']}"
    sig = f" ({ex['signal']})" if ex["signal"] else ""
    where = f" on {ex['host']}" if ex["host"] else ""
    return f"{who}{where} exited with code {ex['exitcode']}{sig}" + (" - first failure per launcher" if ex["root_cause"] else "")


def _merge_exits(scans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per process: the failure summary's entry and the agent's 'failed (exitcode'
    line describe the same pid; SLURM task lines are kept as they are."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    pid_rank: dict[int, int] = {}
    for sc in scans:
        pid_rank.update({int(k): v for k, v in sc["pid_rank"].items()})
    for fi, sc in enumerate(scans):
        for ex in sc["exits"]:
            rec = {**ex, "file": sc["path"], "_fi": fi}
            if rec["rank"] is None and rec.get("pid") in pid_rank:
                rec["rank"] = pid_rank[rec["pid"]]
            key = (rec["host"] if rec["host"] != "localhost" else "", rec["pid"]) if rec.get("pid") else \
                (rec["host"], rec["rank"], rec["source"])
            prev = merged.get(key)
            if prev is None:
                merged[key] = rec
                continue
            for k, v in rec.items():
                if prev.get(k) in (None, "") and v not in (None, ""):
                    prev[k] = v
            prev["root_cause"] = prev["root_cause"] or rec["root_cause"]
    out = list(merged.values())
    hosts = {e["host"] for e in out if e["host"] and e["host"] != "localhost"}
    for e in out:  # one host: the local rank is the rank
        if e["rank"] is None and e.get("local_rank") is not None and len(hosts) <= 1 and e["source"] == "launcher":
            e["rank"] = e["local_rank"]
        e.setdefault("time", "")
        e.setdefault("ts", None)
        e.setdefault("line", 0)
    out.sort(key=lambda e: (e["rank"] is None, e["rank"] if e["rank"] is not None else 0, e.get("pid") or 0))
    return out


def _cap_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if len(events) <= MAX_EVENTS:
        return events
    # Keep every non-context event first, then fill with context, in file order.
    important = [e for e in events if e["role"] != "context"]
    rest = [e for e in events if e["role"] == "context"]
    keep = important[:MAX_EVENTS] + rest[:max(0, MAX_EVENTS - len(important))]
    keep.sort(key=lambda e: (e["_fi"], e["line"]))
    return keep


def _dedupe_waits(waits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for w in waits:
        seen.setdefault((w["rank"], w["host"], w["seq"], w["op"], w["backend"]), w)
    return list(seen.values())[:500]


def _wait_summary(waits: list[dict[str, Any]]) -> dict[str, Any]:
    if not waits:
        return {}
    ratios = [w["ran_ms"] / w["timeout_ms"] for w in waits
              if isinstance(w.get("ran_ms"), int) and isinstance(w.get("timeout_ms"), int) and w["timeout_ms"] > 0]
    by_seq: dict[int, set[str]] = {}
    numel: dict[tuple[int, str], set[int]] = {}
    for w in waits:
        if isinstance(w.get("seq"), int) and w.get("op"):
            by_seq.setdefault(w["seq"], set()).add(w["op"])
            if isinstance(w.get("numel_in"), int):
                numel.setdefault((w["seq"], w["op"]), set()).add(w["numel_in"])
    timeouts = [w["timeout_ms"] for w in waits if isinstance(w.get("timeout_ms"), int)]
    rans = [w["ran_ms"] for w in waits if isinstance(w.get("ran_ms"), int)]
    return {
        "n": len(waits),
        "ranks": sorted({w["rank"] for w in waits if w["rank"] is not None}),
        "seqs": sorted(by_seq),
        "ops": sorted({w["op"] for w in waits if w.get("op")}),
        "min_timeout_ms": min(timeouts) if timeouts else 0,
        "max_ran_ms": max(rans) if rans else 0,
        "max_ran_ratio": round(max(ratios), 3) if ratios else 0.0,
        "same_seq_ops_differ": any(len(ops) > 1 for ops in by_seq.values()),
        "numel_differs": any(len(n) > 1 for n in numel.values()),
    }


def _mismatches(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for e in events:
        if e["kind"] != "collective_mismatch":
            continue
        f = e["fields"]
        ranks = sorted({r for r in (f.get("rank"), f.get("rank2")) if isinstance(r, int)})
        out.append({"sig": e["sig"], "ranks": ranks, "reporter": e["rank"] if e["sig"] != "fingerprint_mismatch" else None,
                    "op": str(f.get("op", "")), "op2": str(f.get("op2", "")),
                    "shape": str(f.get("shape", "")), "shape2": str(f.get("shape2", "")), "text": e["text"]})
    return out[:50]


def _mismatch_culprits(events: list[dict[str, Any]]) -> list[int]:
    """From DETAIL fingerprint messages, the ranks whose (op, shape) few others share."""
    fp: dict[int, tuple[str, str]] = {}
    for e in events:
        if e["sig"] != "fingerprint_mismatch":
            continue
        f = e["fields"]
        if isinstance(f.get("rank"), int):
            fp.setdefault(f["rank"], (str(f.get("op", "")), str(f.get("shape", ""))))
        if isinstance(f.get("rank2"), int):
            fp.setdefault(f["rank2"], (str(f.get("op2", "")), str(f.get("shape2", ""))))
    if len(fp) < 3:
        return []  # two ranks that disagree: the logs cannot say which one is odd
    groups: dict[tuple[str, str], list[int]] = {}
    for r, key in fp.items():
        groups.setdefault(key, []).append(r)
    sizes = sorted(len(g) for g in groups.values())
    if len(groups) < 2 or sizes[0] == sizes[-1] or sizes.count(sizes[0]) > 1:
        return []
    return sorted(min(groups.values(), key=len))


def _init_missing(inits: list[dict[str, Any]], world: int) -> list[int]:
    """Ranks that never reached init: the world minus the ranks that reported waiting, when the
    counts agree (every rank that arrived reported the timeout)."""
    ws = max([i["fields"].get("world_size") or 0 for i in inits] + [0]) or world
    joined = max([i["fields"].get("joined") or 0 for i in inits] + [0])
    reporters = {i["rank"] for i in inits if i["rank"] is not None}
    if not ws or not reporters or len(reporters) != joined or ws > 100000:
        return []
    return sorted(set(range(ws)) - reporters)


def _nccl_facts(scans: list[dict[str, Any]], events: list[dict[str, Any]]) -> dict[str, Any]:
    versions: dict[str, set[str]] = {}
    for sc in scans:
        for h, vs in sc["nccl_versions"].items():
            versions.setdefault(h, set()).update(vs)
    return {
        "versions": {h: sorted(v) for h, v in versions.items()},
        "distinct_versions": sorted({v for vs in versions.values() for v in vs}),
        "version_hosts": len([h for h in versions if h]),
        "version_lines": [f"{h or 'host unknown'}: NCCL {', '.join(sorted(v))}" for h, v in sorted(versions.items())],
        "transports": sorted({t for sc in scans for t in sc["transports"]}),
        "nets": sorted({n for sc in scans for n in sc["nets"]}),
        "ifaces": sorted({i for sc in scans for i in sc.get("ifaces", [])}),
        "hosts": sorted({h for sc in scans for h in sc["nccl_hosts"]}),
        "init_complete": sum(sc["init_complete"] for sc in scans),
        "warns": [e["text"] for e in events if e["kind"] == "nccl_warn"][:20],
    }


def _duplicates(scans: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for e in events:
        if e["kind"] == "duplicate_gpu":
            f = e["fields"]
            out.append({"host": e["host"], "bus_id": str(f.get("bus_id", "")),
                        "ranks": sorted({r for r in (f.get("rank"), f.get("rank2")) if isinstance(r, int)}),
                        "source": "NCCL warning"})
    # Init COMPLETE lines of one communicator naming the same busId on one host twice.
    rows: dict[str, list[list[Any]]] = {}
    for sc in scans:
        for comm, rs in sc["comm_devices"].items():
            rows.setdefault(comm, []).extend(rs)
    for rs in rows.values():
        by_dev: dict[tuple[str, str], set[Any]] = {}
        for host, pid, crank, bus in rs:
            by_dev.setdefault((host, bus), set()).add((pid, crank))
        for (host, bus), procs in by_dev.items():
            if len({p for p, _ in procs}) > 1:
                out.append({"host": host, "bus_id": bus, "ranks": sorted({r for _, r in procs if isinstance(r, int)}),
                            "source": "NCCL init lines"})
    out.sort(key=lambda d: not d["host"])  # named hosts first, so the dedupe keeps them
    seen = set()
    uniq = []
    for d in out:
        key = (d["bus_id"], tuple(d["ranks"]))
        if key not in seen:
            seen.add(key)
            uniq.append(d)
    for d in uniq:
        d["text"] = (f"ranks {', '.join(map(str, d['ranks']))} on GPU busId {d['bus_id']}"
                     + (f" of {d['host']}" if d["host"] else "") + f" ({d['source']})")
    return uniq[:50]


def _compile_facts(scans: list[dict[str, Any]], counts: dict[str, int],
                   events: list[dict[str, Any]]) -> dict[str, Any]:
    funcs: dict[str, int] = {}
    for sc in scans:
        for k, v in sc["recompile_functions"].items():
            funcs[k] = funcs.get(k, 0) + v
    return {
        "recompiles": counts.get("recompile", 0),
        "limit_hits": counts.get("recompile_limit", 0),
        "functions": funcs,
        "reasons": [str(e["fields"].get("reason", "")) for e in events if e["kind"] == "recompile_reason"][:10],
    }


def _amp_facts(scans: list[dict[str, Any]], counts: dict[str, int]) -> dict[str, Any]:
    scales = [s for sc in scans for s in sc["loss_scales"]]
    return {
        "skips": counts.get("fp16_skip", 0),
        "min_scale": min(scales) if scales else None,
        "at_minimum": counts.get("fp16_scale_min", 0) > 0,
    }


def _by_rank(exits: list[dict[str, Any]], own: dict[int, set[str]], waited: dict[int, set[str]],
             tracebacks: list[dict[str, Any]], events: list[dict[str, Any]], dead: list[int]) -> dict[str, Any]:
    ranks = {ex["rank"] for ex in exits if ex["rank"] is not None} | set(own) | set(waited)
    out: dict[str, Any] = {}
    for r in sorted(ranks):
        ex = next((e for e in exits if e["rank"] == r), None)
        tb = next((t for t in tracebacks if t["rank"] == r and t["role"] == "first_failure"), None) or \
            next((t for t in tracebacks if t["rank"] == r), None)
        ev = next((e for e in events if e["rank"] == r and e["severity"] in ("critical", "high")), None)
        state = ("dead" if r in dead else "failed" if r in own else "waiting" if r in waited
                 else "exited_cascade" if ex and ex.get("cascade") else "seen")
        out[str(r)] = {
            "state": state,
            "exitcode": ex["exitcode"] if ex else None,
            "signal": ex["signal"] if ex else "",
            "exception": f"{tb['exc_type']}: {tb['message']}"[:200] if tb else "",
            "first_error": ev["text"] if ev else "",
            "kinds": sorted(own.get(r, set()) | waited.get(r, set())),
        }
    return out


# -- live collection -------------------------------------------------------------------------

def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")[:80] or "log"


def _live_sources(ctx: Any) -> list[tuple[Path, int | None, int | None, str]]:
    """Files to read: --logs paths, then regular files behind each process's fd 1/2 (read
    through /proc so a deleted-but-open log still counts), then NCCL_DEBUG_FILE targets."""
    found: list[tuple[Path, int | None, int | None, str]] = []
    seen: dict[tuple[int, int], int] = {}

    def add(path: Path, rank: int | None, pid: int | None, why: str) -> None:
        try:
            st = os.stat(path)
        except OSError:
            return
        if not stat.S_ISREG(st.st_mode):
            return
        key = (st.st_dev, st.st_ino)
        if key in seen:  # one log shared by several processes: no single rank owns it
            i = seen[key]
            p, r, q, w = found[i]
            found[i] = (p, r if r == rank else None, q if q == pid else None, w)
            return
        seen[key] = len(found)
        found.append((path, rank, pid, why))

    for item in ctx.options.get("logs") or []:
        p = Path(item)
        if p.is_dir():
            files = sorted((f for f in p.rglob("*") if f.is_file() and not f.name.startswith(".")),
                           key=lambda f: f.stat().st_mtime, reverse=True)
            for f in files[:MAX_LIVE_FILES]:
                add(f, None, None, f"logs-{f.name}")
        else:
            add(p, None, None, f"logs-{p.name}")
    host = socket.gethostname()
    for proc in ctx.procs:
        rank = proc.rank if proc.role == "rank" else None
        for fd, label in ((1, "stdout"), (2, "stderr")):
            add(Path(f"/proc/{proc.pid}/fd/{fd}"), rank, proc.pid, f"{proc.role}{'' if rank is None else rank}-{proc.pid}-{label}")
        target = (proc.env or {}).get("NCCL_DEBUG_FILE", "")
        if target:
            add(Path(target.replace("%h", host).replace("%p", str(proc.pid))), rank, proc.pid,
                f"nccl-{proc.pid}")
    return found


def _read_tail(path: Path, nbytes: int) -> tuple[bytes, int]:
    """The last ``nbytes`` of a file, starting at a line boundary; and the file's size."""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        start = max(0, size - nbytes)
        fh.seek(start)
        data = fh.read(nbytes)
    if start > 0:
        nl = data.find(b"\n")
        data = data[nl + 1:] if nl >= 0 else b""
    return data, size


PROBE = LogsProbe()
