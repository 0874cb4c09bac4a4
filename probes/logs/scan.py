"""Streaming scan of one log file against the signature library (``patterns/*.yaml``).

Why streaming: job logs reach gigabytes (NCCL_DEBUG=INFO at scale, weeks of step lines). A file
is read line by line with a cap on line length (a NUL-filled hole or a progress bar without a
newline must not become one huge string), every signature's hits are counted but only the first
few per signature are kept as events, and aggregates (NCCL versions per host, transports,
loss scales) are folded in as lines go by. Memory stays flat whatever the file size.

Why NUL runs read as line breaks: a hole of NULs is what a log holds where a crashed node never
flushed its pages, or where a writer kept its offset over a truncated file; the text after the hole
starts a record of its own, and a hole of any size must neither count toward the line cap nor hide
that text (the OOM line after a crash is the evidence that matters most).

Why a prefilter: each signature names literal ``needle``s that every matching line contains; the
library (:mod:`.library`) rejects most lines on those before any signature regex runs.

Besides signatures, three small state machines follow the line stream: Python tracebacks (one per
``[rankN]:`` stream, so interleaved ranks do not mix), torchrun's failure summary (the
``Failures:`` / ``Root Cause`` block with rank, exit code and signal), and line prefixes
(``[rankN]:``, ``[defaultN]:``, ``[1,N]<stdout>:``, NCCL's ``host:pid:tid [dev]``).
"""

from __future__ import annotations

import calendar
import functools
import itertools
import os
import re
import signal as _signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from doctor.probes.common.text import EXC_LINE, RUNTIME_PREFIX, TB_START, strip_prefixes

from doctor.evidence.redact import scrub

from .library import Library, Signature, library
from .survival import PROGRESS_KIND, RECOVERED_KIND, Survival

MAX_LINE = 8192            # bytes of one line looked at; the rest of a longer line is skipped
EVENTS_PER_SIG = 20        # events kept per signature and file (all hits are still counted)
MAX_TRACEBACKS = 64        # tracebacks kept per file
MAX_EXITS = 4096           # rank exits kept per file
TEXT_CHARS = 300           # characters of a line kept in an event
_INT_FIELDS = {
    "rank", "rank2", "pid", "seq", "seq2", "timeout_ms", "ran_ms", "numel_in", "numel_out",
    "exitcode", "signum", "code", "last_enqueued", "last_completed", "world_size", "joined",
    "local_rank", "done", "count", "seconds", "nranks", "comm_rank", "cuda_dev", "nvml_dev",
    "status", "worker", "root", "size", "size2", "got", "expected", "value", "total_vm_kb",
    "anon_rss_kb", "bytes", "port",
}
_FLOAT_FIELDS = {"scale", "scale2", "attempted", "attempted2"}


# -- line prefixes, hosts, times -------------------------------------------------------------

# torchrun --tee: "[default0]:"; torch's excepthook / TORCH_LOGS: "[rank0]:" (scripts: "[rank0] "); OpenMPI
# --tag-output: "[1,3]<stdout>:"; prefixes nest ("[default1]:[rank1]:V1202 ...").
_NCCL = re.compile(r"^(?:\[\d{4}-\d\d-\d\d [\d:.]+\] )?(?P<host>[A-Za-z0-9][\w.-]*):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\](?: [\w./-]+:\d+)? NCCL (?P<level>INFO|WARN|TRACE|ABORT|ERROR)\b")
_SYSLOG_HOST = re.compile(r"^(?:[A-Z][a-z]{2} +\d+ \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT[\d:.]+(?:[+-]\d\d:?\d\d|Z)?) (?P<host>[\w.-]+) kernel:")
_IN_MSG_RANK = re.compile(r"\[(?:PG ID \d+ PG GUID [^\]]*? )?Rank (?P<rank>\d+)\]")
# The process group a ProcessGroupNCCL line speaks for: logPrefix() writes "[PG ID <uid> PG GUID
# <guid>(<desc>) Rank <r>]" since torch 2.3 ("[PG <uid> Rank <r>]" in 2.2); older lines name no
# group. Sequence numbers count per group, so timeouts are compared within one group only.
# source: torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (ProcessGroupNCCL::createLogPrefix)
_PG = re.compile(r"\[PG (?:ID )?(?P<uid>\d+)(?: PG GUID (?P<guid>[^\s(\]]+)(?:\((?P<desc>[^)\]]*)\))?)? Rank \d+\]")
_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug",
                                       "Sep", "Oct", "Nov", "Dec"), 1)}
_T_ISO = re.compile(r"(?P<y>\d{4})-(?P<mo>\d\d)-(?P<d>\d\d)[ T_](?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:[.,](?P<f>\d+))?")
_T_GLOG = re.compile(r"(?:^|\[)[IWEF](?P<mo>\d\d)(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)\.(?P<f>\d+)")
_T_DMESG_T = re.compile(r"^\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?P<mon>[A-Z][a-z]{2}) +(?P<d>\d+) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d) (?P<y>\d{4})\]")
_T_SYSLOG = re.compile(r"^(?P<mon>[A-Z][a-z]{2}) +(?P<d>\d+) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d) ")


def parse_time(line: str, year: int) -> tuple[str, float | None]:
    """(the time as written, epoch seconds or None) from the first timestamp near the line's start.

    Formats: ISO / Python logging / torchrun's failure summary (``2026-12-02_13:21:08``), glog
    (``W1202 13:21:08.794000``, no year: ``year`` is assumed), ``dmesg -T``, syslog/journal.
    The epoch is computed as UTC; logs from one host compare correctly, across hosts only as
    well as their clocks agree.
    """
    head = line[:160]
    for rx, has_year in ((_T_ISO, True), (_T_GLOG, False), (_T_DMESG_T, True), (_T_SYSLOG, False)):
        m = rx.search(head) if rx is not _T_SYSLOG and rx is not _T_DMESG_T else rx.match(head)
        if not m:
            continue
        g = m.groupdict()
        mo = int(g["mo"]) if g.get("mo") else _MONTHS.get(g.get("mon") or "", 0)
        y = int(g["y"]) if has_year and g.get("y") else year
        try:
            ts = calendar.timegm((y, mo, int(g["d"]), int(g["h"]), int(g["mi"]), int(g["s"]), 0, 0, 0))
        except (ValueError, OverflowError):
            return m.group(0), None
        frac = g.get("f")
        if frac:
            ts += float("0." + frac)
        return m.group(0).lstrip("["), float(ts)
    return "", None


def signal_name(exitcode: int | None) -> str:
    """``-9`` -> ``SIGKILL`` (a negative exit code from the launcher is a signal)."""
    if exitcode is None or exitcode >= 0:
        return ""
    try:
        return _signal.Signals(-exitcode).name
    except ValueError:
        return f"SIG{-exitcode}"


# -- per-file scan state ---------------------------------------------------------------------

_TB_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
_FB_HEADER = re.compile(r"^(?P<what>Failures|Root Cause \(first observed failure\)):\s*$")
_FB_ENTRY = re.compile(r"^\[(?P<n>\d+)\]:\s*$")
_FB_FIELD = re.compile(r"^\s+(?P<key>time|host|rank|exitcode|error_file|traceback)\s*:\s*(?P<val>.*?)\s*$")
_FB_RANK = re.compile(r"^(?P<rank>\d+)(?: \(local_rank: (?P<local>\d+)\))?")
_FB_EXIT = re.compile(r"^(?P<code>-?\d+)(?: \(pid: (?P<pid>\d+)\))?(?:\s+\((?P<sig>SIG\w+)\))?")
_CASCADE_EXC = ("KeyboardInterrupt", "SignalException", "SystemExit")
_LAUNCHER_EXC = ("ChildFailedError",)


@dataclass
class _Traceback:
    rank: int | None
    line: int
    last_frame: str = ""
    frames: int = 0


@dataclass
class _FailureBlock:
    section: str = ""           # "failures" | "root"
    entry: dict[str, str] = field(default_factory=dict)
    entry_line: int = 0


@dataclass
class Scan:
    """What one log file says, small enough to keep whatever the file size."""

    path: str
    rank_hint: int | None = None
    host_hint: str | None = None
    year: int = 1970
    lines: int = 0
    long_lines: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    sig_counts: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    tracebacks: list[dict[str, Any]] = field(default_factory=list)
    n_tracebacks: int = 0
    exits: list[dict[str, Any]] = field(default_factory=list)
    ranks: set[int] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    world_size: int = 0
    nccl_versions: dict[str, set[str]] = field(default_factory=dict)   # host -> versions
    transports: set[str] = field(default_factory=set)
    ifaces: set[str] = field(default_factory=set)
    nets: set[str] = field(default_factory=set)
    nccl_hosts: set[str] = field(default_factory=set)
    init_complete: set[tuple[str, int]] = field(default_factory=set)  # (host, pid)
    comm_devices: dict[str, list[list[Any]]] = field(default_factory=dict)  # commId -> [host, pid, rank, busId]
    loss_scales: list[float] = field(default_factory=list)
    recompile_functions: dict[str, int] = field(default_factory=dict)
    pid_rank: dict[int, int] = field(default_factory=dict)
    waits: list[dict[str, Any]] = field(default_factory=list)  # every collective timeout seen
    progress: list[dict[str, Any]] = field(default_factory=list)  # NCCL queue positions (enqueued/completed)
    comm_inits: dict[str, list[Any]] = field(default_factory=dict)  # host:pid:comm -> [rank, nranks, commId, done]
    _tb: dict[Any, _Traceback] = field(default_factory=dict)
    _prev: tuple[Any, ...] | None = None  # the last line: body, lineno, rank, host, pid, hits, failed sigs
    _stamp: str = ""  # the container runtime's timestamp of the current line, if any
    _labels: bool = False  # lines carry srun --label task numbers
    _fb: _FailureBlock = field(default_factory=_FailureBlock)
    _survival: Survival = field(default_factory=Survival)
    _progress_seen: set[str] = field(default_factory=set)  # progress signatures past EVENTS_PER_SIG
    _progress_full: bool = False  # all of them: step lines are skipped unless an error waits

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path, "lines": self.lines, "long_lines": self.long_lines,
            "events": self.events, "sig_counts": self.sig_counts, "counts": self.counts,
            "tracebacks": self.tracebacks, "n_tracebacks": self.n_tracebacks, "exits": self.exits,
            "ranks": sorted(self.ranks), "hosts": sorted(self.hosts), "world_size": self.world_size,
            "nccl_versions": {h: sorted(v) for h, v in self.nccl_versions.items()},
            "transports": sorted(self.transports), "nets": sorted(self.nets), "ifaces": sorted(self.ifaces),
            "nccl_hosts": sorted(self.nccl_hosts),
            "init_complete": len(self.init_complete), "comm_devices": self.comm_devices,
            "loss_scales": self.loss_scales[-2000:], "recompile_functions": self.recompile_functions,
            "pid_rank": {str(k): v for k, v in self.pid_rank.items()}, "waits": self.waits,
            "progress": self.progress, "comm_inits": self.comm_inits,
            **self._survival.summary(),
        }


