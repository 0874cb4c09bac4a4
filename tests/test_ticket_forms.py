"""Ticket forms people really post: the wrapper comes off, the lines reach the probes as the file had them.

Each form below wraps a real captured file (tests/fixtures) the way one tracker, forum, mail
client or chat client shows it: Jira wiki markup, Discourse posts, StackOverflow questions, HTML
``<pre>``, GitHub issue forms, e-mail replies, Slack and Teams pastes, Markdown tables, Windows
line endings and tabs. Two claims are checked for every form:

- the splitter hands the probes the file's own lines (no quote marks, chat prefixes, tags or
  table pipes left on them), so a reader cannot tell the block from the file;
- the diagnosis of the ticket names the same causes as the file alone (parity), over logs,
  stack dumps, nvidia-smi output and trainer logs captured from real runs.

Only the wrapping and the sentences are written here (a whole ticket kept as a fixture file would
be taken for a ticket by tests/test_tickets.py's check that no captured file is one).
"""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path

import pytest

from doctor.engine import facts as facts_mod
from doctor.engine.diagnose import diagnose_path
from doctor.evidence import plugins, ticket
from doctor.evidence.contract import Sample

FIX = Path(__file__).parent / "fixtures"
PROSE = "Our 2-node job dies after the evaluation phase and we do not know why."
COLLECT_ENV = (FIX / "collect_env" / "h200-torch2.11-cu130.txt").read_text()


def _each(text: str, fmt: Callable[[str], str]) -> str:
    return "".join(fmt(ln) + "\n" for ln in text.splitlines())


def _table(text: str) -> str:
    """A Markdown table with one log line per row, pipes escaped as GitHub wants them."""
    rows = "".join(f"| {i} | `{ln.replace('|', chr(92) + '|')}` |\n" for i, ln in enumerate(text.splitlines(), 1)
                   if ln.strip())
    return "| # | line |\n| --- | --- |\n" + rows


FORMS: dict[str, Callable[[str], str]] = {
    # Jira wiki markup: {code} with parameters, {noformat}, a {quote} around the log itself
    "jira_code": lambda log: (f"h2. Job dies after eval\n\n{PROSE}\n\n{{code:title=rank0.log|borderStyle=solid}}\n"
                              f"{log}{{code}}\n\n{{quote}}Does it happen every time?{{quote}}\nYes, every time.\n"),
    "jira_noformat_in_quote": lambda log: f"{PROSE}\n{{quote}}\n{{noformat}}\n{log}{{noformat}}\n{{quote}}\nThanks.\n",
    "jira_quote": lambda log: f"{PROSE}\n\n{{quote}}\n{log}{{quote}}\n\nThat is all the output we have.\n",
    "jira_panel": lambda log: (f"{PROSE}\n\n{{panel:title=Log of rank 0}}\n{{code:none}}\n{log}{{code}}\n{{panel}}\n"
                               "{color:red}Blocking our release.{color}\n"),
    # Discourse (discuss.pytorch.org): BBCode quotes with the poster's name, a 4-backtick fence
    # holding a 3-backtick one (a post quoting its own Markdown), a [details] fold
    "discourse_quote": lambda log: (f"[quote=\"alice, post:3, topic:188412\"]\n{PROSE}\n```\n{log}```\n[/quote]\n\n"
                                    "Same here on 8 GPUs, any idea what is going on?\n"),
    "discourse_nested_fence": lambda log: f"{PROSE} My post as I wrote it:\n\n````\n```\n{log}```\n````\n",
    "discourse_details": lambda log: f"{PROSE}\n\n[details=\"Full log\"]\n```text\n{log}```\n[/details]\n",
    "discourse_rendered": lambda log: f"alice:\n\n> {PROSE}\n\n{_each(log, lambda ln: '> ' + ln)}\nSame here, is there a fix?\n",
    # StackOverflow: 4-space code after a language hint comment; the HTML the site serves
    "stackoverflow": lambda log: (f"{PROSE}\n\n<!-- language: lang-none -->\n\n{_each(log, lambda ln: '    ' + ln)}\n"
                                  "What am I doing wrong here?\n"),
    "html_pre_code": lambda log: (f"<p>{PROSE}</p>\n<pre class=\"lang-none prettyprint-override\"><code>"
                                  f"{html.escape(log)}</code></pre>\n<p>What am I doing wrong here?</p>\n"),
    # GitHub issue form (pytorch's bug-report.yml): the log fenced, collect_env pasted bare
    "github_issue_form": lambda log: (f"### 🐛 Describe the bug\n\n{PROSE}\n\n```\n{log}```\n\n### Versions\n\n"
                                      f"{COLLECT_ENV}\n\ncc @alice @bob\n"),
    # e-mail replies: "> " and ">> " nesting, the log in the inner quote
    "email": lambda log: (f"Hi Bob,\n\nsee the log below, it is the same as last week.\n\n"
                          f"On Tue, Mar 5, 2024 at 10:42 AM Bob <bob@example.com> wrote:\n> Can you send the log?\n"
                          f">\n>> {PROSE}\n>>\n{_each(log, lambda ln: '>> ' + ln)}>\n> Thanks, Bob\n\n-- \nAlice\n"),
    "email_quoted": lambda log: f"Any news on this?\n\n> {PROSE}\n>\n{_each(log, lambda ln: '> ' + ln)}",
    # chat clients: a prefix on every line of the log
    # chat pastes say what PROSE says (a 2-node job that dies): a sentence that adds a state of its own
    # ("stuck") would change the answer on purpose and hide a difference in the reading
    "slack": lambda log: ("[10:41 AM] alice: hi all, our 2-node training job dies after the evaluation phase\n"
                          + _each(log, lambda ln: "[10:42 AM] alice: " + ln)
                          + "[10:45 AM] bob: does it happen every time?\n[10:46 AM] alice: yes, every time after eval\n"),
    "teams": lambda log: ("[3/5/2024 10:41 AM] Alice Smith: our 2-node training job dies after the evaluation phase\n"
                          + _each(log, lambda ln: "[3/5/2024 10:42 AM] Alice Smith: " + ln)
                          + "[3/5/2024 10:45 AM] Bob Jones: does it happen every time?\n"),
    "irc": lambda log: ("<alice> our 2-node training job dies after the evaluation phase, log below\n"
                        + _each(log, lambda ln: "<alice> " + ln) + "<bob> does it happen every time?\n"),
    # a Markdown table of log lines
    "markdown_table": lambda log: f"{PROSE} Every line of the log:\n\n{_table(log)}\nAny idea?\n",
    # line endings and tabs
    "windows_crlf": lambda log: f"{PROSE}\r\n\r\n```\r\n{log.replace(chr(10), chr(13) + chr(10))}```\r\n\r\nThanks.\r\n",
    "tab_indented": lambda log: f"{PROSE}\n\n{_each(log, lambda ln: chr(9) + ln)}\nThanks for any help.\n",
}

