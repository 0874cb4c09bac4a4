"""The cause ids (a public contract: scripts and tickets match on them; never rename one)."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from doctor.evidence.yamlsrc import safe_data


@lru_cache(maxsize=1)
def load() -> dict[str, dict[str, dict[str, str]]]:
    """``{category: {cause_id: {means, look_for}}}`` from the shipped taxonomy.yaml."""
    text = resources.files("doctor.engine").joinpath("taxonomy.yaml").read_text(encoding="utf-8")
    return safe_data(text)


@lru_cache(maxsize=1)
def causes() -> dict[str, str]:
    """``{cause_id: category}``."""
    return {cause: cat for cat, items in load().items() for cause in items}


def means(cause: str) -> str:
    cat = causes().get(cause)
    return load()[cat][cause]["means"] if cat else ""
