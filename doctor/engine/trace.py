"""The trace: every step that led to a verdict, kept for the report's "how we got here"."""

from __future__ import annotations

import time
from typing import Any


class Trace:
    """The steps that led to a verdict, kept for the report's "how we got here"."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.steps: list[dict[str, Any]] = []

    def add(self, action: str, detail: str = "", **extra: Any) -> None:
        self.steps.append({"t": round(time.perf_counter() - self.t0, 3), "action": action,
                           "detail": detail, **extra})
