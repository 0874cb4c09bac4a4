"""Every entry of every pattern library hits its examples and misses its near misses.

One test for the three kinds of pattern table (log signatures, stack-frame tables, symptom
questions), all in the format of ``doctor.evidence.patterns``.
"""

from __future__ import annotations

import pytest

from doctor.evidence.errors import UserError
from doctor.evidence.patterns import every_library, load_library, parse_library

LIBRARIES = every_library()
ENTRIES = [(lib.name, p) for lib in LIBRARIES for p in load_library(lib)]


def test_libraries_are_found() -> None:
    assert len(LIBRARIES) >= 5
    assert len(ENTRIES) >= 100


@pytest.mark.parametrize("name,entry", ENTRIES, ids=[f"{n}:{p.id}" for n, p in ENTRIES])
def test_entry_is_documented_and_hits_its_examples(name: str, entry) -> None:
    assert entry.means.strip(), "say what a hit means"
    assert entry.source.strip(), "name the upstream source (file:line or doc URL)"
    assert entry.examples, "give at least one real example"
    for ex in entry.examples:
        assert entry.hits(ex), f"does not hit its example: {ex!r}"
    for ex in entry.examples_not:
        assert not entry.hits(ex), f"hits its near miss: {ex!r}"


def test_ids_are_unique_per_library() -> None:
    for lib in LIBRARIES:
        ids = [p.id for p in load_library(lib)]
        assert len(ids) == len(set(ids)), lib


@pytest.mark.parametrize("text,why", [
    ("[1, 2]", "a mapping"),
    ("patterns: 3", "must be a list"),
    ("patterns:\n  - id: a\n    pattern: '('\n", "bad pattern"),
    ("patterns:\n  - id: a\n    pattern: x\n  - id: a\n    pattern: y\n", "used twice"),
    ("patterns:\n  - pattern: x\n", "'id' is missing"),
    ("patterns: !!python/object/apply:os.system ['true']\n", "evil.yaml"),
])
def test_bad_libraries_are_one_line_errors(text: str, why: str) -> None:
    with pytest.raises(UserError) as err:
        parse_library("evil.yaml", text)
    assert why in str(err.value) and "\n" not in str(err.value)
