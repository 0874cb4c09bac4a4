"""Every dump format the stacks probe reads, one module each; this module picks the reader per
launcher stream (a file can interleave ranks) and tells a dump from a log that merely holds one.
"""

from __future__ import annotations

import re

from doctor.probes.stacks.formats.common import (
    PREFIX,
    RANK_LINE,
    SECTION,
    is_server_stacks,
    rank_from_prefix,
    search_lines,
    split_sections,
    split_streams,
)
from doctor.probes.stacks.formats.faulthandler import (
    FH_FRAME,
    FH_NEW_DUMP,
    FH_OTHER,
    FH_STACK,
    SNIFF_FH,
    parse_faulthandler,
)
from doctor.probes.stacks.formats.gdb import (
    GDB_FRAME,
    GDB_PROMPT,
    SNIFF_GDB,
    SNIFF_GDB_BARE,
    parse_gdb,
)
from doctor.probes.stacks.formats.ide import IDE_FRAME, IDE_OTHER, ide_frames, parse_ide
from doctor.probes.stacks.formats.pyspy import (
    PS_PROCESS,
    SNIFF_PYSPY,
    SNIFF_PYSPY_FRAME,
    parse_pyspy_text,
)
from doctor.probes.stacks.formats.pyspy_json import parse_json
from doctor.probes.stacks.formats.traceback import (
    SNIFF_TB,
    TB_FRAME,
    TB_HEAD,
    TB_THREAD,
    interrupted,
    parse_pytb,
    pybt_entry,
    tb_is_exception,
)
from doctor.probes.stacks.model import RawProc

JSON_START = re.compile(r"^\s*(\[\s*[\{\]]|\{)")


def parse_text(text: str) -> tuple[list[RawProc], list[str]]:
    """Every process dump in a text file, whatever the format; prefixed streams demultiplexed.

    Exposed for other evidence kinds (a log probe can hand it an embedded faulthandler dump).
    """
    notes: list[str] = []
    lines = text.splitlines()
    streams = split_sections(lines) if "Rank " in text and is_server_stacks(text) else None
    if text and not text.endswith("\n") and lines and streams is None:
        # an unterminated last line is a cut-off file: keep it only when it is a whole frame
        # (the debug server writes its dumps without a final newline: no sign of a cut there)
        notes.append("file ends mid-line (truncated); parsed what is there")
    out: list[RawProc] = []
    if streams is None:
        streams = split_streams(lines) if text.startswith("[") or "\n[" in text else [(None, lines)]
    for prefix, stream in streams:
        rank, local = rank_from_prefix(prefix)
        joined_head = text[:65536] if prefix is None else "\n".join(stream[:400])
        if search_lines(SNIFF_PYSPY, joined_head, "Thread ") or any(PS_PROCESS.match(ln) for ln in stream[:50]):
            procs = parse_pyspy_text(stream, notes)
        elif SNIFF_FH.search(joined_head):
            procs = parse_faulthandler(stream, notes)
        elif SNIFF_GDB.search(joined_head) or SNIFF_GDB_BARE.search(joined_head):
            procs = parse_gdb(stream, notes)
        elif SNIFF_TB.search(joined_head) and not tb_is_exception(stream):
            procs = parse_pytb(stream, notes)
        elif "KeyboardInterrupt" in joined_head or (prefix is None and "KeyboardInterrupt" in text):
            # a Ctrl-C on a stuck job: where the main thread was (formats/traceback.interrupted)
            inner, bare = _unnest(stream)
            kbi = interrupted(bare)
            procs = parse_pytb(kbi, notes) if kbi else []
            for p in procs:
                p.fmt = "keyboard_interrupt"
                if rank is None and inner is not None:
                    p.rank, p.rank_source = inner, "prefix"
        elif ide_frames(stream[:400]) >= 2:
            procs = parse_ide(stream, notes)
        else:
            procs = []
        for p in procs:
            if rank is not None:
                p.rank, p.rank_source = rank, "prefix"
            elif local is not None:
                p.local_rank = local
        out.extend(procs)
    if notes and notes[0].startswith("file ends") and out:
        out[-1].truncated = True
    return out, notes