def iter_lines(path: Path, max_line: int = MAX_LINE) -> Iterator[tuple[bytes, bool]]:
    """Yield (bytes of the line, capped; True when the line was longer and cut) without ever
    holding more than one capped line in memory. A run of NULs is kept as one NUL byte and does
    not count toward the cap, so the text after a hole of any size is still read."""
    with open(path, "rb") as fh:
        while True:
            raw = fh.readline(max_line)
            if not raw:
                return
            if b"\x00" in raw and not raw.endswith(b"\n"):
                raw = _read_past_nuls(fh, raw, max_line)
            if len(raw) >= max_line and not raw.endswith(b"\n"):
                _skip_rest(fh)
                yield raw, True
            else:
                yield raw, False


_NULS = re.compile(rb"\x00+")


def _read_past_nuls(fh: IO[bytes], raw: bytes, max_line: int) -> bytes:
    """Go on reading a line whose capped start holds NULs until it ends or holds ``max_line``
    bytes of its own; each NUL run shrinks to one byte (the scanner's line break)."""
    raw = _NULS.sub(b"\x00", raw)
    while len(raw) < max_line and not raw.endswith(b"\n"):
        if raw.endswith(b"\x00"):
            _skip_nuls(fh)
        more = fh.readline(max_line - len(raw))
        if not more:
            break
        raw = _NULS.sub(b"\x00", raw + more)
    return raw


_HOLE = bytes(1 << 20)


def _skip_nuls(fh: IO[bytes]) -> None:
    """Advance past a run of NULs in 1 MiB reads (a sparse 2 GiB hole costs no memory); a chunk
    all NULs is told by one memcmp, which keeps a hole as cheap to skip as a newline search."""
    while True:
        chunk = fh.read(len(_HOLE))
        if not chunk:
            return
        if chunk == _HOLE:
            continue
        nuls = len(chunk) - len(chunk.lstrip(b"\x00"))
        if nuls < len(chunk):
            fh.seek(nuls - len(chunk), os.SEEK_CUR)
            return


def _skip_rest(fh: IO[bytes]) -> None:
    """Skip the rest of an overlong line (a binary blob, a progress bar) in 1 MiB reads, up to
    its newline or a NUL hole (whose text after it is a record of its own)."""
    while True:
        chunk = fh.read(1 << 20)
        if not chunk:
            return
        nl, nul = chunk.find(b"\n"), chunk.find(b"\x00")
        ends = [i for i in (nl + 1 if nl >= 0 else -1, nul) if i >= 0]
        if ends:
            fh.seek(min(ends) - len(chunk), os.SEEK_CUR)
            return


def _convert(name: str, value: str | None) -> Any:
    if value is None:
        return None
    if name in _INT_FIELDS:
        try:
            return int(value)
        except ValueError:
            return value
    if name in _FLOAT_FIELDS:
        try:
            return float(value)
        except ValueError:
            return value
    return value.strip()[:200]


def scan_file(path: Path, rel: str, rank_hint: int | None = None, host_hint: str | None = None,
              year: int | None = None, reference: bool = False) -> Scan:
    """Scan one file; see the module docstring.

    ``reference`` reads every line through :func:`_line_reference`, the plain form of the
    per-line step with none of :func:`_line`'s shortcuts: tests check that both give the same
    scan on every fixture, so a shortcut can never change what a log says."""
    lib = library()
    step = _line_reference if reference else _line
    if year is None:
        try:
            year = time.gmtime(path.stat().st_mtime).tm_year
        except OSError:
            year = time.gmtime().tm_year
    scan = Scan(rel, rank_hint, host_hint, year)
    lines = iter_lines(path)
    head = list(itertools.islice(lines, 200))  # read once: decides srun labels, then is scanned
    scan._labels = _srun_labelled([raw.decode("utf-8", errors="replace") for raw, _ in head])
    lineno = 0
    for raw, cut in itertools.chain(head, lines):
        lineno += 1
        if cut:
            scan.long_lines += 1
        if b"\x00" in raw and not raw.replace(b"\x00", b"").strip():
            continue
        text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        # Progress bars rewrite the line with \r, and text after a NUL hole starts a record of
        # its own: each segment is a line of its own.
        if "\r" in text or "\x00" in text:
            for seg in _SEGMENT.split(text):
                if seg:
                    step(scan, lib, seg, lineno)
        elif text:
            step(scan, lib, text, lineno)
    scan.lines = lineno
    _flush_block(scan)
    for key in list(scan._tb):
        _end_traceback(scan, key, None, lineno)
    scan._survival.apply(scan.events, scan.tracebacks, scan.exits)
    return scan


