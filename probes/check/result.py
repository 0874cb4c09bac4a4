"""One check's outcome, the shape every check of the ``check`` kind returns.

A check either ran and judged (``passed`` / ``failed``) or could not run (``skipped``, with the
reason). Why a separate state for "could not run": a node with no GPU, no cpufreq interface or no
torch must never read as a healthy GPU, governor or network, so ``skipped`` is never counted as
passed anywhere (facts, rules, report).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
STATUSES = (PASSED, FAILED, SKIPPED)

GiB = 1024 ** 3
MiB = 1024 ** 2


def result(check_id: str, group: str, title: str, status: str, summary: str, *, cause: str = "",
           reason: str = "", value: dict[str, Any] | None = None, gpus: list[str] | None = None,
           seconds: float = 0.0) -> dict[str, Any]:
    """A check record. ``cause`` (a taxonomy id) is set on failures only; ``reason`` says why a
    check was skipped; ``value`` holds the measured numbers the verdict came from."""
    assert status in STATUSES, status
    return {"id": check_id, "group": group, "title": title, "status": status, "summary": summary,
            "cause": cause if status == FAILED else "", "reason": reason, "value": value or {},
            "gpus": list(gpus or []), "seconds": round(seconds, 3)}


def skipped(check_id: str, group: str, title: str, reason: str) -> dict[str, Any]:
    return result(check_id, group, title, SKIPPED, f"not run: {reason}", reason=reason)


def timed(fn: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Run a check function; stamp its records with the time it took when they carry none; a
    check that raises is recorded as skipped with the error (a broken check is not a pass)."""
    t0 = time.perf_counter()
    try:
        out = fn()
    except Exception as exc:  # one check's bug or an odd host must not end the others
        name = getattr(fn, "__name__", "check")
        out = [skipped(f"internal.{name}", "internal", name, f"the check raised {type(exc).__name__}: {exc}")]
    took = time.perf_counter() - t0
    for rec in out:
        if not rec.get("seconds"):
            rec["seconds"] = round(took / max(1, len(out)), 3)
    return out