def has_interrupted(text: str) -> bool:
    """Does some launcher stream of this text hold a traceback that ends in KeyboardInterrupt
    (see :func:`doctor.probes.stacks.formats.traceback.interrupted`)? Asked only of texts that
    name KeyboardInterrupt, so a log without one costs a substring search."""
    lines = text.splitlines()
    streams = split_streams(lines) if text.startswith("[") or "\n[" in text else [(None, lines)]
    return any(interrupted(_unnest(stream)[1]) for _, stream in streams)


def _unnest(stream: list[str]) -> tuple[int | None, list[str]]:
    """A launcher stream whose lines carry a second prefix (torchrun --tee's ``[default0]:`` around
    torch's excepthook ``[rank0]: ``): the global rank the inner prefix names, and the lines
    without it."""
    rank: int | None = None
    out = []
    for ln in stream:
        m = PREFIX.match(ln) if ln.startswith("[") else None
        if m:
            r, _ = rank_from_prefix(m.group(1))
            if r is not None:
                rank = r if rank is None else rank
                ln = ln[m.end():]
                ln = ln[1:] if ln.startswith(" ") else ln
        out.append(ln)
    return rank, out


def mostly_dump(lines: list[str]) -> bool:
    """A log with a dump inside belongs to the log reader unless the dump is most of it (seen: a
    console log of a GPU test run with one py-spy dump among its lines). Indented lines right
    after a dump line (a wrapped gdb frame, a traceback frame's source line) count with it;
    markdown fences around a pasted dump count for nothing."""
    n = total = 0
    prev = False
    for ln in lines:
        # py-spy frames and headers, the bulk of a dump, answer before any regex is tried; a
        # header starts with a letter, so only an indented line can be blank or a fence
        if ln.startswith(_PLAIN_DUMP):
            if ln[0] == " ":
                bare = ln.lstrip()
                if not bare or bare.startswith("```"):
                    continue
            total += 1
            n += 1
            prev = True
            continue
        bare = ln.lstrip()  # one strip per line: blank lines and fences count for nothing
        if not bare or bare.startswith("```"):
            continue
        total += 1
        prev = _dump_line(ln) or (prev and ln[0] in " \t")
        n += prev
    return bool(total) and n >= 0.5 * total


#: Line starts that make a dump line whatever follows (see ``_dump_line``); none is a prefix.
_PLAIN_DUMP = ("    ", "Process ", "Python v", "Parent Process ", "Thread ")


def _dump_line(ln: str) -> bool:
    """Is this line part of a stack dump (py-spy, faulthandler, gdb) rather than other log text?"""
    m = PREFIX.match(ln)
    if m:
        ln = ln[m.end():]
        ln = ln[1:] if ln.startswith(" ") and not ln.startswith("  File") else ln
    if ln.startswith("    ") or ln.startswith(("Process ", "Python v", "Parent Process ", "Thread ")):
        return True  # py-spy frames, locals and headers
    return bool(FH_FRAME.match(ln) or FH_STACK.match(ln) or FH_NEW_DUMP.match(ln)
                or GDB_FRAME.match(ln) or ln.startswith(("[New LWP", "[Thread debugging", "[Inferior ", "Current thread "))
                or RANK_LINE.match(ln) or SECTION.match(ln) or (FH_OTHER.match(ln) and ln.strip())
                or GDB_PROMPT.match(ln) or TB_FRAME.match(ln) or TB_HEAD.match(ln.strip())
                or TB_THREAD.match(ln.strip()) or pybt_entry(ln) is not None
                or ("!" in ln and IDE_FRAME.match(ln)) or IDE_OTHER.match(ln))


__all__ = ["JSON_START", "has_interrupted", "interrupted", "is_server_stacks", "SNIFF_FH", "SNIFF_GDB", "SNIFF_GDB_BARE", "SNIFF_PYSPY", "SNIFF_PYSPY_FRAME", "SNIFF_TB", "ide_frames",
           "mostly_dump", "parse_json", "parse_text", "search_lines", "tb_is_exception"]