# srun --label puts the task number before every line ("3: RuntimeError: ..."); with one task
# per rank, as torch jobs under srun run, it is the rank. Only taken when most of a file's first
# lines carry it, since "12: " can also start an ordinary line.
_SRUN_LABEL = re.compile(r"(?P<task>\d{1,6}): ")
_SEGMENT = re.compile("[\r\x00]")


def _srun_labelled(head: list[str]) -> bool:
    lines = [ln for ln in head if ln.strip()]
    return len(lines) >= 3 and sum(bool(_SRUN_LABEL.match(ln)) for ln in lines) >= 0.8 * len(lines)


_FB_STARTS = ("Failures", "Root Cause")


def _line(scan: Scan, lib: Library, line: str, lineno: int) -> None:
    """One line (or ``\\r``/NUL segment): what :func:`_line_reference` does, with the work a line
    cannot need skipped by tests that cost less than the work (most lines of a log are step lines
    and INFO chatter that carry no prefix, start no traceback and hold no needle)."""
    first = line[:1]
    if first.isdigit():
        stamp = RUNTIME_PREFIX.match(line)
        scan._stamp = (stamp.group("ts") or "") if stamp else ""
    else:
        scan._stamp = ""
    label = _SRUN_LABEL.match(line) if scan._labels else None
    if label:
        line = line[label.end():]
        first = line[:1]
    # strip_prefixes only ever removes a prefix that starts with a digit or "["
    body, prefix_rank = strip_prefixes(line) if first == "[" or first.isdigit() else (line, None)
    if label and prefix_rank is None:
        prefix_rank = int(label.group("task"))
    host, pid = _host_pid(scan, body)
    if prefix_rank is not None:
        scan.ranks.add(prefix_rank)
        stream_rank: int | None = prefix_rank
    else:
        stream_rank = scan.rank_hint
    if scan._tb or body.startswith(TB_START):  # no open traceback and none starting: nothing to do
        _traceback_step(scan, body, prefix_rank, stream_rank, lineno)
    if scan._fb.section or body.startswith(_FB_STARTS):
        _block_step(scan, body, lineno)
    # a step line nobody waits for: _hit would drop it, so its keywords are not looked up
    quiet = scan._progress_full and not scan._survival.counts(prefix_rank)
    cands = lib.candidates(body, quiet)
    if quiet and cands and any(s.role != "context" and s.kind not in (PROGRESS_KIND, RECOVERED_KIND) for s in cands):
        # an error on this line starts the wait for progress before the line's own step is
        # looked at (library order, as in _line_reference), so its step keywords count here
        cands = lib.candidates(body)
    if cands and len(cands) == 1 and cands[0].kind == PROGRESS_KIND and not _progress_wanted(scan, cands[0], prefix_rank):
        cands = []  # the same, for a keyword other needles share ("step"): the regex need not run
    hits, failed = _matches(lib, cands, body) if cands else _NONE
    prev = scan._prev
    scan._prev = (body, lineno, prefix_rank, host, pid, hits, failed)
    if prev is not None and prev[2] == prefix_rank and len(prev[0]) >= 30 and body \
            and not _RECORD_START.match(body) and (prev[6] or failed or lib.may_cross(prev[0], body)):
        # as in _line_reference; a seam with no failed needle on either side and no needle that
        # can cross the break has no candidates (see seam_candidates), so it is not tried
        hits = _seam(scan, lib, prev, body, hits, failed, host, pid)
    for sig, m in hits:
        _hit(scan, sig, m, body, lineno, prefix_rank, host, pid)


# NCCL's "host:pid:tid [dev] NCCL <level>" prefix after a tag other tools put first: pdsh/clush
# ("node3: node3:812:812 [0] NCCL INFO ..."), mpirun --timestamp-output ("Fri Aug 11 12:31:45
# 2023[1,0]<stdout>:node3:812:..."), a log shipper's time or a container name. The host must start
# the line or follow a space, ':', ']', '>' or '|', so the tag's own name is never taken for it.
# source: NVIDIA/nccl src/debug.cc (ncclDebugLog: "%s:%d:%d [%d] " hostname, pid, tid, cudaDev);
# pdsh(1) and clush(1) prefix each output line with "<host>: "
_NCCL_TAGGED = re.compile(r"(?:^|(?<=[\s:\]>|]))(?P<host>[A-Za-z0-9][\w.-]{0,252}):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\](?: [\w./-]+:\d+)? NCCL (?:INFO|WARN|TRACE|ABORT|ERROR)\b")
#: How far into a line NCCL's prefix may start behind such a tag (bounds the search on long lines).
_NCCL_TAG_REACH = 400