#: Real files (each alone gives a finding) over the kinds a ticket quotes.
PARITY = [
    "logs/timeout_short/torchrun.log",
    "logs/gpu_oom/torchrun.log",
    "logs/nccl_bad_ifname/torchrun.log",
    "logs/cuda_illegal/torchrun.log",
    "logs/anomaly_nan/train.log",
    "logs/host_oom/dmesg.txt",
    "stacks/captured_formats/traceback-dataloader-rank1.txt",
    "stacks/public_formats/pytorch-129367-gdb-bt-rank3.txt",
    "gpu/h200/load/nvidia-smi-q.txt",
]


def _norm(text: str) -> list[str]:
    """Lines as a probe compares them: trailing blanks and blank lines do not matter."""
    return [ln.rstrip() for ln in text.replace("\r\n", "\n").split("\n") if ln.strip()]


def _causes(path: Path) -> list[tuple[str, str]]:
    """The causes (with severity) the machine evidence names. The symptom rules (SYM*) read the
    ticket's sentences, which the file has not: they may add leads, never change these."""
    return sorted({(f.cause, f.severity) for f in diagnose_path(path).findings if not f.rule.startswith("SYM")})


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("rel", PARITY + ["metrics/lr_jump/train.log"])
def test_blocks_hold_the_files_lines(form: str, rel: str) -> None:
    """The wrapper is gone: the blocks' lines are the file's lines, in order, and nothing else."""
    text = (FIX / rel).read_text()
    doc = ticket.split(FORMS[form](text))
    want = _norm(text)
    got = [ln for b in doc.blocks for ln in _norm(b.text)]
    if form == "github_issue_form":  # the collect_env paste is a block of its own, after the log
        got = got[:len(want)]
    assert got == want, (form, rel, [b.shape for b in doc.blocks])


def _name(form: str) -> str:
    """A tab-indented paste has no markup a log lacks (logs hold tabs): it is a ticket as a
    Markdown file (or stdin), where sentences around indented code say so; a .txt of it is a log."""
    return "issue.md" if form == "tab_indented" else "issue.txt"


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_form_is_a_ticket(form: str, tmp_path: Path) -> None:
    doc = tmp_path / _name(form)
    doc.write_text(FORMS[form]((FIX / PARITY[0]).read_text()), encoding="utf-8", newline="")
    assert ticket.is_document(Sample.read(doc)), form


@pytest.fixture(scope="module")
def file_causes() -> dict[str, list[tuple[str, str]]]:
    out = {rel: _causes(FIX / rel) for rel in PARITY}
    assert all(out.values()), out  # every file alone gives a finding: parity can fail
    return out


