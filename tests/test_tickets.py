"""Tickets and pastes as evidence: real captured files wrapped the way people post them.

Every block below is a file captured from a real job (tests/fixtures); only the wrapping and the
sentences are written here. The claim under test: a ticket gives the same top finding as the
files it quotes, in every shape (fenced, indented, quoted, <details>, Jira, chat, HTML-escaped),
on a path or on stdin, says where each piece came from, and reads the reporter's sentences
without taking negations or questions as statements.
"""

from __future__ import annotations

import html
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from doctor.probes.symptoms import read

from doctor.engine import facts as facts_mod
from doctor.engine.diagnose import diagnose_path
from doctor.evidence import ticket
from doctor.evidence.contract import Sample
from doctor.render.markdown import render_markdown

FIX = Path(__file__).parent / "fixtures"
WATCHDOG_LOG = FIX / "logs" / "timeout_short" / "torchrun.log"
PROSE = "Our 2-node job dies after the evaluation phase. Log of rank 0 below."


def top(path: Path) -> tuple[str, list[int]] | None:
    findings = diagnose_path(path).findings
    return (findings[0].cause, findings[0].ranks) if findings else None


def _indent(text: str, prefix: str) -> str:
    return "".join(prefix + ln + "\n" for ln in text.splitlines())


def shapes(log: str) -> dict[str, str]:
    """The same log wrapped in each shape a ticket or a chat takes."""
    return {
        "fenced.md": f"{PROSE}\n\n```text\n{log}```\n\nAny idea?\n",
        "fenced_plain.md": f"{PROSE}\n\n```\n{log}```\n",
        "tilde.md": f"{PROSE}\n\n~~~\n{log}~~~\n",
        "indented.md": f"{PROSE}\n\n{_indent(log, '    ')}\nThanks.\n",
        "quoted_reply.md": f"Thanks, that helps.\n\n> {PROSE}\n>\n> ```\n{_indent(log, '> ')}> ```\n",
        "nested_quote.md": f"Same here.\n\n> > {PROSE}\n> >\n> > ```\n{_indent(log, '> > ')}> > ```\n",
        "details.md": f"{PROSE}\n\n<details>\n<summary>full log of rank 0</summary>\n\n```\n{log}```\n\n</details>\n",
        "jira.txt": f"{PROSE}\n\n{{code:java}}\n{log}{{code}}\n\nPlease have a look.\n",
        "jira_noformat.txt": f"{PROSE}\n{{noformat}}\n{log}{{noformat}}\n",
        "pre.html.txt": f"<p>{PROSE}</p>\n<pre>\n{html.escape(log)}</pre>\n",
        "escaped.md": html.escape(f"{PROSE}\n\n```\n{log}```\n", quote=True),
        "chat.txt": (f"[10:41] alice: hi all, our training job is stuck and then it dies\n"
                     f"[10:42] alice: {PROSE}\n{log}[10:45] bob: does it happen every time?\n"
                     f"[10:46] alice: yes, every time after the evaluation\n"),
    }


@pytest.fixture(scope="module")
def watchdog_expected() -> tuple[str, list[int]]:
    expected = top(WATCHDOG_LOG.parent)
    assert expected is not None and expected[0] == "timeout_too_short"
    return expected


@pytest.mark.parametrize("name", sorted(shapes("x\n")))
def test_every_shape_gives_the_files_finding(name: str, tmp_path: Path,
                                             watchdog_expected: tuple[str, list[int]]) -> None:
    doc = tmp_path / name
    doc.write_text(shapes(WATCHDOG_LOG.read_text())[name], encoding="utf-8")
    assert ticket.is_document(Sample.read(doc)), name
    assert top(doc) == watchdog_expected