def _host_pid(scan: Scan, body: str) -> tuple[str | None, int | None]:
    """The host (and NCCL's pid) a line names: NCCL's "host:pid:tid" prefix or syslog's host.

    NCCL's prefix is looked for at the line's start first (the common case, one anchored match),
    then behind a tag that pdsh/clush, mpirun's timestamps or a log collector put before it: those
    tools are how multi-host NCCL output is usually gathered, and without the host the per-host
    facts (logs.nccl.hosts, version per host, culprit hosts) stay empty.
    """
    at = body.find(" NCCL ")
    if at >= 0:
        m = _NCCL.match(body)
        if m is None and at <= _NCCL_TAG_REACH:
            # only the head up to the level word is searched: linear in the line's length
            m = _NCCL_TAGGED.search(body, 0, at + 12)
        if m:
            scan.nccl_hosts.add(m.group("host"))
            return m.group("host"), int(m.group("pid"))
    elif "kernel:" in body[:80]:
        m = _SYSLOG_HOST.match(body)
        if m:
            return m.group("host"), None
    return None, None


def _seam(scan: Scan, lib: Library, prev: tuple[Any, ...], body: str,
          hits: list[tuple[Signature, re.Match[str]]], failed: list[Signature],
          host: str | None, pid: int | None) -> list[tuple[Signature, re.Match[str]]]:
    """Try the signatures on the previous line and this one joined (see :func:`_line_reference`);
    returns this line's hits less those the joined message shadows."""
    joined = prev[0] + " " + body
    seen = {sig.kind for sig, _ in prev[5] + hits}
    sigs = [sig for sig in seam_candidates(lib, prev[0], body, prev[6] + failed) if sig.kind not in seen]
    shadowed: set[str] = set()
    for sig, m in _matches(lib, sigs, joined)[0]:
        shadowed.update(sig.shadows)
        _hit(scan, sig, m, joined, prev[1], prev[2], prev[3] or host, prev[4] or pid)
    return [(sig, m) for sig, m in hits if sig.kind not in shadowed] if shadowed else hits


def _line_reference(scan: Scan, lib: Library, line: str, lineno: int) -> None:
    """The per-line step in its plain form (every test run on every line): the specification
    :func:`_line` must agree with."""
    stamp = RUNTIME_PREFIX.match(line) if line[:1].isdigit() else None
    scan._stamp = (stamp.group("ts") or "") if stamp else ""
    label = _SRUN_LABEL.match(line) if scan._labels else None
    if label:
        line = line[label.end():]
    body, prefix_rank = strip_prefixes(line)
    if label and prefix_rank is None:
        prefix_rank = int(label.group("task"))
    host, pid = _host_pid(scan, body)
    stream_rank = prefix_rank if prefix_rank is not None else scan.rank_hint
    if stream_rank is not None and prefix_rank is not None:
        scan.ranks.add(prefix_rank)
    _traceback_step(scan, body, prefix_rank, stream_rank, lineno)
    _block_step(scan, body, lineno)
    cands = lib.candidates(body)
    hits, failed = _matches(lib, cands, body) if cands else _NONE
    prev = scan._prev
    scan._prev = (body, lineno, prefix_rank, host, pid, hits, failed)
    if prev is not None and prev[2] == prefix_rank and wraps(prev[0], body):
        # A message soft-wrapped over two lines (pasted from a terminal, a notebook, a ticket):
        # signatures are tried on the two lines joined, when a needle spans the break or a
        # needle's regex failed on one line alone, and only for kinds neither line showed; the
        # whole message says more than this line's part of it (its shadows drop this line's hits).
        hits = _seam(scan, lib, prev, body, hits, failed, host, pid)
    for sig, m in hits:
        _hit(scan, sig, m, body, lineno, prefix_rank, host, pid)


_NONE: tuple[list[Any], list[Signature]] = ([], [])  # a line without candidates (never mutated)


def _matches(lib: Library, cands: list[Signature], body: str
             ) -> tuple[list[tuple[Signature, re.Match[str]]], list[Signature]]:
    """The signatures that match (one per kind, shadowed kinds dropped) and those whose needle
    was there but whose regex did not match (the rest may be on the next line)."""
    if not cands:
        return [], []
    seen_kinds: set[str] = set()
    shadowed: set[str] = set()
    hits, failed = [], []
    for sig in cands:
        m = sig.regex.search(body)
        if not m:
            failed.append(sig)
            continue
        if sig.kind in seen_kinds:
            continue
        seen_kinds.add(sig.kind)
        shadowed.update(sig.shadows)
        hits.append((sig, m))
    return [(sig, m) for sig, m in hits if sig.kind not in shadowed], failed