@pytest.mark.parametrize("form", sorted(FORMS))
def test_parity_with_the_files(form: str, tmp_path: Path, file_causes: dict[str, list[tuple[str, str]]]) -> None:
    """Wrapped in this form, each real file gives the causes (and severities) it gives alone."""
    differ = {}
    for i, rel in enumerate(PARITY):
        doc = tmp_path / f"{i}-{_name(form)}"
        doc.write_text(FORMS[form]((FIX / rel).read_text()), encoding="utf-8", newline="")
        got = _causes(doc)
        if got != file_causes[rel]:
            differ[rel] = (got, file_causes[rel])
    assert differ == {}, form


def test_a_log_level_is_not_a_chat_speaker() -> None:
    """"[10:42:11] INFO: ..." is a log line: its time and level stay on it."""
    line = "[10:42:11] INFO: Reducer buckets have been rebuilt in this iteration."
    assert ticket._CHAT.sub("", line, count=1) == line
    assert ticket._CHAT.sub("", "[3/5/2024 10:42 AM] Alice Smith: it hangs", count=1) == "it hangs"


def test_a_table_of_numbers_stays_whole_for_the_metrics_reader() -> None:
    text = ("The loss goes up after the restart:\n\n| step | loss | lr |\n|---:|---:|---:|\n"
            + "".join(f"| {i} | {2.5 - i / 10:.2f} | 1e-4 |\n" for i in range(1, 6)) + "\nAny idea?\n")
    doc = ticket.split(text)
    assert [b.shape for b in doc.blocks] == ["bare"]
    assert doc.blocks[0].text.splitlines()[0] == "| step | loss | lr |"


def test_a_heading_is_the_reporters_words() -> None:
    """A title that mentions a metric once ("around epoch 30-100") is prose for the symptoms
    reader; a metric record ("step 10 loss 2.31", "loss: nan") is machine output."""
    doc = ticket.split("# Loss spiking around epoch 30-100\n\nWe see the loss go up between epochs 30 and 100.\n")
    assert doc.blocks == [] and doc.prose.startswith("# Loss spiking")
    assert ticket._is_machine("step 10 loss 2.31") and ticket._is_machine("loss: nan")
    assert not ticket._is_machine("the loss is 3.2 at step 300 and then it goes up")


def test_a_block_stops_at_another_quote_level() -> None:
    log = (FIX / PARITY[0]).read_text()
    doc = ticket.split("> > " + log.replace("\n", "\n> > ").rstrip("> ") + "> Thanks, Bob\n> Regards\n")
    assert "Thanks, Bob" not in "".join(b.text for b in doc.blocks)


def test_a_title_that_quotes_an_error_is_still_machine_output(tmp_path: Path) -> None:
    """Many issues are titled with the error itself; the title then is evidence (a heading that
    only mentions a metric, "# Loss spiking around epoch 30", stays the reporter's words)."""
    from doctor.engine.diagnose import diagnose_path

    note = tmp_path / "issue.md"
    note.write_text("# RuntimeError: CUDA error: an illegal memory access was encountered\n\n"
                    "happens at step 10\n\nany idea?\n")
    rep = diagnose_path(note)
    assert "logs" in rep.facts["evidence"]["kinds"]
    assert rep.findings and rep.findings[0].cause == "cuda_kernel_fault"
    assert not ticket._is_machine("# Loss spiking around epoch 30")


def test_an_unowned_note_with_numbers_is_read_whole_not_only_by_metrics(tmp_path: Path) -> None:
    """A written note that no reader owns is split as a ticket even when a co-reader (metrics)
    would take its numbers: its words and log lines are evidence too."""
    from doctor.engine.diagnose import diagnose_path

    note = tmp_path / "notes.md"
    note.write_text("The loss was fine for a while and then it started to climb.\n"
                    "loss: 2.31\nloss: 2.35\nloss: nan\nWe use fp16 with the default scaler.\n")
    owner, also = facts_mod.dispatch(Sample.read(note), tuple(plugins.probes()))
    assert owner is None and [p.name for p in also] == ["metrics"]  # the shape this test is about
    kinds = diagnose_path(note).facts["evidence"]["kinds"]
    assert {"metrics", "symptoms"} <= set(kinds), kinds


@pytest.mark.parametrize("name", ["issue.md", "notes.txt"])
def test_a_one_line_note_is_the_reporters_words(tmp_path: Path, name: str) -> None:
    """One short sentence in a note is all some reporters write. It has too few function words to
    count as prose and a step number that a progress counter matches, yet it is neither a log
    (a log with no error would read as a healthy job) nor nothing: its state is the verdict's."""
    note = tmp_path / name
    note.write_text("Training crashes at step 500.\n")
    rep = diagnose_path(note)
    assert rep.facts["evidence"]["kinds"] == ["symptoms"]
    assert rep.verdict["state"] == "crashed" and rep.exit_code == 3
