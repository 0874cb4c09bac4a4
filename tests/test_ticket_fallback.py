"""A hand-written note that is not shaped like a ticket is still read.

People write one long paragraph with the error inside a sentence, put a traceback in single
backticks over several lines, or paste a script longer than their prose. No probe claims such a
file and the ticket test (``ticket.is_document``) does not take it either; dropping it left the
report at "nothing recognized". The error lines quoted below are real lines of captured runs
(tests/fixtures/logs/shm_small and fd_limit); only the sentences around them are written here.
"""

from __future__ import annotations

from pathlib import Path

from doctor.engine.diagnose import diagnose_path

FIX = Path(__file__).parent / "fixtures" / "logs"


def _real_line(case: str, needle: str) -> str:
    text = (FIX / case / "torchrun.log").read_text()
    return next(ln.split("]: ", 1)[-1] for ln in text.splitlines() if needle in ln)


def _top(path: Path) -> str | None:
    findings = diagnose_path(path).findings
    return findings[0].cause if findings else None


def test_error_inside_one_long_paragraph(tmp_path: Path) -> None:
    line = _real_line("shm_small", "unable to allocate shared memory")
    note = tmp_path / "issue.md"
    note.write_text(
        "Hi, we train a segmentation model in a container on 4 GPUs with 8 loader workers each and "
        f"after a few minutes every run ends with {line} and then the job exits, any idea what we "
        "should change in our setup?\n")
    assert _top(tmp_path) == "shm_too_small"


def test_traceback_in_single_backticks(tmp_path: Path) -> None:
    line = _real_line("fd_limit", "Too many open files")
    note = tmp_path / "bug.txt"
    note.write_text(
        "The loader dies after a while:\n"
        "`Traceback (most recent call last):\n"
        '  File "train.py", line 88, in <module>\n'
        "    for batch in loader:\n"
        f"{line}`\n")
    assert _top(tmp_path) == "resource_limit"


def test_project_docs_and_plain_sentences_stay_quiet(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text(
        f"Known errors: {_real_line('fd_limit', 'Too many open files')}\n")
    (tmp_path / "notes.txt").write_text("Training runs fine on both nodes; this is only a question "
                                        "about which learning rate schedule to use.\n")
    report = diagnose_path(tmp_path)
    assert not [f for f in report.findings if f.severity in ("medium", "high", "critical")]
    assert _top(tmp_path) is None


def test_reported_state_without_a_cause_is_not_healthy(tmp_path: Path) -> None:
    """Words only: the state the reporter asserts, never "healthy"; a negated or questioned state,
    or a run the reporter says ended well, asserts nothing."""
    cases = {
        "Our training dies after two epochs on the cluster, every time.": "crashed",
        "Since Monday the job just stalls after the first checkpoint; we restarted it twice.": "hung",
        "It does not crash and it does not hang; I only want to know the best batch size.": "unknown",
        "Does the job crash when the loader has 16 workers?": "unknown",
    }
    for i, (text, state) in enumerate(cases.items()):
        folder = tmp_path / str(i)
        folder.mkdir()
        (folder / "issue.md").write_text(text + "\n")
        report = diagnose_path(folder)
        assert report.verdict["state"] == state, (text, report.verdict)
        assert report.exit_code == 3


def test_a_sentence_of_plain_function_words_is_prose() -> None:
    """A sentence whose only common words are ones like "than", "so", "other" (no "is", "we" or
    "it") is still a sentence: before, such a one-line ticket gave no prose at all."""
    from doctor.evidence import ticket

    line = ("Building the token cache on rank 0 needs more than thirty minutes, longer than the "
            "default process group timeout, so the other ranks give up.")
    assert ticket.split(f"## The other ranks give up\n\n{line}\n").n_prose == 2  # the title and the sentence
    assert not ticket.split("[rank0]:[W1203 10:42:01] ProcessGroupNCCL.cpp:1203 timeout so far 1800000 ms\n").n_prose