def test_pyspy_dumps_in_fences_keep_their_ranks(tmp_path: Path) -> None:
    src = FIX / "evidence" / "extra_collective"
    files = tmp_path / "files"
    files.mkdir()
    for f in sorted(src.glob("pyspy-rank*.txt")):
        shutil.copy(f, files)
    body = "".join(f"rank {i}:\n\n```\n{(src / f'pyspy-rank{i}.txt').read_text()}```\n\n" for i in range(4))
    doc = tmp_path / "issue.md"
    doc.write_text("Our 4-rank job hangs; py-spy dump of every rank:\n\n" + body)
    assert top(doc) == top(files) == ("collective_mismatch", [1])


def test_nvidia_smi_in_a_details_fold_is_gpu_evidence(tmp_path: Path) -> None:
    smi = FIX / "gpu" / "h200" / "stuck" / "nvidia-smi.txt"
    doc = tmp_path / "gpu.md"
    doc.write_text("The GPU looks busy but no step finishes.\n\n<details>\n<summary>nvidia-smi</summary>\n\n"
                   f"```\n{smi.read_text()}```\n</details>\n")
    facts, _ = facts_mod.build(facts_mod.items_from_folder(doc), "loose")
    plain, _ = facts_mod.build(facts_mod.items_from_folder(smi), "loose")
    assert "gpu" in facts["evidence"]["kinds"]
    assert facts["gpu"] == plain["gpu"]
    assert facts["symptoms"]["states"] == ["hang"]


def test_a_log_cut_over_two_fences_is_read_as_one(tmp_path: Path) -> None:
    lines = WATCHDOG_LOG.read_text().splitlines(keepends=True)
    half = len(lines) // 2
    doc = tmp_path / "split.md"
    doc.write_text(f"{PROSE}\n\n```\n{''.join(lines[:half])}```\n\ncontinued:\n\n```\n{''.join(lines[half:])}```\n")
    facts, _ = facts_mod.build(facts_mod.items_from_folder(doc), "loose")
    plain, _ = facts_mod.build(facts_mod.items_from_folder(WATCHDOG_LOG), "loose")
    assert any("blocks 1-2" in d and d.endswith(": logs") for d in facts["evidence"]["documents"])
    assert facts["logs"]["counts"] == plain["logs"]["counts"]


def test_provenance_is_in_the_report(tmp_path: Path) -> None:
    doc = tmp_path / "issue.md"
    doc.write_text(shapes(WATCHDOG_LOG.read_text())["fenced.md"])
    report = diagnose_path(doc)
    md = render_markdown(report)
    assert "issue.md block 1, lines 4-" in md
    assert "issue.md prose: symptoms" in md


def test_stdin_paste(watchdog_expected: tuple[str, list[int]]) -> None:
    paste = shapes(WATCHDOG_LOG.read_text())["chat.txt"]
    run = subprocess.run([sys.executable, "-m", "doctor.cli", "diagnose", "--from", "-", "--json"],
                         input=paste.encode(), capture_output=True, timeout=120)
    assert run.returncode == 1, run.stderr.decode()
    report = json.loads(run.stdout)
    first = report["findings"][0]
    assert (first["cause"], first["ranks"]) == watchdog_expected
    assert any("stdin block" in step["detail"] for step in report["trace"])
    empty = subprocess.run([sys.executable, "-m", "doctor.cli", "diagnose", "--from", "-"],
                           input=b"", capture_output=True, timeout=120)
    assert empty.returncode == 2 and b"nothing was given on stdin" in empty.stderr


def test_a_plain_log_paste_stays_a_log() -> None:
    run = subprocess.run([sys.executable, "-m", "doctor.cli", "facts", "--from", "-"],
                         input=WATCHDOG_LOG.read_bytes(), capture_output=True, timeout=120)
    facts = json.loads(run.stdout)
    assert "documents" not in facts["evidence"]
    assert "logs" in facts["evidence"]["kinds"]


def test_no_captured_evidence_file_is_taken_for_a_ticket() -> None:
    """Logs, dumps, tables and READMEs of every fixture folder keep going to the probes."""
    seen = 0
    for f in sorted(FIX.rglob("*")):
        if f.is_file() and "tickets" not in f.parts and f.stat().st_size:
            seen += 1
            assert not ticket.is_document(Sample.read(f)), f
    assert seen > 100