# A line that starts a record of its own (a timestamp, a log level, a launcher or NCCL prefix,
# a traceback line) is not the wrapped rest of the line before it.
_RECORD_START = re.compile(r"(?:\s|\[(?:\s*\d+\.\d+\]|\d{4}-\d\d|\d\d:\d\d|(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) |rank\d|default\d"
                           r"|\d+,\d+\]|[A-Za-z][\w .:/-]*\])|[=*#~_-]{3}|\d{4}-\d\d|[IWEFV]\d{4} |[\w.-]+:\d+:\d+ |(?:INFO|WARN|WARNING|ERROR|DEBUG|CRITICAL)\b"
                           r"|Traceback \(|File \")")


def wraps(prev: str, cur: str) -> bool:
    """Could ``cur`` be the rest of ``prev`` wrapped at a terminal's or an editor's width?

    (A DataLoader shared-memory error pasted over three lines made this necessary:
    https://github.com/fastai/docker-containers/issues/21.)"""
    return len(prev) >= 30 and bool(cur) and not _RECORD_START.match(cur)


def seam_candidates(lib: Library, prev: str, cur: str, failed: list[Signature]) -> list[Signature]:
    """Signatures to try on ``prev + " " + cur``: those with a needle across the break, and
    ``failed`` (a needle on one line whose regex needs the other)."""
    tail, head = prev[-lib.longest:], cur[:lib.longest]
    across = lib.needles_in(tail + " " + head)
    if across:
        across -= lib.needles_in(tail) | lib.needles_in(head)
    sigs = {sig.id: sig for sig in failed}
    for n in across:
        for sig in lib.by_needle.get(n, ()):
            sigs[sig.id] = sig
    return sorted(sigs.values(), key=lambda sig: lib.order[sig.id])


@functools.lru_cache(maxsize=1024)
def _scrubbed(text: str) -> str:
    """``scrub`` of an event's line, remembered: the same lines recur in every rank's log and in
    every block of a ticket that quotes them, and scrubbing costs more than scanning a line."""
    return scrub(text)


def _hit(scan: Scan, sig: Signature, m: re.Match[str], body: str, lineno: int,
         prefix_rank: int | None, host: str | None, pid: int | None) -> None:
    sv = scan._survival
    if sig.kind == PROGRESS_KIND and not _progress_wanted(scan, sig, prefix_rank):
        return
    scan.sig_counts[sig.id] = scan.sig_counts.get(sig.id, 0) + 1
    scan.counts[sig.kind] = scan.counts.get(sig.kind, 0) + 1
    snap = None
    if sig.kind == PROGRESS_KIND:
        sv.progress(prefix_rank, m.group("counter"))
        if scan.sig_counts[sig.id] > EVENTS_PER_SIG:
            return  # step lines are most of a long log: past the kept events, only the counters
    elif sig.kind == RECOVERED_KIND:
        sv.recovered()
    elif sig.role != "context":
        snap = sv.kind_hit(sig.kind, prefix_rank)
    fields = {k: _convert(k, v) for k, v in m.groupdict().items() if v is not None}
    rank = fields.get("rank") if isinstance(fields.get("rank"), int) else None
    if rank is None and sig.kind != "desync_lagging":
        rank = prefix_rank
        if rank is None:
            mm = _IN_MSG_RANK.search(body[:300])
            rank = int(mm.group("rank")) if mm else scan.rank_hint
    if rank is not None and sig.kind not in ("desync_lagging", "duplicate_gpu", "collective_mismatch"):
        scan.ranks.add(rank)
    host = host or fields.get("host") or scan.host_hint
    if host:
        scan.hosts.add(host)
    _aggregate(scan, sig, fields, host, pid, rank, body)
    if scan.sig_counts[sig.id] > EVENTS_PER_SIG:
        return
    when, ts = parse_time(body, scan.year)
    if not when and scan._stamp:  # the collector's timestamp, when the line has none of its own
        when, ts = parse_time(scan._stamp, scan.year)
    if snap is not None:
        sv.mark(len(scan.events), snap)
    scan.events.append({
        "sig": sig.id, "kind": sig.kind, "role": sig.role, "severity": sig.severity,
        "priority": sig.priority, "rank": rank, "host": host or "", "file": scan.path,
        "line": lineno, "time": when, "ts": ts, "text": _scrubbed(body.strip())[:TEXT_CHARS],
        "fields": fields, "pid": pid if pid is not None else fields.get("pid") if isinstance(fields.get("pid"), int) else None,
    })


def _progress_wanted(scan: Scan, sig: Signature, stream: int | None) -> bool:
    """Step lines are most of a long log: past the first EVENTS_PER_SIG of a signature, one is
    counted only while an error waits for progress (survival.py); the rest are not hits."""
    n = scan.sig_counts.get(sig.id, 0)
    if n == EVENTS_PER_SIG - 1:  # this hit fills the signature's events
        scan._progress_seen.add(sig.id)
        scan._progress_full = library().quiet_ids <= scan._progress_seen
    return n < EVENTS_PER_SIG or scan._survival.counts(stream)


def pg_of(body: str) -> str:
    """The process group a watchdog line names ('0', '0(default_pg)'), '' when it names none."""
    if "[PG " not in body:
        return ""
    m = _PG.search(body[:400])
    if not m:
        return ""
    return m.group("uid") + (f"({m.group('desc')})" if m.group("desc") else "")


