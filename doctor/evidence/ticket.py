"""Tickets and pastes as evidence: split a written document into its machine blocks and its prose.

People rarely hand over evidence files; they post an issue: a few sentences, then the log in a
fenced block, the py-spy dump in another, nvidia-smi in a ``<details>`` fold, or a chat thread
with the error pasted between messages. Read as one file, such a document is claimed by no probe
(it is neither a log nor a dump), so the evidence inside it is lost. This module undoes the
wrapping, once, for every shape we meet:

- Markdown fences (````` and ``~~~``, any language), indented code blocks, ``<pre>``/``<code>``
  HTML blocks, Jira ``{code}`` / ``{noformat}`` blocks, ``<details>`` folds (their tags go, the
  content is read like the rest);
- quoted replies (``> `` prefixes, nested too, as e-mail's ``>>``), chat prefixes (``[10:42] alice: ...``,
  Teams' ``[3/5/2024 10:42 AM] Alice Smith: ...``, ``<alice> ...``), HTML-escaped text (``&lt;`` ...);
- wrapper tags with no content of their own: Jira ``{quote}``/``{panel}``/``{color}``, Discourse
  ``[quote="alice, post:3"]``/``[details=...]``, HTML comments (StackOverflow's language hint); a
  fence inside a longer fence (a post quoting its own Markdown) is unwrapped;
- a Markdown table whose column holds log lines gives that column's lines (a table of numbers
  stays whole for the metrics reader); ``collect_env`` output pasted bare under "### Versions" is
  one block;
- bare machine lines in the prose (a traceback, NCCL lines, trainer metric lines, the shell's
  ``Killed`` / ``Segmentation fault (core dumped)``, ``terminate called after throwing``, torchrun's
  ``[WARNING]`` lines pasted without a fence) become blocks of their own; such a block never runs
  on into another quote level's or another speaker's text. An exception quoted inside a sentence
  (``... I get RuntimeError: Expected all tensors ...``) becomes a one-line block too, its sentence
  staying prose; and a short bare block no probe claims goes back to the prose (:func:`expand`),
  so the state it names ("Aborted (core dumped)" as an issue's title) is still read.

:func:`split` returns the blocks (each with its 1-based line span in the document, so a finding
can say "issue.md block 3, lines 12-40") and the prose, with every block line blanked so line
numbers still hold. The dispatcher (``doctor.engine.facts``) hands each block to the probes by
content exactly as a file, and the prose to the probe that reads symptoms. :func:`is_document`
decides, from the head of a file, whether it is such a document: a plain log must never be
re-routed, so it asks for structure a log never has (fences, quotes, chat prefixes, HTML
entities) together with prose, or, for a Markdown file or a paste, mostly prose.
"""

from __future__ import annotations

import html
import itertools
import re
import shutil
import tempfile
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from doctor.evidence.contract import SNIFF_BYTES, Hints, Sample

#: One cheap C-level search over the head decides most files: no marker, no document. This test
#: runs on every text file of a folder (16,384 stack dumps at scale), so it is two searches
#: (:func:`_marked`): the line-start markers behind their one literal "\n" prefix, which the regex
#: engine finds with a fast scan (one alternation of three branches, two of them starting with
#: "\n" and one with "&", tried its branches at every newline: four times slower on a stack dump),
#: and the HTML entities only when the text holds an "&" at all. The lookaheads only restate
#: each branch's first character, so that an indented line (every frame of a stack dump) is
#: dropped after one test per blank instead of one per alternative.
_LINE_MARKERS = re.compile(
    r"\n(?:[ \t]{0,3}(?=[`~>{<])(?:```|~~~|> |>$|\{code|\{noformat\}|<details|<pre|<code>|<summary)"
    r"|(?=[\[\d])\[?\d{1,2}:\d\d(?::\d\d)?(?:\s?[AaPp][Mm])?\]?\s+(?:<[\w.@-]+>|[A-Za-z][\w.@-]{0,30}:)\s)",
    re.M,
)
_ENTITY = re.compile(r"&(?:lt|gt|quot)")
_JSON_HEAD = re.compile(r"\s*(?:\{\s*\"|\[\s*[\[{\"\]])")  # an object, or an array of them
#: A folder's own documentation (how the evidence was captured) is not a ticket: read as one,
#: the log lines it quotes would count twice.
PROJECT_DOCS = ("readme", "license", "changelog", "contributing", "notice", "authors")
_MARKDOWN_NAMES = (".md", ".markdown")
_NOTE_NAMES = (".md", ".markdown", ".txt", ".rst")
_TABLE_RULE_ANY = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*\|", re.M)

_FENCE = re.compile(r"^[ \t]{0,3}(`{3,}|~{3,})[ \t]*([\w+#.-]*)")
_JIRA = re.compile(r"^\s*\{(code|noformat)(?::[^}]*)?\}(.*)$", re.I)
_HTML_OPEN = re.compile(r"^\s*<(pre|code)(?:\s[^>]*)?>(.*)$", re.I)
_FOLD_TAG = re.compile(r"</?(?:details|summary)(?:\s[^>]*)?>", re.I)
_QUOTE = re.compile(r"^(?:[ \t]{0,3}>(?!>>)[ \t]?)+")
#: A chat line's prefix: a time (Teams and WhatsApp put a date before it, "[3/5/2024 10:42 AM]"),
#: then a speaker ("alice:", "Alice Smith:", "<alice>"); or an IRC nick alone. A log level is
#: never a speaker: "[10:42:11] INFO: ..." is a log line and keeps its prefix.
_CHAT = re.compile(
    r"^(?:\[?(?:\d{1,4}[/.]\d{1,2}[/.]\d{2,4},?\s+)?\d{1,2}:\d\d(?::\d\d)?(?:\s?[AaPp]\.?[Mm]\.?)?\]?\s+"
    r"(?!(?:INFO|WARN(?:ING)?|ERROR|DEBUG|CRITICAL|FATAL|TRACE|NOTICE)\b)(?:<[\w.@-]+>|[A-Za-z][\w.@ -]{0,30}?:)\s"
    r"|<[\w.@-]{1,30}>\s)"
)
#: Markup around quoted or folded text that holds no content of its own: Jira ``{quote}``,
#: ``{panel}``, ``{color}``; Discourse BBCode ``[quote="alice, post:3, topic:1"]``, ``[details=...]``
#: and their closing tags; an HTML comment such as StackOverflow's ``<!-- language: lang-none -->``.
_WRAP_TAG = re.compile(r"\{(?:quote|panel(?::[^}]*)?|color(?::[^}]*)?)\}|\[/?(?:quote|details)(?:=[^\]]*)?\]|<!--.*?-->",
                       re.I)
#: Markers ``_marked`` does not look for (its search is pinned to the original alternation by
#: tests/test_dispatch_parity.py): the wrapper tags above and a chat prefix with a date.
_MORE_MARKERS = re.compile(r"^[ \t]{0,3}(?:\{(?:quote|panel)|\[(?:quote|details)[=\]]|<!--|\[\d{1,4}[/.]\d{1,2}[/.]\d{2,4},?\s+\d{1,2}:\d\d"
                           r")|^<[\w.@-]{1,30}> \S.*\n<[\w.@-]{1,30}> ",  # or two IRC lines in a row
                           re.M | re.I)
#: A log line that carries a training metric ("step 10 loss 2.31", "{'loss': nan", "loss=1.2e+00"):
#: machine output even where no other marker says so (quoted or chatted without a fence).
_METRIC = re.compile(r"(?i)\b(?:loss|lr|learning[_ ]rate|grad[_ ]?norm|gnorm|loss[_ ]scale|step|iter(?:ation)?|epoch)"
                     r"['\"]?\s*([:=|]?)\s*\[?\s*[-+]?(?:\d|nan\b|inf\b)")
#: The opening line of ``python -m torch.utils.collect_env`` output, and the shape of its lines
#: (``Key: value``, a section head ``CPU:``, ``[pip3] torch==2.5.1``, ``GPU 0: ...``, a library
#: path under ``cuDNN version: Probably one of the following:``); torch/utils/collect_env.py
#: (torch 2.13) lines 778-810 (env_info_fmt) and 829-832 (the ``[pip3] ``/``[conda] `` prefix).
_COLLECT_ENV = re.compile(r"(?:Collecting environment information\.\.\.|PyTorch version: \S)")
_COLLECT_ENV_LINE = re.compile(r"\s*(?:\[(?:pip\d?|conda)\] \S|GPU \d+: |/\S|[A-Za-z][\w ()./+-]{0,60}:(?:\s|$)"
                               r"|(?:Probably one of the following|No relevant packages|Could not collect))")
#: A Markdown table's rule row (``| --- | :---: |``).
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(?:\|\s*:?-{3,}:?\s*)*\|?\s*$")
_LIST_ITEM = re.compile(r"\s*(?:[-*+]|\d+[.)])\s+\S")
#: A chat client's header line ("alice  10:42 AM"): a speaker, not content.
_CHAT_HEADER = re.compile(r"^[A-Za-z][\w.@ -]{0,30}\s{2,}\d{1,2}:\d\d(?:\s?[AaPp][Mm])?\s*$")

#: Lines that are machine output by their start, even without a fence around them.
_STRONG = re.compile(
    r"\s*(?:\[(?:rank|default)\d+\]:|\[\d+,\d+\]<std(?:out|err)>:|Traceback \(most recent call last\):"
    r"|File \"[^\"]+\", line \d+|[\w.-]+:\d+:\d+ \[\d+\] |\[[EWIF] [\w./ -]+:\d+\]|[EWIF]\d{4} \d\d:\d\d"
    r"|\[\s*\d+\.\d+\] |\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d|\d\d:\d\d:\d\d[.,]\d+|Thread 0x[0-9a-fA-F]+"
    r"|Process \d+: |\|.*\|\s*$|\+[-=+]{6,}|[A-Za-z_][\w.]*(?:Error|Exception|Warning|Interrupt|Exit): |Exception: "
    r"|[A-Z][A-Z0-9_]{2,}=\S*\s*$|(?:INFO|WARN(?:ING)?|ERROR|DEBUG|CRITICAL)[: \]]|#\d+ +0x|\^+\s*$"
    r"|[\w<>.]+ \([^()\s]+:\d+\)\s*$|NVIDIA-SMI \d|nvidia-smi|\$ |[\w./~-]*\w\.py:\d+|[*=#~_-]{8,}\s*$"
    r"|Setting OMP_NUM_THREADS environment variable"
    # gdb's prompt and frames without an address; banners ("***** Running training *****",
    # "=====NVSMI LOG====="); aligned "key   : value" (nvidia-smi -q) and "key:    value" (lscpu)
    r"|\(gdb\) |#\d+ +[\w:<>~.]+ \(|[*=#~_-]{5,}[^*=#~_-]{1,60}[*=#~_-]{5,}\s*$|\*{3,} [^*]{1,60} \*{3,}\s*$"
    r"|[A-Za-z][^:\n]{0,60}?\S\s{2,}: \S|[A-Za-z][\w ()./-]{0,40}:\s{4,}\S"
    # how a shell reports a process that died: "Killed", "Segmentation fault (core dumped)", with
    # the script's line prefix ("./train.sh: line 1:  7364 Killed   python3 train.py") or a job
    # number ("[1]+  Killed   python train.py"); the C++ runtime's "terminate called after throwing";
    # an exception line that ends at its colon ("...errors.ChildFailedError:")
    r"|(?:\S+: line \d+: +\d+ +|\[\d+\][+-]? +)?(?:Killed|Terminated|Segmentation fault|Aborted|Bus error"
    r"|Floating point exception|Illegal instruction)(?: +\(core dumped\))?(?:\s*$|\s{2,}\S)"
    r"|terminate called (?:after throwing|without an active exception|recursively)"
    r"|[A-Za-z_][\w.]*(?:Error|Exception):\s*$)"
)
#: Text that marks a log line anywhere in it, unless the line reads as a sentence.
_WEAK = re.compile(r"NCCL (?:INFO|WARN)|ProcessGroupNCCL|Watchdog caught|CUDA error|Signal \d+ \(SIG"
                   r"|\b\w+Error: |Killed process \d+|\(core dumped\)"
                   # a level in brackets or between dashes after a logger's name or time
                   # ("torch.distributed.elastic.multiprocessing.api: [WARNING] Sending process ...",
                   # "2024-05-01 10:00:01 - INFO - ...")
                   r"|\[(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL|FATAL)\]|\s-\s(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\s-\s")
#: Words of running text: a line with several of these and few symbols is prose.
_PROSE_WORDS = re.compile(
    r"\b(?:the|a|an|is|are|was|were|we|i|it|my|our|this|that|when|with|after|but|and|to|of|on|"
    r"in|for|have|has|does|do|not|any|see|get|got|works?|job|training|hangs?|stuck|help|"
    # English function words a sentence rarely lacks and a log line rarely has several of
    r"than|so|more|other|they|them|their|there|then|because|since|until|while|before|"
    r"also|only|even|still|very|too|which|what|why|how|could|would|should|can|will|been)\b", re.I)

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff]")

MAX_BLOCKS = 500

#: An exception quoted inside a sentence ("When I start I get RuntimeError: Expected all tensors
#: to be on the same device ..."): the sentence stays prose, and the error from its class name on
#: becomes a one-line block of its own, so the log signatures read it as they would in a fence.
_INLINE_ERROR = re.compile(r"(?<![\w.])(?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception): \S.{8,}")


@dataclass(frozen=True)
class Block:
    """One piece of machine output found in a document."""

    index: int          #: 1-based, in document order
    start: int          #: first line (1-based) of the content in the document
    end: int            #: last line
    text: str
    #: fenced | indented | jira | html | table | bare | quoted | chat (bare lines under a wrapper)
    #: | inline (an exception quoted inside a sentence; its line is prose too)
    shape: str
    lang: str = ""      #: the fence's language tag, if any
    #: The line just above the block ("rank 3:", a <summary>): its rank or host names the block
    #: the way a file name would.
    label: str = ""

    def where(self, name: str) -> str:
        """Provenance as a report shows it: ``issue.md block 3, lines 12-40``."""
        span = f"line {self.start}" if self.start == self.end else f"lines {self.start}-{self.end}"
        return f"{name} block {self.index}, {span}"


@dataclass
class Document:
    """A split document: its blocks, and its prose with the block lines blanked."""

    blocks: list[Block] = field(default_factory=list)
    prose: str = ""
    n_prose: int = 0     #: prose lines (with words)
    n_machine: int = 0   #: lines inside blocks
    n_marked: int = 0    #: prose lines behind a chat prefix or a quote marker
    n_bare: int = 0      #: lines of bare blocks (machine lines with no markup around them)


def _clean(lines: list[str]) -> tuple[list[str], set[int], list[int]]:
    """Undo the wrapping that does not change line numbers (HTML entities, quote prefixes, fold
    and wrapper tags); also the indices of the quoted lines, and each line's quote depth (an
    e-mail's "> " and ">> " levels), so a block never runs on into another level's text."""
    out = []
    quoted: set[int] = set()
    depth = [0] * len(lines)
    in_quote = False  # inside a Jira {quote} or a BBCode [quote] region
    for i, ln in enumerate(lines):
        if "&" in ln:
            ln = html.unescape(ln)
        if ">" in ln[:4]:  # a quote marker sits after at most three blanks
            bare = _QUOTE.sub("", ln, count=1)
            if bare is not ln and bare != ln:
                quoted.add(i)
                depth[i] = ln[:len(ln) - len(bare)].count(">")
            ln = bare
        if "<" in ln:
            ln = _FOLD_TAG.sub("", ln)
        if "uote" in ln or "etails" in ln or "{panel" in ln or "{color" in ln or "<!--" in ln:  # cheap first
            tags = [m.group(0).lower() for m in _WRAP_TAG.finditer(ln)]
            if tags:
                ln = _WRAP_TAG.sub("", ln)
                if not ln.strip():
                    ln = ""
                for t in tags:  # Jira's {quote} both opens and closes; BBCode closes with [/quote]
                    if t == "{quote}":
                        in_quote = not in_quote
                    elif t.startswith("[quote"):
                        in_quote = True
                    elif t == "[/quote]":
                        in_quote = False
        if in_quote:
            quoted.add(i)
        out.append(ln)
    return out, quoted, depth


def _is_prose(line: str) -> bool:
    """A sentence: several common words among few tokens, little punctuation of code or paths."""
    s = line.strip()
    if len(s) < 3 or len(s) > 4000:  # a line longer than any paragraph is output, not prose
        return False
    tokens = s.split()
    words = _PROSE_WORDS.findall(s)
    # Chinese/Japanese prose has no spaces and none of the English words: a line with several
    # ideographs and little code punctuation is a sentence ("单机多卡训练时卡住，不报错也不继续训练").
    cjk = len(_CJK.findall(s))
    if cjk >= 6 and cjk >= 0.3 * len(s.replace(" ", "")):
        return sum(s.count(c) for c in "/\\;()[]{}<>=|#$") <= 0.06 * len(s) + 1
    if len(words) < 2 or len(words) < 0.2 * len(tokens) or max(len(t) for t in tokens) > 40:
        return False
    code = sum(s.count(c) for c in "/\\;()[]{}<>=|#$")
    return code <= 0.06 * len(s) + 1


def _is_machine(line: str) -> bool:
    if line[:1] == "#" and _HEADING.match(line):
        # A Markdown heading is the reporter's title: machine output only when it quotes an error
        # ("# RuntimeError: CUDA error: ..." is how many issues are titled), never for a single
        # metric mention ("# Loss spiking around epoch 30").
        return bool(_WEAK.search(line)) and not _is_prose(line)
    if _STRONG.match(line):
        return True
    return (bool(_WEAK.search(line)) or _metric_record(line)) and not _is_prose(line)


_HEADING = re.compile(r"#{1,6} +[A-Za-z]")


def _metric_record(line: str) -> bool:
    """A trainer's metric record: a metric with ":"/"=" before its number ("loss: nan",
    "loss=1.2e+00"), or two metrics with numbers ("step 10 loss 2.31"); "around epoch 30" in a
    title is one mention, not a record."""
    if not any(c.isdigit() for c in line[:400]) and "nan" not in line and "inf" not in line:
        return False
    seps = [m.group(1) for m in _METRIC.finditer(line)]
    return len(seps) >= 2 or any(seps)


