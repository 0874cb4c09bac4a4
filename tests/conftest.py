"""Shared test helpers: run the real CLI as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


def mldoctor(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``mldoctor`` in a subprocess (the installed console script's module)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "doctor.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=full_env, timeout=timeout)


def diagnose_json(path: Path, *extra: str) -> dict:
    res = mldoctor("diagnose", "--from", str(path), "--json", *extra)
    assert res.returncode in (0, 1, 3), res.stderr
    return json.loads(res.stdout)


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES
