"""Error types that carry a one-line message for the user.

The CLI turns these into a single line on stderr and an exit code; anything else is a bug and
may show a traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad usage or bad input the user can fix (exit code 2)."""

    exit_code = 2


class EvidenceError(Exception):
    """One evidence file could not be used. Reported, and the rest of the evidence still counts."""

    def __init__(self, path: str, what: str) -> None:
        super().__init__(f"{path}: {what}")
        self.path = path
        self.what = what


class RuleError(UserError):
    """A rule file is invalid; the message is ``file:line: what is wrong``."""
