"""Route pages of torch's distributed debug server, split per rank (shared by evidence kinds).

The frontend (``torch.distributed.debug``, torch 2.13+) answers a route such as ``/fr_trace_json``
with one HTML page: per rank a ``<h2>Rank N: <worker url></h2>``, then either ``<pre>`` holding
that rank's answer, or ``<p>Failed to fetch: status=S</p>`` and a ``<pre>`` with the error. The
page is not escaped (its template engine runs without autoescape), so a ``<pre>`` holds the
rank's answer verbatim. Kinds that read what a rank answered (a flight-recorder dump) take it
from here; the debug_server kind reads who answered.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PAGE_MARK = "<h1>Torch Distributed Debug Server</h1>"
_HEAD = re.compile(r"<h[23]>Rank (\d{1,6}): (\S*?)</h[23]>")
_FAILED = re.compile(r"<p>Failed to fetch: status=(\d{3})</p>")


@dataclass
class RankAnswer:
    rank: int
    url: str
    status: int  # 200, or the status the frontend gave for a failed fetch
    text: str  # the answer (status 200) or the error text


def is_page(text: str, endpoint: str) -> bool:
    """A frontend page whose rank sections came from the worker endpoint ``endpoint``."""
    head = text[:65536]
    return PAGE_MARK in head and f"/handler/{endpoint}" in head


def rank_answers(text: str) -> list[RankAnswer]:
    """Every rank section of a page, in page order."""
    heads = list(_HEAD.finditer(text))
    out: list[RankAnswer] = []
    for i, m in enumerate(heads):
        chunk = text[m.end():heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        failed = _FAILED.search(chunk)
        start = chunk.find("<pre>")
        end = chunk.rfind("</pre>")
        body = chunk[start + 5:end] if 0 <= start < end else ""
        out.append(RankAnswer(int(m.group(1)), m.group(2), int(failed.group(1)) if failed else 200, body.strip()))
    return out
