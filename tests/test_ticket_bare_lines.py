"""Machine lines pasted into a ticket without a fence still reach the log probes.

Reporters paste the end of a run straight into their text: the shell's ``Killed`` or
``Segmentation fault (core dumped)``, the C++ runtime's ``terminate called after throwing``,
torchrun's bracketed ``[WARNING]`` lines, a ``ChildFailedError:`` line, an exception quoted inside
a sentence. Each must become a block the probes read (not words of the prose), a short block no
probe claims must go back to the prose so its state is still read, and a Python traceback pasted
bare must make the job crashed. Quoted lines below are shaped like those of the public issues
named beside them (titles and first paragraphs read for the dev corpus of this change).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from doctor.engine.diagnose import diagnose_path
from doctor.evidence import ticket
from doctor.evidence.contract import Hints


def _blocks(text: str) -> list[tuple[str, str]]:
    return [(b.shape, b.text.strip()) for b in ticket.split(text).blocks]


@pytest.mark.parametrize("line", [
    # https://github.com/chenhsuanlin/spatial-transformer-GAN/issues/35
    "./train.sh: line 1:  7364 Killed                  python3 train_Donly.py --name=D0 --warpN=0",
    "[1]+  Killed                  python train.py --epochs 10",
    "Killed",
    # https://github.com/jojonki/BiDAF/issues/8
    "Segmentation fault (core dumped)",
    # https://github.com/rohanchandra30/TrackNPred/issues/7
    "Floating point exception (core dumped)",
    "Aborted (core dumped)",
    "terminate called after throwing an instance of 'c10::Error'",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    "torch.distributed.elastic.multiprocessing.api: [WARNING] Sending process 4041 closing signal SIGTERM",
])
def test_a_bare_exit_line_becomes_a_block(line: str) -> None:
    text = f"The training runs for a while and then the process dies.\n{line}\nWe use 4 GPUs on one node.\n"
    doc = ticket.split(text)
    assert [b.text.strip() for b in doc.blocks] == [line]
    assert line not in doc.prose
    assert "We use 4 GPUs" in doc.prose


def test_a_sentence_that_starts_with_killed_stays_prose() -> None:
    doc = ticket.split("Killed by the OOM killer, I think, since the node has little memory.\n")
    assert not doc.blocks


def test_an_exception_inside_a_sentence_is_also_a_block() -> None:
    sentence = ("When I start training on two GPUs I get RuntimeError: Expected all tensors to be on the same "
                "device, but found at least two devices right away.")
    doc = ticket.split(sentence + "\n")
    assert [(b.shape, b.text.startswith("RuntimeError: Expected all tensors")) for b in doc.blocks] == [("inline", True)]
    assert "When I start training" in doc.prose  # the sentence itself is still the reporter's words
    assert doc.n_machine == 0


def _expand(tmp_path: Path, text: str, claims: str | None) -> tuple[list[str], str]:
    doc = tmp_path / "issue.md"
    doc.write_text(text)
    scratch = ticket.Scratch()  # held here: the scratch folder goes when its last reference does
    pieces = ticket.expand(doc, "issue.md", Hints(), scratch, lambda s: claims, set(), ["symptoms"])
    prose = next(f.read_text() for f, _, kind, _ in pieces if kind == "symptoms")
    return [kind for _, _, kind, _ in pieces if kind != "symptoms"], prose


def test_a_short_block_no_probe_claims_goes_back_to_the_prose(tmp_path: Path) -> None:
    # https://github.com/superlouis/GATGNN/issues/6: the title is the whole error
    text = "# Aborted (core dumped)\n\nWhen I run train.py, I get this. How can I fix it?\n"
    kinds, prose = _expand(tmp_path, text, None)
    assert kinds == [""]
    assert prose.splitlines()[0] == "# Aborted (core dumped)"  # on its own line, as in the document


def test_a_claimed_block_stays_out_of_the_prose(tmp_path: Path) -> None:
    text = "# Aborted (core dumped)\n\nWhen I run train.py, I get this. How can I fix it?\n"
    kinds, prose = _expand(tmp_path, text, "logs")
    assert kinds == ["logs"]
    assert "Aborted" not in prose


def test_a_long_unclaimed_block_stays_out_of_the_prose(tmp_path: Path) -> None:
    dump = "".join(f"2024-05-01 10:00:0{i},123 - WARNING - queue {i} empty\n" for i in range(6))
    kinds, prose = _expand(tmp_path, f"Here is what it prints before it stops working.\n{dump}Thanks.\n", None)
    assert kinds == [""]
    assert "queue" not in prose


TRACEBACK = ('Traceback (most recent call last):\n  File "train.py", line 10, in <module>\n    main()\n'
             '  File "train.py", line 5, in main\n    x, y = batch\n'
             'ValueError: too many values to unpack (expected 2)\n')


def test_a_bare_traceback_makes_the_job_crashed(tmp_path: Path) -> None:
    """No fence, no crash word in the prose: the traceback alone says the run stopped."""
    (tmp_path / "issue.md").write_text(f"I run the script on two GPUs as in the README.\n\n{TRACEBACK}\nAny idea?\n")
    assert diagnose_path(tmp_path).verdict["state"] == "crashed"


@pytest.mark.parametrize("text,state", [
    # https://github.com/jojonki/BiDAF/issues/8
    ("But when training, I got core dumped immediately using an empty GPU.\nSegmentation fault (core dumped)\n",
     "crashed"),
    # https://github.com/CharlesShang/FastMaskRCNN/issues/172
    ("# why train be killed?\n\nThe training prints a few iterations and then:\n\nKilled\n\nwhat is that mean?\n",
     "crashed"),
    # https://github.com/superlouis/GATGNN/issues/6
    ("# Aborted (core dumped)\n\nWhen I run train.py, I get this. How can I fix it?\n", "crashed"),
])
def test_a_pasted_exit_gives_a_crashed_job(tmp_path: Path, text: str, state: str) -> None:
    (tmp_path / "issue.md").write_text(text)
    assert diagnose_path(tmp_path).verdict["state"] == state
