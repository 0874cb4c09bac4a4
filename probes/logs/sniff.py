"""Is a file a job log? Deciding from its first and last bytes, without scanning it all.

Why this much care: the logs kind claims generic text, so it must leave alone what other kinds own
by shape (py-spy dumps, environment dumps, metrics tables, source files that quote log strings)
while still claiming a long training log whose only failure evidence is at its end, or one whose
start is a hole of NULs left by a crashed node (the OOM line after the hole is the evidence).
"""

from __future__ import annotations

import json
import re
from typing import Any

from doctor.probes.common.text import TB_START, strip_prefixes

from doctor.evidence.contract import Sample

from . import scan
from .library import Signature, library
from .live import read_tail

SNIFF_TAIL = 64 * 1024            # bytes of a file's end also looked at when sniffing

_KEYVAL = re.compile(r"^(?:export\s+|declare\s+-x\s+)?[A-Za-z_][A-Za-z0-9_]*=")
_PYSPY = re.compile(r"^Process \d+: ")
_PYSPY_B = re.compile(rb"Process [0-9]+: ")
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


#: Control bytes that do not occur in text (tab, newlines, form feed and ESC are text).
_CONTROL = bytes(b for b in range(32) if b < 9 or 13 < b < 32 and b != 27)


def _is_binary(raw: bytes) -> bool:
    """More than 5 % control bytes in the first 8 KiB (counted by ``translate``, in C: this
    runs on every file of a folder, 16k of them for a large job)."""
    sample = raw[:8192]
    if not sample:
        return False
    bad = len(sample) - len(sample.translate(None, _CONTROL))
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


def sniff(sample: Sample) -> bool:
    """Claim plain text that reads as a log: strong log shapes or a signature hit at the start or
    the end, or a log's file name with enough log words."""
    lines = text_lines(sample)
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


def also_sniff(sample: Sample) -> bool:
    """Read a file another kind owns (a trainer log the metrics probe parses for loss) when
    it also holds failure evidence: a signature hit or a traceback, at its start or end."""
    lines = text_lines(sample, allow_table=True)
    if lines is None:
        return False
    tail = _tail_lines(sample) or []
    return any(_signature_hit(part) or any(ln.startswith(TB_START) for ln in part)
               for part in (lines, tail))


_NUL_RUN = re.compile(rb"\x00+")


def _text_bytes(raw: bytes) -> bytes:
    """NUL runs read as line breaks, as the scanner reads them."""
    return _NUL_RUN.sub(b"\n", raw) if b"\x00" in raw else raw


def text_lines(sample: Sample, allow_table: bool = False) -> list[str] | None:
    """The sample's lines when it is plain text that no other kind owns by shape, else None."""
    raw = sample.raw
    if not raw or raw[:1] == b"\x80":  # pickles (flight recorder) are not logs
        return None
    if raw.startswith(b"Process ") and _PYSPY_B.match(raw):
        return None  # a py-spy dump (as below), told before decoding: 16k ranks' dumps pass here
    if sample.name.lower().endswith(_NOT_LOG_NAMES):
        return None
    text_bytes = _text_bytes(raw)
    if len(text_bytes.strip()) < 8 and b"\x00" in raw and sample.size > len(raw):
        # The sample is a hole of NULs: what the file says is after it.
        try:
            text_bytes = _text_bytes(read_tail(sample.path, len(raw))[0])
        except OSError:
            return None
    if len(text_bytes.strip()) < 8 or _is_binary(text_bytes):
        return None
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


def _body(line: str) -> str:
    """The line less its launcher prefixes (which only ever start with "[" or a digit)."""
    first = line[:1]
    return strip_prefixes(line)[0] if first == "[" or first.isdigit() else line


#: Kinds that only describe a run's progress ("step 500", a tqdm bar): the scanner needs them to
#: tell a survived error from a fatal one, but a sentence such as "training crashes at step 500"
#: holds one too, so they never make a file a log.
_NOT_CLAIMING = frozenset({"train_progress"})


def _signature_hit(lines: list[str]) -> bool:
    """Does any line, or two lines that read as one wrapped message, match a signature?

    Each line's candidates are computed once; a wrapped pair is tried only when one of its lines
    had candidates (none of them matched, or we would have returned) or a needle can cross the
    break (:meth:`.library.Library.may_cross`): otherwise the seam has no candidate to try."""
    lib = library()
    prev = ""
    prev_cands: list[Signature] = []
    for ln in lines:
        body = _body(ln)
        cands = [s for s in lib.candidates(body) if s.kind not in _NOT_CLAIMING]
        if cands and any(s.regex.search(body) for s in cands):
            return True
        if prev and (prev_cands or cands or lib.may_cross(prev, body)) and scan.wraps(prev, body):
            joined = prev + " " + body
            sigs = scan.seam_candidates(lib, prev, body, prev_cands + cands)
            if any(sig.regex.search(joined) for sig in sigs if sig.kind not in _NOT_CLAIMING):
                return True
        prev, prev_cands = body, cands
    return False


def _tail_lines(sample: Sample, nbytes: int = SNIFF_TAIL) -> list[str] | None:
    """The last lines of a file larger than its sample (None when the sample already was all)."""
    if sample.size <= len(sample.raw):
        return None
    try:
        data, _ = read_tail(sample.path, nbytes)
    except OSError:
        return None
    data = _text_bytes(data)
    if _is_binary(data):
        return None
    return data.decode("utf-8", errors="replace").splitlines()[-2000:]
