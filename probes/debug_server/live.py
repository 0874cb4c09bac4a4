"""Live: ask a running job's debug server (``torch.distributed.debug.start_debug_server``).

No ptrace, no signal: the job serves its own stacks. The frontend on rank 0 fans a request out to
every rank's worker server and waits up to its own ``fetch_timeout`` (60 s by default) for the
slowest one, which would spend a diagnosis's whole budget on one dead rank. So the frontend is
asked only for its ``/tcpstore`` page (the worker url every rank registered, no fan-out), and the
workers are asked directly, in parallel, each with its own short timeout; a rank that refuses or
does not answer in time becomes a failure line like the frontend's own ``PARTIAL DATA`` summary.
The result is written in the frontend's periodic-dump format, so one reader serves both.
Only when the store page cannot be had is the frontend's ``/stacks`` page fetched whole.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from doctor.evidence.contract import CollectContext, ProbeFailed, ProbeSkipped

from .read import HTML_MARK as PAGE_MARK
from .read import parse_dump

DEFAULT_URL = "http://localhost:25999"
#: Longest wait for one worker; a rank slower than this is reported as not answering.
WORKER_TIMEOUT = 5.0
MAX_ANSWER = 16 * 1024 * 1024


def _get(url: str, timeout: float, post: bool = False) -> tuple[int, str]:
    """(status, text); status 408 for a timeout and 503 for a refused connection, as the
    frontend itself reports them."""
    req = urllib.request.Request(url, data=b"" if post else None, method="POST" if post else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - http(s) only, checked by the caller
            return int(resp.status), resp.read(MAX_ANSWER).decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), f"HTTPError: {exc.code} {exc.reason}"
    except (TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            return 408, f"Timeout: no answer within {timeout:g} s"
        return 503, f"ConnectionError: {reason}"


def fan_out(workers: dict[int, str], endpoint: str, timeout: float) -> dict[int, tuple[int, str]]:
    """Every worker's answer to ``/handler/<endpoint>``, asked in parallel."""
    ranks = sorted(workers)
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(ranks)))) as pool:
        answers = list(pool.map(lambda r: _get(f"{workers[r]}/handler/{endpoint}?", timeout, post=True), ranks))
    return dict(zip(ranks, answers, strict=True))


def as_dump(workers: dict[int, str], endpoint: str, answers: dict[int, tuple[int, str]]) -> str:
    """The answers in the frontend's periodic-dump layout (``StacksHandler.dump``)."""
    failed = [(r, text) for r, (status, text) in sorted(answers.items()) if status != 200]
    parts: list[str] = []
    if failed:
        parts.append(f"PARTIAL DATA: {len(answers) - len(failed)}/{len(answers)} workers responded")
        parts += [f"  Rank {r}: {text.splitlines()[0] if text else ''}" for r, text in failed]
        parts.append("")
    for r in sorted(answers):
        status, text = answers[r]
        parts.append(f"=== Rank {r}: {workers[r]}/handler/{endpoint}? ===")
        parts.append(text if status == 200 else f"Error: {status}")
    return "\n".join(parts) + "\n"


def collect(ctx: CollectContext) -> dict[str, Any]:
    url = str(ctx.options.get("debug_server") or DEFAULT_URL).rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ProbeFailed(f"debug server url must start with http:// or https:// (got {url!r})")
    timeout = max(0.5, min(float(ctx.timeout or WORKER_TIMEOUT), WORKER_TIMEOUT))
    stamp = time.strftime("%Y%m%d_%H%M%S")
    status, page = _get(f"{url}/tcpstore", timeout)
    if status == 503 or (status != 200 and "debug_server" not in ctx.options and PAGE_MARK not in page):
        raise ProbeSkipped(f"no debug server at {url} (torch.distributed.debug.start_debug_server not started, "
                           "or another host/port: --debug-server URL)")
    store = parse_dump(page, "tcpstore.html") if status == 200 else None
    workers = dict(store.urls) if store is not None and store.route == "tcpstore" else {}
    if not workers:  # the store page failed: the frontend's own fan-out, bounded by our timeout
        status, page = _get(f"{url}/stacks", timeout * 2)
        if status != 200:
            raise ProbeFailed(f"debug server at {url}: /tcpstore and /stacks failed ({page.splitlines()[0][:200]})")
        ctx.add(f"stacks_{stamp}.html", page)
        return {"url": url, "ranks": 0, "via": "frontend"}
    stacks = fan_out(workers, "dump_traceback", timeout)
    ctx.add(f"stacks_{stamp}.txt", as_dump(workers, "dump_traceback", stacks))
    fr = fan_out({r: u for r, u in workers.items() if stacks[r][0] != 503}, "fr_trace_json", timeout)
    n_fr = 0
    for rank, (status, text) in sorted(fr.items()):
        if status != 200 or not text.lstrip().startswith("{"):
            continue
        try:
            entries = json.loads(text).get("entries")
        except ValueError:
            continue
        if entries:  # the recorder is on: the flight-recorder kind reads it as this rank's dump
            ctx.add(f"fr_trace_rank{rank}.json", text, rank=rank, kind="flight_recorder",
                    meta={"source": f"{workers[rank]}/handler/fr_trace_json"})
            n_fr += 1
    failed = sorted(r for r, (s, _) in stacks.items() if s != 200)
    return {"url": url, "ranks": len(workers), "answered": len(workers) - len(failed), "not_answering": failed,
            "fr_dumps": n_fr}
