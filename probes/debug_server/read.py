"""Reading what torch's distributed debug server writes (``torch.distributed.debug``, torch 2.13+).

Two shapes carry the same content. The periodic dumps of its frontend (``start_debug_server(
dump_dir=...)``) are text files named ``<handler>_<YYYYmmdd>_<HHMMSS>.txt``: for the per-rank
handlers (stacks, py-spy, wait counters, torchcomms health) one ``=== Rank N: <worker url> ===``
section per rank, preceded by a ``PARTIAL DATA: k/n workers responded`` summary (one
``  Rank N: <error>`` line per rank that failed) when some rank did not answer; a failed rank's
section body is ``Error: <http status>``. The frontend's HTTP routes (``/stacks``,
``/pyspy_dump``, ``/fr_trace_json``, ...) answer HTML pages with one ``<h2>Rank N: <url></h2>``
per rank followed by ``<pre>`` (the rank's answer) or ``<p>Failed to fetch: status=S</p>`` and a
``<pre>`` with the error. ``tcpstore`` is one ``key: value`` line per store key, where
``debug_server/rankN`` holds each rank's worker url.

Why the failures matter: every rank runs its worker server in its own process, so a rank whose
server refuses the connection has exited (or never started it), and one that times out is alive
but not answering; either is evidence no stack of that rank can show.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: Worker endpoint (in the section's url) -> the frontend's name for that kind of dump.
ENDPOINTS = {
    "dump_traceback": "stacks",
    "pyspy_dump": "pyspy_dump",
    "wait_counter_values": "wait_counters",
    "fr_trace_json": "fr_trace_json",
    "dump_nccl_trace_json": "fr_trace_nccl_json",
    "torchcomms_fr_trace_json": "torchcomms_fr_trace",
    "torchcomms_health_check": "torchcomms_health_check",
    "torch_profile": "profile",
}

_DUMP_SECTION = re.compile(r"^=== Rank (\d{1,6}): (\S*) ===\s*$")
_HTML_SECTION = re.compile(r"^\s*<h[23]>Rank (\d{1,6}): (\S*?)</h[23]>\s*$")
_PARTIAL = re.compile(r"^PARTIAL DATA: (\d+)/(\d+) workers responded\s*$")
_PARTIAL_RANK = re.compile(r"^  Rank (\d{1,6}): (.*)$")
_ERROR_BODY = re.compile(r"^Error: (\d{3})\s*$")
_HTML_FAILED = re.compile(r"^\s*<p>Failed to fetch: status=(\d{3})</p>\s*$")
_URL = re.compile(r"^https?://\[?([^\]/:?]+)\]?(?::(\d+))?(/handler/([\w]+))?")
_STORE_WORKER = re.compile(r"^\s*debug_server/rank(\d{1,6}): b'(https?://[^']*)'\s*$")
_STAMP = re.compile(r"_(\d{8})_(\d{6})\.txt$")
_FR_TABLES = "=== FR Trace ==="
_FR_TABLES_HEADS = (_FR_TABLES, "=== TorchComms FR Trace ===")
HTML_MARK = "<h1>Torch Distributed Debug Server</h1>"


@dataclass
class Failure:
    """A rank the frontend could not get an answer from."""

    rank: int
    status: int  # the frontend's status: 408 timeout, 503 connection error, 502 other
    kind: str  # refused | timeout | error
    reason: str


@dataclass
class ServerDump:
    """One periodic dump file or one saved route page."""

    route: str  # stacks, pyspy_dump, wait_counters, fr_trace_json, fr_trace, tcpstore, ...
    form: str  # dump (periodic text file) | html (a route's page)
    stamp: str = ""  # dump time from the file name, 'YYYY-MM-DD HH:MM:SS'
    urls: dict[int, str] = field(default_factory=dict)  # rank -> worker url
    answered: list[int] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    world_size: int = 0  # sections (the frontend asks every rank of the job) or store workers
    bodies: dict[int, str] = field(default_factory=dict)  # rank -> its answer (fr_trace_json only)
    notes: list[str] = field(default_factory=list)


def sniff_text(text: str) -> bool:
    """A debug-server dump or page, from its first lines."""
    # bounded finds over the first 8 KiB, the head copied only for a file that passes them
    if text.find(HTML_MARK, 0, 8192) != -1:
        return True
    # Every other shape carries one of these literals; one scan each rules out most files (this
    # runs on every file of a folder, 16,384 stack dumps at scale) before any line is split.
    if text.find("/handler/", 0, 8192) == -1 and text.find("PARTIAL DATA", 0, 8192) == -1 \
            and text.find("debug_server/rank", 0, 8192) == -1 and not text.startswith(_FR_TABLES_HEADS):
        return False
    head = text[:8192]
    lines = head.splitlines()[:60]
    if any(_DUMP_SECTION.match(ln) and "/handler/" in ln for ln in lines):
        return True
    if lines and (_PARTIAL.match(lines[0]) or lines[0].startswith(_FR_TABLES_HEADS)):
        return True
    return sum(1 for ln in lines if _STORE_WORKER.match(ln)) >= 1 and all(": " in ln for ln in lines[:5] if ln)


def failure_kind(status: int, reason: str) -> str:
    """refused (the rank's worker server is gone), timeout (alive, not answering), or error."""
    low = reason.lower()
    if status == 408 or "timeout" in low:
        return "timeout"
    if status == 503 or "connect call failed" in low or "connection refused" in low or "cannot connect" in low:
        return "refused"
    return "error"


def stamp_from_name(name: str) -> str:
    m = _STAMP.search(name)
    if not m:
        return ""
    d, t = m.group(1), m.group(2)
    return f"{d[:4]}-{d[4:6]}-{d[6:]} {t[:2]}:{t[2:4]}:{t[4:]}"


def host_of(url: str) -> str:
    m = _URL.match(url)
    return m.group(1) if m else ""


def _route_of(urls: dict[int, str], text: str, form: str) -> str:
    for url in urls.values():
        m = _URL.match(url)
        if m and m.group(4):
            return ENDPOINTS.get(m.group(4), m.group(4))
    if any(h in text[:65536] for h in _FR_TABLES_HEADS):
        return "fr_trace"
    return "unknown"


def parse_dump(text: str, name: str) -> ServerDump:
    """Read one dump file or route page (whichever ``text`` is)."""
    form = "html" if HTML_MARK in text[:8192] else "dump"
    lines = text.splitlines()
    store_workers = {int(m.group(1)): m.group(2) for m in map(_STORE_WORKER.match, lines[:100000]) if m}
    partial: dict[int, str] = {}
    for ln in lines[:10000]:
        m = _PARTIAL_RANK.match(ln)
        if m:
            partial[int(m.group(1))] = m.group(2).strip()[:300]
        elif _DUMP_SECTION.match(ln) or _HTML_SECTION.match(ln):
            break
    section = _HTML_SECTION if form == "html" else _DUMP_SECTION
    out = ServerDump(route="", form=form, stamp=stamp_from_name(name))
    cur: int | None = None
    body: list[str] = []
    status: dict[int, int] = {}

    def close() -> None:
        if cur is None:
            return
        joined = "\n".join(body)
        if cur not in status:
            for ln in [b for b in body if b.strip()][:2]:
                m = _ERROR_BODY.match(ln.strip()) or _HTML_FAILED.match(ln)
                if m:
                    status[cur] = int(m.group(1))
                    break
        if cur in status:
            reason = partial.get(cur) or _pre_text(body) or f"HTTP {status[cur]}"
            out.failures.append(Failure(cur, status[cur], failure_kind(status[cur], reason), reason[:300]))
        else:
            out.answered.append(cur)
            out.bodies[cur] = _pre_text(body) if form == "html" else joined

    for ln in lines:
        m = section.match(ln)
        if m:
            close()
            cur, body = int(m.group(1)), []
            out.urls[cur] = m.group(2)
            continue
        if cur is not None:
            body.append(ln)
    close()
    if store_workers and not out.urls:
        out.route, out.urls = "tcpstore", dict(sorted(store_workers.items()))
        out.world_size = max(store_workers) + 1
    else:
        out.route = _route_of(out.urls, text, form)
        out.world_size = max(out.urls) + 1 if out.urls else 0
    # a PARTIAL DATA line for a rank whose section is missing (a cut file) still names it
    for rank, reason in partial.items():
        if rank not in out.urls:
            out.failures.append(Failure(rank, 0, failure_kind(0, reason), reason))
    if out.route != "fr_trace_json":
        out.bodies = {}
    if out.route == "fr_trace":
        m = _PARTIAL.match(lines[0]) if lines else None
        out.world_size = int(m.group(2)) if m else 0
        out.answered = sorted(set(range(out.world_size)) - {f.rank for f in out.failures}) if m else []
        out.notes.append("flight-recorder tables (torch's own summary) are not analysed here; "
                         "the /fr_trace_json page or each rank's dump is")
    elif not out.urls:
        out.notes.append("no rank sections found")
    return out


def _pre_text(body: list[str]) -> str:
    """The text inside a section's ``<pre>`` (the rank's answer or the frontend's error)."""
    joined = "\n".join(body)
    start = joined.find("<pre>")
    if start < 0:
        return joined.strip() if not any("<p>" in ln for ln in body) else ""
    end = joined.find("</pre>", start)
    return joined[start + 5:end if end >= 0 else len(joined)].strip()
