"""The walkthrough's questions, as data.

Each question says when it is asked (a CEL condition, the rules' language, over the facts and
a ``session`` map: symptom, state, n_findings, top_cause, top_confidence, high_confidence,
live, has_report, answered) and what each answer does: set the symptom hint the engine gets,
add evidence to read (a typed path), or leave a note in the report. Answers never make findings.

Only questions the evidence cannot answer are here: whether it ever worked at this scale and
what changed are not in any log; how the job looked to its owner is the symptom itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from doctor.engine import celexpr


@dataclass(frozen=True)
class Answer:
    label: str
    #: The engine's symptom hint (hang | slow | crash | diverge), for questions that set it.
    symptom: str | None = None
    #: The sentence kept in the report as the user's note; empty keeps the chosen label.
    note: str = ""


@dataclass(frozen=True)
class Question:
    id: str
    text: str
    #: Why we ask: what the evidence cannot tell.
    why: str
    #: CEL over the facts and ``session``; the question is asked when it is true.
    when: str
    answers: tuple[Answer, ...]
    #: The chosen answer's ``symptom`` replaces the hint (None: let the engine find out).
    sets_symptom: bool = False
    #: "" (choices only), "note" (a typed answer becomes a note) or "path" (a typed path is
    #: read as more evidence, and the diagnosis runs again).
    free_text: str = ""
    #: Placeholder of the typed answer.
    placeholder: str = ""


NOT_HIGH = "!session.high_confidence"

QUESTIONS: tuple[Question, ...] = (
    Question(
        id="symptom",
        text="What do you see?",
        why="How the job looks from outside decides which probes run first.",
        when="true",
        sets_symptom=True,
        answers=(
            Answer("no progress (no new steps, stuck)", "hang"),
            Answer("slower than usual", "slow"),
            Answer("crashed (a rank or the job exited)", "crash"),
            Answer("loss looks wrong (NaN, spikes, rising)", "diverge"),
            Answer("not sure", None),
        ),
    ),
    Question(
        id="stuck_or_slow",
        text="Are new steps still being logged?",
        why="The evidence could not tell stuck from slow or healthy.",
        when='session.has_report && session.symptom == "" && session.state in ["unknown", "healthy"]',
        sets_symptom=True,
        answers=(
            Answer("no, nothing new for minutes", "hang"),
            Answer("yes, but slower than before", "slow"),
            Answer("the processes exited", "crash"),
            Answer("yes, but the loss is off", "diverge"),
        ),
    ),
    Question(
        id="scale",
        text="Did it ever work at this scale{scale}?",
        why="No log says whether this world size ever ran; scale-only failures point elsewhere.",
        when=f"session.has_report && {NOT_HIGH}",
        answers=(
            Answer("yes, the same scale worked before", note="It worked before at this scale."),
            Answer("no, first run at this scale",
                   note="First run at this scale: scale-dependent causes (timeouts, memory, topology) stay in play."),
            Answer("don't know"),
        ),
    ),
    Question(
        id="changed",
        text="What changed since the last good run?",
        why="No rule fired with high confidence; a recent change is often the lead.",
        when=f"session.has_report && {NOT_HIGH}",
        free_text="note",
        placeholder="or type what changed, then Enter",
        answers=(
            Answer("our code or model", note="Changed since the last good run: code or model."),
            Answer("the data", note="Changed since the last good run: the data."),
            Answer("PyTorch / NCCL / driver versions", note="Changed since the last good run: library or driver versions."),
            Answer("nodes, network or cluster", note="Changed since the last good run: nodes, network or cluster."),
            Answer("config (batch size, LR, precision)", note="Changed since the last good run: the training config."),
            Answer("nothing I know of", note="Nothing known changed since the last good run."),
        ),
    ),
    Question(
        id="same_step",
        text="Does it stop at the same step every time?",
        why="One snapshot cannot tell a reproducible stop from a random one.",
        when=f'session.has_report && session.symptom == "hang" && {NOT_HIGH}',
        answers=(
            Answer("yes, same step", note="Stops at the same step each run: suspect code or data on one path."),
            Answer("no, it varies", note="Stops at varying steps: suspect hardware, network or timing."),
            Answer("first time it happened"),
        ),
    ),
    Question(
        id="slow_since",
        text="Slow from the first step, or did it slow down over time?",
        why="A gradual slowdown and a slow start have different causes.",
        when=f'session.has_report && session.symptom == "slow" && {NOT_HIGH}',
        answers=(
            Answer("slow from the start", note="Slow from the first step."),
            Answer("slowed down over time", note="Slowed down during the run."),
            Answer("don't know"),
        ),
    ),
    Question(
        id="metrics_file",
        text="Where does the job write its loss?",
        why="No metrics were found in the evidence; a CSV, JSONL or trainer log lets mldoctor read the curve.",
        when=('session.has_report && session.symptom == "diverge" && '
              '!("metrics" in evidence.kinds)'),
        free_text="path",
        placeholder="path to a metrics/log file or folder, then Enter",
        answers=(Answer("I have no metrics file"),),
    ),
    Question(
        id="crash_scope",
        text="Did every rank exit, or only some?",
        why="Which ranks died first is not always in the logs that were found.",
        when=f'session.has_report && session.symptom == "crash" && {NOT_HIGH}',
        answers=(
            Answer("one or a few ranks first", note="Only some ranks exited first."),
            Answer("all ranks at once", note="All ranks exited together."),
            Answer("don't know"),
        ),
    ),
)


def by_id(qid: str) -> Question:
    for q in QUESTIONS:
        if q.id == qid:
            return q
    raise KeyError(qid)


def applies(q: Question, facts: dict[str, Any], session: dict[str, Any]) -> bool:
    """Is ``q``'s condition true? A condition that cannot be evaluated counts as false."""
    variables: dict[str, Any] = {k: v for k, v in facts.items() if isinstance(v, dict)}
    variables["evidence"] = {"kinds": [], **(variables.get("evidence") or {})}
    variables.setdefault("job", {})
    variables["session"] = session
    try:
        result = celexpr.compile_expr(q.when).execute(celexpr.cel().Context(variables))
    except Exception:  # noqa: BLE001 - a question is optional; a broken condition skips it
        return False
    return result is True


def next_question(facts: dict[str, Any], session: dict[str, Any]) -> Question | None:
    """The first unanswered question whose condition holds now."""
    done = set(session.get("answered") or [])
    for q in QUESTIONS:
        if q.id not in done and applies(q, facts, session):
            return q
    return None


def text_of(q: Question, facts: dict[str, Any]) -> str:
    """The question with its placeholders filled from the facts."""
    ws = (facts.get("job") or {}).get("world_size") or 0
    return q.text.format(scale=f" ({ws} ranks)" if ws else "")
