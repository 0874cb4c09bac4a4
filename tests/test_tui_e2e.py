"""`mldoctor tui` as a person uses it: a real hung 4-rank job, the TUI in an 80x24 tmux pane.

The job is the demo's extra_collective scenario (rank 1 calls a barrier while the others are in
all_reduce). Keys go in with `tmux send-keys`, the screen comes back with `tmux capture-pane`;
every wait polls the pane with a deadline. The tmux server runs on a private socket, and the job
and the server are stopped in a finally whatever happens.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from doctor.live import demo

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux"),
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch for the real job"),
    pytest.mark.skipif(importlib.util.find_spec("textual") is None, reason="needs textual"),
]

ROOT = Path(__file__).resolve().parents[1]


class Tmux:
    """One detached 80x24 session on a private server socket."""

    def __init__(self, name: str) -> None:
        self.sock = f"mldoctor-e2e-{os.getpid()}"
        self.name = name

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["tmux", "-L", self.sock, *args], capture_output=True, text=True, check=check,
                              timeout=30)

    def start(self, command: str) -> None:
        self("new-session", "-d", "-s", self.name, "-x", "80", "-y", "24", command)
        self("set-option", "-t", self.name, "remain-on-exit", "on")  # keep the last screen if it dies

    def keys(self, *keys: str) -> None:
        self("send-keys", "-t", self.name, *keys)

    def screen(self) -> str:
        res = self("capture-pane", "-p", "-t", self.name, check=False)
        return res.stdout

    def wait_for(self, pattern: str, timeout: float, flags: int = 0) -> str:
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = self.screen()
            if re.search(pattern, text, flags):
                return text
            time.sleep(0.2)  # the poll interval, not a wait for luck: the deadline bounds it
        raise AssertionError(f"no {pattern!r} on screen within {timeout:.0f}s; screen:\n{text}")

    def dead(self) -> bool:
        res = self("display-message", "-p", "-t", self.name, "#{pane_dead}", check=False)
        return res.returncode != 0 or res.stdout.strip() == "1"

    def kill(self) -> None:
        self("kill-server", check=False)


def test_tui_walkthrough_on_a_real_hung_job(tmp_path: Path) -> None:
    proc, log = demo.start("extra_collective", tmp_path)
    tmux = Tmux("tui")
    try:
        assert demo.wait_until_stuck(proc, log, "extra_collective") == "stuck", log.read_text()[-2000:]
        cmd = " ".join(shlex.quote(a) for a in (
            sys.executable, "-m", "doctor.cli", "tui", "--pid", str(proc.pid), "--logs", str(log)))
        tmux.start(f"cd {shlex.quote(str(tmp_path))} && TERM=xterm-256color {cmd}")

        # The walkthrough opens on the symptom; nothing is probed before the answer.
        tmux.wait_for(r"What do you see\?", timeout=60)
        tmux.wait_for(r"1 no progress", timeout=10)
        tmux.wait_for(rf"live: pid {proc.pid}; nothing probed before your answer", timeout=10)
        tmux.keys("1")  # no progress

        # Probes run with visible progress, then the verdict and the ranked findings.
        screen = tmux.wait_for(r"Verdict: HUNG", timeout=120)
        assert re.search(r"probe\s+stacks", screen) or "diagnosis 1: probing the job" in screen
        assert re.search(r"1\. \[CRITICAL\] collective_mismatch\s+rank 1\b", screen), screen
        assert re.search(r"HUNG \| collective_mismatch on rank 1\b", screen), screen

        # The fix and the commands to copy.
        tmux.keys("f")
        screen = tmux.wait_for(r"Commands to confirm", timeout=10)
        assert "Culprits: rank 1" in screen
        tmux.wait_for(r"\$ mldoctor diagnose --pid PID", timeout=20)
        tmux.keys("c")
        tmux.wait_for(r"Copied: mldoctor diagnose --pid PID", timeout=10)

        # The rank grid: rank 1 is the culprit, in words and marks.
        tmux.keys("r")
        screen = tmux.wait_for(r"Legend:", timeout=10)
        assert re.search(r"^\s*1\s+collective: barrier\s+CULPRIT", screen, re.M), screen
        assert re.search(r"\b1 [A-Z0-9]\*", screen), screen

        tmux.keys("q")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not tmux.dead():
            time.sleep(0.2)
        assert tmux.dead(), "the TUI did not quit on q:\n" + tmux.screen()
        assert "Traceback" not in tmux.screen()
    finally:
        tmux.kill()
        known = demo.descendants(proc.pid)
        demo.stop(proc)
        assert demo.leftovers(proc, known) == []