def _label(lines: list[str], above: int) -> str:
    """The nearest non-blank line above line index ``above`` (at most three up), if short."""
    for k in range(above - 1, max(above - 4, -1), -1):
        text = _CHAT.sub("", lines[k], count=1).strip()
        if text:
            return text if len(text) <= 200 and not _FENCE.match(text) else ""
    return ""


#: A traceback's frame line: the line after it is the frame's source line, whatever its words.
_SOURCE_LINE = re.compile(r'\s*File "[^"]+", line \d+')


def _continues(last: str, line: str) -> bool:
    """A worded line that still belongs to the block above it: the source line under a
    traceback frame, or an indented line of code (a warning's source line, ``return f(x)``)."""
    return bool(_SOURCE_LINE.match(last)) or (line[:1] in " \t" and _INDENTED_CODE.match(line) is not None)


_INDENTED_CODE = re.compile(r"\s+(?:[\w.\[\]]+\s*=\s*)?(?:return |raise |yield |await )?[\w.]*\w\(")


def _speaker(prefix: str) -> str:
    """Who a chat prefix names ("[10:42 AM] alice: " -> "alice"), without the time."""
    m = re.search(r"<([\w.@-]+)>|([A-Za-z][\w.@ -]*?):\s*$", prefix)
    return (m.group(1) or m.group(2) or "").strip() if m else prefix.strip()


def _collect_env_end(lines: list[str], i: int) -> int:
    """Index just past a bare collect_env paste starting at ``i``: its lines are ``Key: value``
    pairs, section heads, package and GPU lines and library paths, with single blank lines
    between sections; the first line of another shape after a blank (or a heading) ends it."""
    j, n = i + 1, len(lines)
    while j < n:
        ln = lines[j]
        if not ln.strip():
            if j + 1 < n and lines[j + 1].strip() and not _COLLECT_ENV_LINE.match(lines[j + 1]):
                break
            j += 1
            continue
        if ln.lstrip().startswith(("#", "```", "~~~")) or (not _COLLECT_ENV_LINE.match(ln) and _is_prose(ln)):
            break
        j += 1
    while j > i + 1 and not lines[j - 1].strip():
        j -= 1
    return j


def _cells(row: str) -> list[str]:
    """A Markdown table row's cells; ``\\|`` is a pipe inside a cell."""
    row = row.strip()
    row = row[1:] if row.startswith("|") else row
    row = row[:-1] if row.endswith("|") and not row.endswith("\\|") else row
    return [c.replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row)]


def _cell_text(cell: str) -> list[str]:
    """A cell's text as the log had it: one pair of backticks off, ``<br>`` back to line breaks."""
    c = cell.strip()
    if len(c) >= 2 and c[0] == "`" and c[-1] == "`":
        c = c[1:-1]
    return re.split(r"<br\s*/?>", c, flags=re.I) if "<" in c else [c]


def _log_table(lines: list[str], i: int) -> tuple[int, list[str]]:
    """A Markdown table at ``i`` (header, rule, rows): the index past it, and the lines of the
    column that holds log lines (most of its cells are machine output, not numbers), or []
    when no column does (a metrics table stays whole for the metrics reader)."""
    j = i + 2
    while j < len(lines) and lines[j].lstrip().startswith("|"):
        j += 1
    rows = [_cells(r) for r in lines[i + 2:j]]
    width = max((len(r) for r in rows), default=0)
    for col in range(width):
        texts = [r[col] for r in rows if col < len(r) and r[col].strip()]
        machine = sum(1 for t in texts if any(_is_machine(x) for x in _cell_text(t)))
        if texts and machine >= max(1, 0.3 * len(texts)) and not all(_NUMBER.fullmatch(t.strip()) for t in texts):
            return j, [x for r in rows if col < len(r) for x in _cell_text(r[col])]
    return j, []


_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?%?|nan|inf", re.I)


