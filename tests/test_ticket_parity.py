"""bench/ticket_parity.py cuts a ticket's fenced blocks on its own, so its fence scanner is tested
here: a wrong cut would make the ticket/files comparison compare different evidence."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import ticket_parity  # noqa: E402


def test_fenced_blocks_cut_like_commonmark() -> None:
    doc = "\n".join([
        "# NCCL timeout", "It hangs.", "```text", "[rank1]: Watchdog caught collective operation timeout", "```",
        "> quoted reply", "> ```", "> NCCL WARN NET/IB : Got completion with error 12", "> ```",
        "~~~~", "a ``` inside a tilde fence", "~~~~", "```python", "import torch", "``` not a close",
        "print(1)",
    ])
    blocks = ticket_parity.fenced_blocks(doc)
    assert blocks[0] == "[rank1]: Watchdog caught collective operation timeout"
    assert blocks[1] == "NCCL WARN NET/IB : Got completion with error 12"
    assert blocks[2] == "a ``` inside a tilde fence"
    # a fence left open runs to the end; a line with text after the backticks does not close it
    assert blocks[3] == "import torch\n``` not a close\nprint(1)"
    assert len(blocks) == 4


def test_prose_only_ticket_has_no_blocks() -> None:
    assert ticket_parity.fenced_blocks("# Slow\nTraining is slow, see `nvidia-smi` screenshot.\n") == []