def _aggregate(scan: Scan, sig: Signature, f: dict[str, Any], host: str | None, pid: int | None,
               rank: int | None, body: str = "") -> None:
    """Fold every hit (not only the kept events) into the file's aggregates."""
    k = sig.kind
    if k in ("watchdog_timeout", "gloo_timeout"):
        if len(scan.waits) < MAX_EXITS:
            scan.waits.append({"rank": rank, "host": host or "", "backend": "gloo" if k == "gloo_timeout" else "nccl",
                               "seq": f.get("seq"), "op": f.get("op"), "numel_in": f.get("numel_in"),
                               "timeout_ms": f.get("timeout_ms"), "ran_ms": f.get("ran_ms"), "pg": pg_of(body)})
    elif k in ("watchdog_progress", "dump_signal"):
        # where this rank's NCCL queue stood when the watchdog fired (its own timeout) or when a
        # peer's timeout asked it to dump: the pg_status triple of the flight recorder, in a log
        if isinstance(f.get("last_enqueued"), int) and isinstance(f.get("last_completed"), int) \
                and len(scan.progress) < MAX_EXITS:
            scan.progress.append({"rank": rank, "host": host or "", "pg": pg_of(body),
                                  "seq": f.get("seq") if isinstance(f.get("seq"), int) else None,
                                  "last_enqueued": f["last_enqueued"], "last_completed": f["last_completed"],
                                  "own": k == "watchdog_progress"})
    elif k == "nccl_version" and f.get("nccl_version"):
        scan.nccl_versions.setdefault(host or "", set()).add(str(f["nccl_version"]))
    elif k == "nccl_transport" and f.get("transport"):
        scan.transports.add("/".join(str(f["transport"]).split("/")[:2]))  # P2P/IPC, NET/IB, SHM/direct
    elif k == "nccl_net" and f.get("net"):
        scan.nets.add(str(f["net"]))
    elif k in ("nccl_init_complete", "nccl_init_start"):
        if k == "nccl_init_complete":
            scan.init_complete.add((host or "", pid or 0))
        key = f"{host or ''}:{pid or 0}:{f.get('comm')}"
        if f.get("comm") and (len(scan.comm_inits) < MAX_EXITS or key in scan.comm_inits):
            # each communicator's start and completion (NCCL src/init.cc prints both with the
            # comm pointer): a start never completed is a rank stuck in communicator setup
            rec = scan.comm_inits.setdefault(key, [f.get("comm_rank"), f.get("nranks"), str(f.get("comm_id") or ""), False])
            rec[3] = rec[3] or k == "nccl_init_complete"
        if isinstance(f.get("nranks"), int):
            scan.world_size = max(scan.world_size, f["nranks"])
        if f.get("comm_id") and f.get("bus_id") is not None:
            rows = scan.comm_devices.setdefault(str(f["comm_id"]), [])
            row = [host or "", pid or 0, f.get("comm_rank"), str(f["bus_id"])]
            if len(rows) < 1024 and row not in rows:
                rows.append(row)
    elif k == "nccl_bootstrap" and f.get("iface"):
        scan.ifaces.add(str(f["iface"]))
    elif k == "fp16_skip":
        scale = f.get("scale", f.get("scale2"))
        if isinstance(scale, float):
            scan.loss_scales.append(scale)
            if len(scan.loss_scales) > 4000:
                del scan.loss_scales[:2000]
    elif k == "recompile" and f.get("function"):
        fn = str(f["function"])
        if fn in scan.recompile_functions or len(scan.recompile_functions) < 50:
            scan.recompile_functions[fn] = scan.recompile_functions.get(fn, 0) + 1
    elif k == "rank_exit" and sig.id == "elastic_failed_exit":
        _add_exit(scan, {"rank": None, "local_rank": f.get("local_rank"), "pid": f.get("pid"),
                         "exitcode": f.get("exitcode"), "signal": signal_name(f.get("exitcode")),
                         "host": host or "", "root_cause": True, "source": "launcher"})
    elif k == "rank_exit" and sig.id == "slurm_task_failed":
        tasks = str(f.get("tasks", ""))
        what = str(f.get("what", ""))
        sig_name = {"Killed": "SIGKILL", "Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT",
                    "Terminated": "SIGTERM", "Bus error": "SIGBUS"}.get(what, "")
        for t in _expand_tasks(tasks):
            _add_exit(scan, {"rank": t, "local_rank": None, "pid": None,
                             "exitcode": f.get("exitcode") if isinstance(f.get("exitcode"), int) else None,
                             "signal": sig_name, "host": host or "", "root_cause": False, "source": "slurm"})
    if isinstance(f.get("world_size"), int):
        scan.world_size = max(scan.world_size, f["world_size"])