def split(text: str) -> Document:
    """Blocks and prose of a document (see the module doc for the shapes)."""
    raw_lines = text.splitlines()
    lines, quoted, depth = _clean(raw_lines)
    n = len(lines)
    prose: list[str] = [""] * n
    doc = Document()
    spans: list[tuple[int, int, str, str, list[str]]] = []  # (start, end, shape, lang, lines) 0-based

    def close_bare(buf: list[tuple[int, str]]) -> None:
        while buf and not buf[-1][1].strip():
            buf.pop()
        if buf:
            # machine lines under a quote or a chat prefix: the wrapper is markup a log never has
            shape = "quoted" if all(k in quoted for k, _ in buf) else "chat" if bare_wrap[1] else "bare"
            spans.append((buf[0][0], buf[-1][0], shape, "", [t for _, t in buf]))
        buf.clear()

    bare: list[tuple[int, str]] = []
    bare_wrap: tuple[int, str] = (0, "")  # the quote depth and chat speaker the bare block runs under
    i = 0
    while i < n:
        ln = lines[i]
        # each opener holds its own character; most lines hold none of them
        m = _FENCE.match(ln) if "`" in ln or "~" in ln else None
        if m:
            close_bare(bare)
            mark, lang = m.group(1), m.group(2).lower()
            j = i + 1
            while j < n and not lines[j].lstrip().startswith(mark[0] * len(mark)):
                j += 1
            first, body = i + 1, lines[i + 1:j]
            while body and _FENCE.match(body[0]):  # a post quoting its own Markdown: ```` around ```
                inner = _FENCE.match(body[0]).group(1)[0]  # type: ignore[union-attr]
                last = max((k for k, b in enumerate(body) if b.strip()), default=0)
                if last == 0 or body[last].strip().strip(inner) or body[last].strip()[0] != inner:
                    break
                first, body = first + 1, body[1:last]
            spans.append((first, first + len(body) - 1, "fenced", lang, body))
            i = j + 1
            continue
        m = _JIRA.match(ln) if "{" in ln else None
        if m:
            close_bare(bare)
            tag, rest = m.group(1).lower(), m.group(2)
            close = re.compile(r"\{" + tag + r"\}", re.I)
            body: list[str] = []
            first = i + 1
            if rest.strip():
                c = close.search(rest)
                if c:  # {code}one line{code}
                    spans.append((i, i, "jira", "", [rest[:c.start()]]))
                    i += 1
                    continue
                body.append(rest)
                first = i
            j = i + 1
            while j < n and not close.search(lines[j]):
                body.append(lines[j])
                j += 1
            if j < n:
                tail = lines[j][:close.search(lines[j]).start()]  # type: ignore[union-attr]
                if tail.strip():
                    body.append(tail)
            spans.append((first, first + len(body) - 1, "jira", "", body))
            i = j + 1
            continue
        m = _HTML_OPEN.match(ln) if "<" in ln else None
        if m and m.group(1).lower() == "code" and re.search(r"</code>", m.group(2), re.I):
            ln = re.sub(r"</?code>", "", ln, flags=re.I)  # inline code in a sentence: prose
            m = None
        if m:
            close_bare(bare)
            tag = m.group(1).lower()
            end_tag = re.compile(r"</" + tag + r">", re.I)
            body = []
            rest = m.group(2)
            c = end_tag.search(rest)
            if c:
                if rest[:c.start()].strip():
                    spans.append((i, i, "html", "", [rest[:c.start()]]))
                i += 1
                continue
            if rest.strip():
                body.append(rest)
            first = i if rest.strip() else i + 1
            j = i + 1
            while j < n and not end_tag.search(lines[j]):
                body.append(lines[j])
                j += 1
            if j < n:
                tail = lines[j][:end_tag.search(lines[j]).start()]  # type: ignore[union-attr]
                if tail.strip():
                    body.append(tail)
            body = [re.sub(r"</?code>", "", b) for b in body]
            spans.append((first, first + len(body) - 1, "html", "", body))
            i = j + 1
            continue
        if ln[:1] in "CP" and _COLLECT_ENV.match(ln):  # collect_env pasted bare (GitHub's "### Versions")
            close_bare(bare)
            j = _collect_env_end(lines, i)
            spans.append((i, j - 1, "bare", "", lines[i:j]))
            i = j
            continue
        if ln.lstrip().startswith("|") and i + 1 < n and _TABLE_RULE.match(lines[i + 1]):
            j, body = _log_table(lines, i)
            if body:  # a table whose column holds log lines: that column is the block
                close_bare(bare)
                spans.append((i + 2, j - 1, "table", "", body))
                i = j
                continue
        # an indented code block: after a blank line, four spaces or a tab
        if (ln.startswith("    ") or ln.startswith("\t")) and (i == 0 or not lines[i - 1].strip()) \
                and not bare and ln.strip() and not _LIST_ITEM.match(ln):
            j = i
            body = []
            while j < n and (lines[j].startswith(("    ", "\t")) or not lines[j].strip()):
                body.append(lines[j][4:] if lines[j].startswith("    ") else lines[j][1:])
                j += 1
            while body and not body[-1].strip():
                body.pop()
            spans.append((i, i + len(body) - 1, "indented", "", body))
            i = i + len(body)
            continue
        # loose line: chat prefix off, then prose or machine
        content = _CHAT.sub("", ln, count=1)
        if _CHAT_HEADER.match(content):
            content = ""
        elif (content is not ln and content != ln or i in quoted) and _is_prose(content):
            doc.n_marked += 1  # a chat message or a quoted reply in words: a log has none
        wrap = (depth[i], _speaker(ln[:len(ln) - len(content)]) if content is not ln else "")
        if bare and content.strip() and wrap != bare_wrap:
            close_bare(bare)  # another quote level or another speaker: their text, not the log
        if content.strip() and (_is_machine(content) or (bare and (not _is_prose(content) or _continues(bare[-1][1], content)))):
            if not bare:
                bare_wrap = wrap
            bare.append((i, content))
        elif not content.strip() and bare:
            bare.append((i, content))
        else:
            close_bare(bare)
            prose[i] = content
            m = _INLINE_ERROR.search(content) if "rror: " in content or "xception: " in content else None
            if m:  # "... I get RuntimeError: Expected all tensors ..." : the log probes read the error too
                spans.append((i, i, "inline", "", [content[m.start():].strip()]))
        i += 1
    close_bare(bare)

    for s, e, shape, lang, body in spans[:MAX_BLOCKS]:
        if not any(b.strip() for b in body):
            continue
        doc.blocks.append(Block(len(doc.blocks) + 1, s + 1, max(s, e) + 1, "\n".join(body) + "\n", shape, lang,
                                _label(lines, s - (shape in ("fenced", "jira", "html")))))
        doc.n_machine += len(body) if shape != "inline" else 0  # its line is prose as well
        doc.n_bare += len(body) if shape in ("bare", "quoted", "chat") else 0
    doc.n_prose = sum(1 for p in prose if _is_prose(p))
    doc.prose = "\n".join(prose) + "\n"
    return doc


