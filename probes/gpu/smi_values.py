"""Value cells as every ``nvidia-smi`` format prints them, shared by the three parsers.

``nvidia-smi`` writes units, brackets and sentinel words ("[N/A]", "[Not Supported]", "ERR!")
into the same cells as numbers; reading them one way in one place keeps the -q, csv and table
parsers agreeing on what is missing and why.
"""

from __future__ import annotations

import re

_NUM = re.compile(r"[-+]?\d+(?:\.\d+)?")
_NA = {"n/a", "[n/a]", "na", "", "not supported", "[not supported]", "unknown error", "[unknown error]",
       "requested functionality has been deprecated", "[requested functionality has been deprecated]",
       "insufficient permissions", "[insufficient permissions]", "err!", "[gpu is lost]", "gpu is lost",
       "no data", "[no data]"}


def _num(value: str | None) -> float | None:
    if value is None:
        return None
    v = value.strip()
    if v.lower() in _NA:
        return None
    m = _NUM.search(v.replace(",", ""))
    return float(m.group(0)) if m else None


def _int(value: str | None) -> int | None:
    n = _num(value)
    return int(n) if n is not None else None


def _yes(value: str | None) -> bool | None:
    if value is None:
        return None
    v = value.strip().lower()
    if v in ("yes", "active", "enabled", "true", "1"):
        return True
    if v in ("no", "not active", "disabled", "false", "0", "none"):
        return False
    return None


def _na_reason(value: str | None) -> str | None:
    """Why an nvidia-smi value is missing, when it says so."""
    if value is None:
        return None
    v = value.strip().strip("[]").lower()
    if v in ("n/a", "na"):
        return "not available"
    if v in ("not supported", "unknown error", "insufficient permissions", "gpu is lost", "no data", "err!"):
        return {"err!": "error reading the value"}.get(v, v)
    return None




def _exe_name(value: str | None) -> str:
    """The executable's base name only: nvidia-smi prints a path, never arguments, but keep less."""
    v = (value or "").strip().split()[0] if (value or "").strip() else ""
    return v.rsplit("/", 1)[-1][:64]