def _expand_tasks(spec: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        if "-" in part:
            a, _, b = part.partition("-")
            if a.isdigit() and b.isdigit() and int(b) - int(a) < 100000:
                out.extend(range(int(a), int(b) + 1))
        elif part.isdigit():
            out.append(int(part))
    return out[:MAX_EXITS]


def _add_exit(scan: Scan, ex: dict[str, Any]) -> None:
    if len(scan.exits) < MAX_EXITS:
        if ex.get("exitcode") not in (0, None):
            scan._survival.mark_exit(len(scan.exits))
        scan.exits.append(ex)


# -- tracebacks ------------------------------------------------------------------------------

def _traceback_step(scan: Scan, body: str, prefix_rank: int | None, stream_rank: int | None,
                    lineno: int) -> None:
    key = prefix_rank
    tb = scan._tb.get(key)
    if body.startswith(TB_START):
        if tb is not None:
            _end_traceback(scan, key, None, lineno)
        scan._tb[key] = _Traceback(stream_rank, lineno)
        return
    if tb is None:
        return
    m = _TB_FRAME.match(body)
    if m:
        tb.frames += 1
        tb.last_frame = f"{m.group('file')}:{m.group('line')} in {m.group('func').strip()}"
        return
    if not body.strip() or body.startswith((" ", "\t")):
        if lineno - tb.line > 400:  # a lost traceback (output cut): forget it
            del scan._tb[key]
        return
    m = EXC_LINE.match(body.strip())
    if m and tb.frames:
        _end_traceback(scan, key, m, lineno)
    elif lineno - tb.line > 400 or not tb.frames:
        del scan._tb[key]


def _end_traceback(scan: Scan, key: Any, m: re.Match[str] | None, lineno: int) -> None:
    tb = scan._tb.pop(key, None)
    if tb is None or m is None:
        return
    scan.n_tracebacks += 1
    etype = m.group("type")
    msg = (m.group("msg") or "").strip()
    short = etype.rsplit(".", 1)[-1]
    kinds, roles = _message_kinds(msg)
    if short in _LAUNCHER_EXC or short.endswith("Warning"):
        # a warning printed with its stack (warnings turned into tracebacks, logging's
        # stack_info) says nothing failed
        role = "context"
    elif short in _CASCADE_EXC or ("cascade" in roles and "first_failure" not in roles):
        role = "cascade"
    else:
        role = "first_failure"
    if tb.rank is not None:
        scan.ranks.add(tb.rank)
    rec = {
        "rank": tb.rank, "exc_type": etype, "message": scrub(msg)[:TEXT_CHARS],
        "last_frame": tb.last_frame[-200:], "role": role, "file": scan.path, "line": tb.line,
        "exc_line": lineno, "kinds": kinds,
    }
    if len(scan.tracebacks) < MAX_TRACEBACKS:
        if role == "first_failure":
            scan._survival.mark_traceback(len(scan.tracebacks), key)
        scan.tracebacks.append(rec)


def _message_kinds(msg: str) -> tuple[list[str], set[str]]:
    """The signature kinds and roles an exception message matches: a message that only matches
    cascade signatures (closed peer, timeout) is what a rank sees when *another* rank failed."""
    if not msg:
        return [], set()
    hits = [s for s in library().candidates(msg) if s.regex.search(msg)]
    return sorted({s.kind for s in hits}), {s.role for s in hits}


# -- torchrun failure summary ----------------------------------------------------------------

def _block_step(scan: Scan, body: str, lineno: int) -> None:
    """Follow torchrun's failure summary: headers, ``[n]:`` entries, ``key : value`` fields."""
    fb = scan._fb
    if not fb.section and not body.startswith(("Failures", "Root Cause")):
        return
    m = _FB_HEADER.match(body)
    if m:
        _flush_block(scan)
        fb.section = "root" if m.group("what").startswith("Root") else "failures"
        return
    if not fb.section:
        return
    if _FB_ENTRY.match(body):
        _flush_block(scan)
        fb.entry_line = lineno
        return
    m = _FB_FIELD.match(body)
    if m:
        fb.entry[m.group("key")] = m.group("val")
        return
    _flush_block(scan)
    if not (body.startswith("----") or not body.strip() or "<NO_OTHER_FAILURES>" in body):
        fb.section = ""  # "====" closes the summary; anything else means we lost track of it


def _flush_block(scan: Scan) -> None:
    """Turn the failure-summary entry read so far into a rank exit."""
    fb = scan._fb
    e = fb.entry
    fb.entry = {}
    if not e:
        return
    mr = _FB_RANK.match(e.get("rank", ""))
    mx = _FB_EXIT.match(e.get("exitcode", ""))
    code = int(mx.group("code")) if mx else None
    pid = int(mx.group("pid")) if mx and mx.group("pid") else None
    rank = int(mr.group("rank")) if mr else None
    local = int(mr.group("local")) if mr and mr.group("local") else None
    if rank is not None:
        scan.ranks.add(rank)
        if pid is not None:
            scan.pid_rank[pid] = rank
    host = e.get("host") or scan.host_hint or ""
    if host:
        scan.hosts.add(host)
    when, ts = parse_time(e.get("time", ""), scan.year)
    _add_exit(scan, {
        "rank": rank, "local_rank": local, "pid": pid, "exitcode": code,
        "signal": (mx.group("sig") if mx and mx.group("sig") else signal_name(code)),
        "host": host, "root_cause": fb.section == "root", "source": "launcher",
        "time": when, "ts": ts, "line": fb.entry_line,
    })
