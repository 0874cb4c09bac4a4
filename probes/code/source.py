"""Turn pasted Python source into an ``ast`` tree, safely and within bounds.

The user's code is only ever *parsed* (``ast.parse``), never compiled to bytecode, executed,
evaluated or imported. Snippets pasted into tickets are often not whole files: indented (cut out of
a method), cut off in the middle of a line, or elided with a bare ``...`` line. ``parse`` repairs
what it cheaply can (dedent, drop the tail from the first line the parser rejects) and otherwise
gives back ``None`` with a one-line note, never an exception.
"""

from __future__ import annotations

import ast
import re
import textwrap
import warnings

#: Source above this is cut: a training script is tens of KiB; a MiB is an archive, not a paste.
MAX_SOURCE = 1024 * 1024
#: Nodes past this are not walked (bounds the time of every scan that follows; a 2,000-line
#: training script has about 20,000).
MAX_NODES = 120_000
#: Repair attempts (each drops the tail from the line the parser rejected).
MAX_REPAIRS = 4

#: A line that opens a Python statement: what ``sniff`` asks for besides a clean parse.
STATEMENT = re.compile(
    r"^[ \t]*(?:def\s+\w+\s*\(|class\s+\w+\s*[(:]|import\s+[\w.]+|from\s+[\w.]+\s+import\s"
    r"|for\s+[\w(][^\n]*\bin\b[^\n]*:|while\s+[^\n]*:|with\s+[^\n]*:|if\s+[^\n]*:)", re.M)


def _try(text: str) -> ast.Module | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning for odd escapes in user strings
            return ast.parse(text, mode="exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def parse(text: str) -> tuple[ast.Module | None, str]:
    """The tree of ``text`` (or of its longest repairable head) and a note saying what was done.

    The note is empty for a clean parse, names the repair otherwise, and says why nothing could be
    read when the tree is None.
    """
    note = ""
    if len(text) > MAX_SOURCE:
        text, note = text[:MAX_SOURCE], f"source cut at {MAX_SOURCE} characters"
    text = text.replace("\r\n", "\n").expandtabs(8) if "\t" in text else text.replace("\r\n", "\n")
    tree = _try(text)
    if tree is not None:
        return tree, note
    cur = textwrap.dedent(text)
    tree = _try(cur)
    if tree is not None:
        return tree, _join(note, "dedented")
    for _ in range(MAX_REPAIRS):
        try:
            ast.parse(cur)
            break
        except SyntaxError as exc:
            bad = (exc.lineno or 1) - 1
        except (ValueError, RecursionError, MemoryError):
            return None, _join(note, "not parseable as Python")
        lines = cur.split("\n")
        if bad <= 0:
            break
        # drop the rejected line and everything after it; then trailing openers that wait for a body
        head = lines[:bad]
        while head and (not head[-1].strip() or head[-1].rstrip().endswith((":", "\\", ",", "(", "[", "{"))):
            head.pop()
        if not head:
            break
        cur = "\n".join(head) + "\n"
        tree = _try(cur)
        if tree is not None:
            return tree, _join(note, f"read up to line {len(head)} (line {bad + 1} does not parse)")
    return None, _join(note, "not parseable as Python")


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b


def small_enough(tree: ast.AST) -> bool:
    """Whether the tree is within the node budget (a generated file of 10^6 nodes is skipped)."""
    n = 0
    for _ in ast.walk(tree):
        n += 1
        if n > MAX_NODES:
            return False
    return True


def looks_like_code(text: str) -> bool:
    """Cheap and exact: statement-opening lines, and the text (or its dedented form) parses.

    A traceback quotes source lines but opens with ``Traceback`` / ``File "...", line N`` lines that
    do not parse; a log or ``KEY=VALUE`` list has no ``def``/``import``/``for``/``with``/``if``
    statement; a JSON object parses but opens no statement.
    """
    if not STATEMENT.search(text):
        return False
    return _try(text) is not None or _try(textwrap.dedent(text)) is not None