def test_split_shapes_and_lines() -> None:
    doc = ticket.split("Intro line with the words of a sentence.\n\n```python\nx = 1\n```\n\n"
                       "> quoted: it hangs\n>\n>     indented in a quote\n\n"
                       "Traceback (most recent call last):\n  File \"a.py\", line 1, in <module>\n"
                       "RuntimeError: boom\n\nThe end of the story is here.\n")
    assert [(b.shape, b.start, b.end) for b in doc.blocks] == [
        ("fenced", 4, 4), ("indented", 9, 9), ("bare", 11, 13)]
    assert doc.prose.splitlines()[0].startswith("Intro line")
    assert doc.prose.splitlines()[3] == ""  # block lines are blanked: line numbers hold
    assert len(doc.prose.splitlines()) == 15


@pytest.mark.parametrize("text, fact, value, asserted, why", [
    ("It hangs at init, only multi-node.", "states", "hang", True, ""),
    ("It hangs at init, only multi-node.", "when", "init", True, ""),
    ("It hangs at init, only multi-node.", "where", "multi_node", True, ""),
    ("The job does not hang.", "states", "hang", False, "negated"),
    ("It no longer hangs with the new driver.", "states", "hang", False, "negated"),
    ("Is it OOM?", "states", "oom", False, "question"),
    ("Loss becomes NaN after 2k steps.", "states", "diverge", True, ""),
    ("Throughput dropped by 30% after the NCCL upgrade.", "changed", "nccl", True, ""),
    ("Works with NCCL_P2P_DISABLE=1.", "fixes", "nccl_p2p_disable", True, ""),
    ("NCCL_P2P_DISABLE=1 did not help, still hangs.", "tried", "nccl_p2p_disable", True, ""),
    ("Should we set num_workers=0?", "tried", "num_workers_0", False, "question"),
])
def test_symptom_phrases(text: str, fact: str, value: str, asserted: bool, why: str) -> None:
    hits = [p for p in read.phrases(text) if p.fact == fact and p.value == value]
    assert hits, (text, [(p.fact, p.value) for p in read.phrases(text)])
    assert (hits[0].asserted, hits[0].why_not) == (asserted, why)


def test_a_workaround_that_did_not_help_is_no_fix() -> None:
    found = read.phrases("NCCL_P2P_DISABLE=1 did not help, still hangs.")
    assert not [p for p in found if p.fact == "fixes"]
    assert read.after_steps("loss goes nan after 2k steps") == 2000


def test_walkthrough_answers_give_the_same_symptom_facts(tmp_path: Path) -> None:
    """A clicked answer and the sentence a ticket would hold become the same symptoms facts."""
    from doctor.tui import questions as qs
    from doctor.tui.session import Session

    session = Session(path=WATCHDOG_LOG.parent)
    q = qs.by_id("symptom")
    a = next(x for x in q.answers if x.pattern_id == "symptom.hang")
    assert session.answer(q.id, q.text, a.label, symptom=a.symptom, sets_symptom=q.sets_symptom,
                          facts=a.facts, pattern_id=a.pattern_id)
    clicked = session.diagnose().facts["symptoms"]
    doc = tmp_path / "issue.md"
    doc.write_text(f"Training hangs.\n\n```\n{WATCHDOG_LOG.read_text()}```\n")
    written = diagnose_path(doc).facts["symptoms"]
    for key in ("states", "state", "when", "where", "fixes"):
        assert clicked[key] == written[key], key


def test_dmesg_block_opening_with_a_bracket_is_a_log(tmp_path: Path) -> None:
    """A block starting with "[" (dmesg, "[rank0]:") is a log, not JSON, whatever its head."""
    dmesg = FIX / "logs" / "host_oom" / "dmesg.txt"
    doc = tmp_path / "oom.md"
    doc.write_text(f"The job was killed overnight, dmesg says:\n\n```\n{dmesg.read_text()}```\n")
    plain = top(dmesg)
    assert plain is not None and top(doc) == plain