def _marked(text: str) -> bool:
    """Does the text hold markup a log never has: a fence, a quote, a tag or a chat prefix at a
    line's start (the first line counts), or an HTML entity? tests/test_dispatch_parity.py checks it against
    the single alternation it replaces."""
    return ("&" in text and _ENTITY.search(text) is not None) or _LINE_MARKERS.search("\n" + text) is not None


def is_text_note(sample: Sample) -> bool:
    """Text someone could have written about the incident: not binary, not empty, and not one of
    a project's own docs (README, LICENSE...), whose quoted lines would count twice."""
    return not sample.is_binary and bool(sample.size) and not sample.name.lower().startswith(PROJECT_DOCS)


def is_document(sample: Sample) -> bool:
    """Is this file a written document (a ticket, an issue, a chat paste) rather than raw
    evidence? Markup a log never has plus some prose; without markup, only a Markdown file or
    a paste (a name with no suffix, as stdin's) that reads mostly as sentences."""
    if not is_text_note(sample):
        return False
    text = sample.text
    if _JSON_HEAD.match(text):  # a JSON document (a dump, a metrics file) is data, not a ticket
        return False
    marked = _marked(text) or _MORE_MARKERS.search(text) is not None
    name = sample.name.lower()
    # a Markdown table in a written note (.md/.txt or a paste): a log never has a "| --- |" row
    table = name.endswith(_NOTE_NAMES) or "." not in name
    table = table and "|" in text and _TABLE_RULE_ANY.search(text) is not None
    if not marked and not table and not (name.endswith(_MARKDOWN_NAMES) or "." not in name):
        return False  # no markup: only a Markdown file or a paste (stdin) may be plain prose
    doc = split(text[:16384])
    if not marked:
        # No markup: sentences must outweigh the bare machine lines (a plain paste, or prose
        # with indented code blocks or a table of log lines); a log with a stray sentence stays a log.
        if any(b.shape in ("indented", "table") for b in doc.blocks) and not doc.n_bare:
            return doc.n_prose >= 1
        return doc.n_prose >= 2 and doc.n_prose >= 0.5 * (doc.n_prose + doc.n_bare)
    if doc.n_prose == 0:
        return False
    if doc.n_marked >= 2 or (doc.blocks and any(b.shape != "bare" for b in doc.blocks)):
        return True
    # quotes, chat prefixes or entities with no block: ask for a fair share of sentences
    loose = doc.n_prose + doc.n_machine
    return doc.n_prose >= 2 and doc.n_prose >= 0.2 * loose


def suffix_for(block: Block) -> str:
    """A file suffix for a block's scratch file: some readers take the name as a hint."""
    lang = block.lang
    if lang in ("json", "jsonl", "csv", "tsv"):
        return "." + lang
    head = block.text.lstrip()[:8]
    # "[rank0]:", "[2059991.49]" and "[10:42]" open log lines, not JSON arrays
    if head.startswith("{") or re.match(r"\[\s*[\[{\"]", head):
        return ".json"
    return ".log"


#: Block shapes whose lines go back to the prose when no kind claims them, and the most lines
#: such a block may have (see :func:`expand`).
_PROSE_BACK = ("bare", "quoted", "chat")
MAX_PROSE_BACK = 3

#: A document is read whole to split it; past this it is cut (a ticket is not a log archive).
MAX_DOCUMENT = 64 * 1024 * 1024


