"""Pieces every text reader shares: launcher prefixes (``[rank3]:``) that interleave ranks in
one file, ``RANK=`` lines, and telling native frames from Python ones.
"""

from __future__ import annotations

import re

PREFIX = re.compile(r"^\[([^\[\]\n]{1,40})\]:")
_PREFIX_RANK = re.compile(r"^(?:rank)?(\d{1,6})$", re.I)
_PREFIX_LOCAL = re.compile(r"^[A-Za-z_][\w.-]*?(\d{1,6})$")
RANK_LINE = re.compile(
    r"^\s*(?:export\s+)?(?:RANK|SLURM_PROCID|OMPI_COMM_WORLD_RANK|PMI_RANK)\s*[=:]\s*(\d{1,6})\s*$"
    r"|^\W*\brank\s*[:=#]?\s*(\d{1,6})\W*$", re.I)


def search_lines(rx: re.Pattern[str], text: str, needle: str) -> bool:
    """``bool(rx.search(text))`` for a multiline pattern anchored at ``^`` whose matches never
    cross a newline and always contain ``needle``: only the lines holding the needle are tried.

    Why: the sniffing patterns start with an optional launcher prefix, so ``re`` has no literal
    to skip ahead with and tries the pattern at every character of the text (a few microseconds
    per 16k-rank dump, and all of a 64 KiB log sample that holds no dump); ``str.find`` skips to
    the candidate lines instead. The answer is the same: every match starts at a line start, and
    each line that holds the needle is matched from its start."""
    i = text.find(needle)
    while i != -1:
        start = text.rfind("\n", 0, i) + 1  # in multiline mode ``^`` holds after a newline
        if rx.match(text, start):
            return True
        end = text.find("\n", i)
        if end == -1:
            return False
        i = text.find(needle, end + 1)
    return False


def is_native_file(file: str) -> bool:
    return not (file.endswith((".py", ".pyw", ".pyx")) or file.startswith("<"))


def clean_native(name: str) -> str:
    """``c10d::Work::wait(std::chrono...)`` -> ``c10d::Work::wait``; hex addresses stay."""
    if "(" in name and not name.startswith("("):
        cut = name.find("(")
        if cut > 0:
            name = name[:cut]
    return name[:200]


def split_streams(lines: list[str]) -> list[tuple[str | None, list[str]]]:
    """Demultiplex launcher-prefixed lines (``[rank3]:``, ``[default0]:``) into one stream per
    prefix; a file without such prefixes is one stream."""
    head = lines[:2000]
    if not any(ln.startswith("[") for ln in head):
        return [(None, lines)]
    nonempty = [ln for ln in head if ln.strip()]
    prefixed = sum(1 for ln in nonempty if ln.startswith("[") and PREFIX.match(ln))
    if not nonempty or prefixed < 0.3 * len(nonempty):
        return [(None, lines)]
    streams: dict[str | None, list[str]] = {}
    for ln in lines:
        m = PREFIX.match(ln)
        if m:
            streams.setdefault(m.group(1), []).append(ln[m.end():])
        else:
            streams.setdefault(None, []).append(ln)
    # torchrun's tee prefix is "[default0]:", the excepthook's "[rank0]: " (one more space):
    # drop a space only when every line of the stream has it
    for key, stream in streams.items():
        if key is not None and all(ln.startswith(" ") for ln in stream if ln.strip()):
            streams[key] = [ln[1:] for ln in stream]
    return list(streams.items())


#: A rank's section in what torch's distributed debug server writes: its periodic
#: ``stacks_<date>_<time>.txt`` dumps (``=== Rank 3: <worker url> ===``) and its route pages
#: (``<h2>Rank 3: <worker url></h2>`` then a ``<pre>``) put every rank's stacks one after
#: another, so the header is the only thing that says whose threads follow.
SECTION = re.compile(r"^(?:=== Rank (\d{1,6}): \S*.* ===|\s*<h[23]>Rank (\d{1,6}): \S*</h[23]>)\s*$")
_SERVER_STACKS = re.compile(r"(?m)^(?:=== Rank \d{1,6}: |\s*<h[23]>Rank \d{1,6}: )\S*/handler/(?:dump_traceback|pyspy_dump)\b")


def is_server_stacks(text: str) -> bool:
    """A debug-server stacks or py-spy dump (periodic file or route page), from its head."""
    return bool(_SERVER_STACKS.search(text[:65536]))


def split_sections(lines: list[str]) -> list[tuple[str | None, list[str]]] | None:
    """One stream per debug-server rank section (named ``rankN`` like a launcher prefix), or None
    when the text has no such header. Lines before the first header (a ``PARTIAL DATA`` summary,
    a page's head) are not a rank's; a page's ``<pre>`` tags are dropped, and so is a failed
    rank's ``<p>Failed to fetch`` line (its error text is no stack)."""
    if not any(SECTION.match(ln) for ln in lines[:200000] if "Rank " in ln):
        return None
    out: list[tuple[str | None, list[str]]] = []
    cur: list[str] = []
    key: str | None = None
    for ln in lines:
        m = SECTION.match(ln) if "Rank " in ln else None
        if m:
            if key is not None:
                out.append((key, cur))
            key, cur = f"rank{m.group(1) or m.group(2)}", []
            continue
        if key is None:
            continue
        bare = ln.strip()
        if bare.startswith("<pre>"):
            ln = bare[5:]
        if ln.rstrip().endswith("</pre>"):
            ln = ln.rstrip()[:-6]
        if bare.startswith("<p>Failed to fetch") or bare in ("</section>", "</pre>"):
            continue
        cur.append(ln)
    if key is not None:
        out.append((key, cur))
    return out


def rank_from_prefix(prefix: str | None) -> tuple[int | None, int | None]:
    """(global rank, local rank) named by a launcher prefix."""
    if not prefix:
        return None, None
    m = _PREFIX_RANK.match(prefix)
    if m:
        return int(m.group(1)), None
    m = _PREFIX_LOCAL.match(prefix)
    if m:
        return None, int(m.group(1))
    return None, None
