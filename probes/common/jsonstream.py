"""Read one big list inside a JSON document an element at a time.

Why: ``json.loads`` of a 309 MB ``trainer_state.json`` built every record as a dict at once
(4.2 GB RSS), and an 80 MB flight-recorder JSON of 10 M tiny entries reached 2.1 GB. The
documents are one object (or one list) whose bulk is a single list (``log_history``,
``entries``); decoding that list element by element with ``raw_decode`` keeps one element alive
at a time, so memory is the text itself plus what the reader keeps of each element.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

_WS = re.compile(r"[ \t\n\r]*")
_decode = json.JSONDecoder().raw_decode


class JsonShapeError(ValueError):
    """The text is not the JSON shape asked for (or is cut short)."""


def _skip(text: str, i: int) -> int:
    return _WS.match(text, i).end()  # type: ignore[union-attr]  # matches the empty string too


def _char(text: str, i: int) -> str:
    if i >= len(text):
        raise JsonShapeError("the document ends early")
    return text[i]


def _elements(text: str, i: int) -> Iterator[tuple[Any, int]]:
    """Elements of the list whose ``[`` is at ``i``, each with the index just past it."""
    i = _skip(text, i + 1)
    if _char(text, i) == "]":
        return
    while True:
        val, i = _decode(text, i)
        i = _skip(text, i)
        c = _char(text, i)
        yield val, i + 1
        if c == "]":
            return
        if c != ",":
            raise JsonShapeError(f"expected ',' or ']' at character {i}")
        i = _skip(text, i + 1)


def members(text: str, stream: str) -> Iterator[tuple[str, Any, bool]]:
    """The members of the top-level object in ``text`` as ``(key, value, False)``; the list
    under ``stream`` comes as one ``(stream, element, True)`` per element instead.

    Raises JsonShapeError (the top level is not an object, or it is cut short),
    json.JSONDecodeError (both ValueErrors) or RecursionError (nested too deeply).
    """
    i = _skip(text, 0)
    if _char(text, i) != "{":
        raise JsonShapeError("the top level is not an object")
    i = _skip(text, i + 1)
    if _char(text, i) == "}":
        return
    while True:
        key, i = _decode(text, i)
        if not isinstance(key, str):
            raise JsonShapeError(f"an object key is not a string at character {i}")
        i = _skip(text, i)
        if _char(text, i) != ":":
            raise JsonShapeError(f"expected ':' at character {i}")
        i = _skip(text, i + 1)
        if key == stream and _char(text, i) == "[":
            end = _skip(text, i + 1) + 1  # past the "]" of an empty list
            for val, past in _elements(text, i):
                yield key, val, True
                end = past
            i = end
        else:
            val, i = _decode(text, i)
            yield key, val, False
        i = _skip(text, i)
        c = _char(text, i)
        if c == "}":
            return
        if c != ",":
            raise JsonShapeError(f"expected ',' or '}}' at character {i}")
        i = _skip(text, i + 1)


def elements(text: str) -> Iterator[Any]:
    """The elements of the top-level list in ``text``, one at a time (errors as ``members``)."""
    i = _skip(text, 0)
    if _char(text, i) != "[":
        raise JsonShapeError("the top level is not a list")
    for val, _ in _elements(text, i):
        yield val
