"""The walkthrough's questions, as data (``questions.patterns.yaml``, a pattern library).

Each question says when it is asked (a CEL condition, the rules' language, over the facts and
a ``session`` map: symptom, state, n_findings, top_cause, top_confidence, high_confidence,
live, has_report, answered) and what each answer does: set the symptom hint the engine gets,
add evidence to read (a typed path), or leave a note in the report. Answers never make findings.

Only questions the evidence cannot answer are here: whether it ever worked at this scale and
what changed are not in any log; how the job looked to its owner is the symptom itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from doctor.engine import celexpr
from doctor.evidence.patterns import parse_library
from doctor.evidence.yamlsrc import safe_data


@dataclass(frozen=True)
class Answer:
    label: str
    #: The engine's symptom hint (hang | slow | crash | diverge), for questions that set it.
    symptom: str | None = None
    #: The sentence kept in the report as the user's note; empty keeps the chosen label.
    note: str = ""
    #: The answer's entry in the pattern library (how people say it in a ticket).
    pattern_id: str = ""
    #: ``(list, value)`` pairs added to the ``symptoms.*`` facts, the ones a ticket saying the same
    #: thing would give (``symptoms.states`` += ``hang``).
    facts: tuple[tuple[str, str], ...] = ()


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


LIBRARY = Path(__file__).with_name("questions.patterns.yaml")


def _load() -> tuple[Question, ...]:
    """The questions in asking order, each with its answers (the library's entries)."""
    text = LIBRARY.read_text(encoding="utf-8")
    answers: dict[str, list[Answer]] = {}
    for p in parse_library(LIBRARY.name, text):
        f = p.fields
        answers.setdefault(str(f["question"]), []).append(
            Answer(str(f["label"]), f.get("symptom"), str(f.get("note") or ""), p.id,
                   tuple((str(k), str(v)) for k, v in (f.get("facts") or {}).items())))
    out = []
    for q in safe_data(text)["questions"]:
        out.append(Question(id=q["id"], text=q["text"], why=q["why"], when=q["when"],
                            answers=tuple(answers.get(q["id"], ())), sets_symptom=bool(q.get("sets_symptom")),
                            free_text=str(q.get("free_text") or ""), placeholder=str(q.get("placeholder") or "")))
    return tuple(out)


QUESTIONS: tuple[Question, ...] = _load()


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
