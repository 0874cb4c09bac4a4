"""The stacks probe's fast paths give exactly what the plain code gives, on every fixture.

Each shortcut taken for 16k-rank folders (bench/bench_stacks.py) has a slow twin it must agree
with: a line-by-line search against ``re.search``, the warm frame-line cache against a cold one,
the cached thread classification against a fresh one, the os-level sample read against
``open().read()``, the header shortcut of ``mostly_dump`` against the line test it skips. The
inputs are every file under tests/fixtures (dumps, and the logs, tickets and JSON a sniff must
turn down) plus edge cases written here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from doctor.probes.stacks import summary
from doctor.probes.stacks.formats import (  # the slow twin's pieces
    _PLAIN_DUMP,
    SNIFF_PYSPY,
    SNIFF_PYSPY_FRAME,
    _dump_line,
    mostly_dump,
    parse_text,
)
from doctor.probes.stacks.formats import pyspy as pyspy_mod
from doctor.probes.stacks.formats.common import search_lines

from doctor.evidence.contract import SNIFF_BYTES, Sample

from .conftest import FIXTURES


def _texts() -> list[tuple[str, str]]:
    out = []
    for p in sorted(FIXTURES.rglob("*")):
        if p.is_file() and p.stat().st_size <= 4 << 20:
            out.append((p.relative_to(FIXTURES).as_posix(), p.read_bytes().decode("utf-8", errors="replace")))
    return out


TEXTS = _texts()

EDGES = [
    "",
    "Thread ",
    "Thread 1 (idle)",  # a match on the last line, no newline after it
    'x Thread 1 (idle)\nThread 0x1F (active+gil): "MainThread"\n',  # needle first on a line that fails
    "[rank3]: Thread 12 (idle)\n",
    "[rank3]:\tThread 12 (gil)\r\n",
    "\n\nThread 12 (idle+gil)",
    "Thread Thread 1 (idle)\n",
    "    \n    x\n    main (a.py:3)\n",
    "[default0]:    f (a.py:1)",
    "    f (a.py:1)\r\n    g (b.py)\n",
    "  f (a.py:1)\n\t    g (x)\n",
    "    f(no space)\n    f (a (b) c)\n",
    "    (x)\n    \u2028 f (x)\n",
]


@pytest.mark.parametrize(("rx", "needle"), [(SNIFF_PYSPY, "Thread "), (SNIFF_PYSPY_FRAME, "    ")])
def test_search_lines_is_re_search(rx: re.Pattern[str], needle: str) -> None:
    hits = 0
    for name, text in TEXTS + [(f"edge {i}", t) for i, t in enumerate(EDGES)]:
        for t in (text, text[:65536], text[:4096]):
            want = bool(rx.search(t))
            assert search_lines(rx, t, needle) is want, name
            hits += want
    assert hits > 20  # the fixtures hold py-spy dumps: both answers were exercised


def _pyspy_texts() -> list[tuple[str, str]]:
    return [(n, t) for n, t in TEXTS if SNIFF_PYSPY.search(t)]


def test_frame_line_cache_changes_nothing() -> None:
    """Cold cache, warm cache, and a cache primed with other dumps' lines: one parse."""
    texts = _pyspy_texts()
    assert len(texts) > 10
    cold = []
    for _, text in texts:
        pyspy_mod._FRAME_LINES.clear()
        cold.append(repr(parse_text(text)))
    for _, text in texts:  # primes the cache with every file's lines
        parse_text(text)
    warm = [repr(parse_text(text)) for _, text in texts]
    assert warm == cold
    # --locals lines are never cached (they are where secrets live)
    assert not any(k.startswith("        ") for k in pyspy_mod._FRAME_LINES)


def test_cached_classification_is_a_fresh_one() -> None:
    seen = 0
    for _, text in _pyspy_texts():
        for proc in parse_text(text)[0]:
            for t in proc.threads:
                summary.summarize(t)  # fills the cache
                hit = summary.summarize(t)
                fresh = summary._summarize(t)
                assert hit == fresh
                seen += 1
    assert seen > 50


def _mostly_dump_plain(lines: list[str]) -> bool:
    """mostly_dump without its header shortcut, as it read before."""
    n = total = 0
    prev = False
    for ln in lines:
        bare = ln.lstrip()
        if not bare or bare.startswith("```"):
            continue
        total += 1
        prev = ln.startswith(_PLAIN_DUMP) or _dump_line(ln) or (prev and ln[0] in " \t")
        n += prev
    return bool(total) and n >= 0.5 * total


def test_mostly_dump_shortcut_agrees() -> None:
    extra = ["    ", "    ```", "Thread 1 (idle)", "   ", "```", "Process 1: x", "\tf (a.py:1)", "log line"]
    for name, text in TEXTS + [("edges", "\n".join(extra)), ("edges2", "\n".join(extra[::-1]))]:
        lines = text.splitlines()[:2000]
        assert mostly_dump(lines) is _mostly_dump_plain(lines), name


def test_sample_read_is_a_buffered_read(tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(SNIFF_BYTES * 3 + 17))
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    files = [p for p in sorted(FIXTURES.rglob("*")) if p.is_file()][:400] + [big, empty]
    for p in files:
        with open(p, "rb") as fh:
            want = fh.read(SNIFF_BYTES)
            size = os.fstat(fh.fileno()).st_size
        s = Sample.read(p)
        assert (s.raw, s.size, s.name) == (want, size, p.name), p
        assert s.is_binary == (b"\x00" in want[:4096] and not want.startswith(b"\x80"))
    with pytest.raises(IsADirectoryError) as exc:
        Sample.read(tmp_path)
    assert exc.value.filename == tmp_path
    with pytest.raises(FileNotFoundError):
        Sample.read(tmp_path / "missing")