class Scratch:
    """A private folder for one run's block files, made on first use and removed when the run
    drops its last reference (``weakref.finalize``): the dispatcher needs no cleanup code."""

    _ids = itertools.count(1)

    def __init__(self) -> None:
        self._dir: Path | None = None

    def file(self, name: str) -> Path:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="mldoctor-ticket-"))
            weakref.finalize(self, shutil.rmtree, self._dir, True)
        return self._dir / f"{next(self._ids)}-{name}"


def _sample(path: Path, data: bytes) -> Sample:
    return Sample(path=path, name=path.name, raw=data[:SNIFF_BYTES], size=len(data))


def _hints(block: Block, doc_hints: Hints) -> Hints:
    """The document's hints, with a rank or host the block's label names ("rank 3:")."""
    own = Hints.from_path(block.label) if block.label else Hints()
    return Hints(rank=own.rank if own.rank is not None else doc_hints.rank, host=own.host or doc_hints.host,
                 pid=doc_hints.pid)


def expand(path: Path, rel: str, hints: Hints, scratch: Scratch, claim: Callable[[Sample], str | None],
           joins: set[str], prose_readers: list[str], any_words: bool = False) -> list[tuple[Path, str, str, Hints]]:
    """The pieces of the document at ``path`` as ``(file, provenance, kind, hints)`` to dispatch.

    Each block is claimed by content (``claim`` is the dispatcher's own); adjacent blocks that a
    kind in ``joins`` claims become one file (a log cut over two fences) unless the later one's
    label names another rank or host. A block repeated verbatim (a quoted reply quoting the log again) is read once, so
    its events are not counted twice. The prose goes to each kind in ``prose_readers`` (with
    ``any_words``, a note no reader owns, even one short line: "Training crashes at step 500."
    has too few function words to count as prose, yet it is all the reporter wrote). A block
    no kind claims comes back with kind ``""`` (not None): it is not split again.
    """
    with open(path, "rb") as fh:
        text = fh.read(MAX_DOCUMENT).decode("utf-8", errors="replace")
    doc = split(text)
    groups: list[tuple[list[Block], str | None, Hints]] = []
    seen: set[str] = set()
    written: dict[int, Path] = {}  # block index -> its scratch file, when already written whole
    for block in doc.blocks:
        if block.text in seen:
            continue
        seen.add(block.text)
        data = block.text.encode()
        f = scratch.file(f"block{block.index}{suffix_for(block)}")
        if len(data) > SNIFF_BYTES:  # a sniffer may look at the end of a long file
            f.write_bytes(data)
            written[block.index] = f
        kind, own = claim(_sample(f, data)), _hints(block, hints)
        named = Hints.from_path(block.label) if block.label else Hints()
        last = groups[-1] if groups else None
        if last and kind is not None and kind in joins and last[1] == kind \
                and named.rank in (None, last[2].rank) and named.host in (None, last[2].host) \
                and last[0][-1].index == block.index - 1:
            last[0].append(block)
        else:
            groups.append(([block], kind, own))
    # A short bare block no kind claims ("Aborted (core dumped)" under a sentence, an issue title
    # that quotes the exit) is still the reporter's own account of what happened: its lines go
    # back into the prose, where the symptom reader finds the state they name. Longer unclaimed
    # blocks stay out (a config or dump pasted bare names no state).
    prose = doc.prose
    back = [b for group, kind, _ in groups if kind is None for b in group
            if b.shape in _PROSE_BACK and b.end - b.start < MAX_PROSE_BACK]
    if back:
        lines = prose.split("\n")
        for b in back:
            for k, text in enumerate(b.text.rstrip("\n").split("\n")):
                if 0 <= b.start - 1 + k < len(lines):
                    lines[b.start - 1 + k] = text
        prose = "\n".join(lines)
    out: list[tuple[Path, str, str, Hints]] = []
    for group, kind, own in groups:
        first, last_block = group[0], group[-1]
        if len(group) == 1:
            where = first.where(rel)
            f = written.get(first.index) or scratch.file(f"block{first.index}{suffix_for(first)}")
            if first.index not in written:  # a long block was written whole to be claimed
                f.write_bytes(first.text.encode())
        else:
            f = scratch.file(f"blocks{first.index}-{last_block.index}{suffix_for(first)}")
            where = f"{rel} blocks {first.index}-{last_block.index}, lines {first.start}-{last_block.end}"
            f.write_bytes("".join(b.text for b in group).encode())
        out.append((f, where, kind or "", own))
    if (doc.n_prose or ((any_words or back) and prose.strip())) and prose_readers:
        f = scratch.file("prose.txt")
        f.write_text(prose, encoding="utf-8")
        out.extend((f, f"{rel} prose", name, hints) for name in prose_readers)
    return out
