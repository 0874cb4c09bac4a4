"""Phrases of a ticket's prose -> symptom facts, with negations and questions kept apart.

Why sentences, not lines: Markdown wraps a sentence over several lines and one line can hold
two sentences; what negates or questions a phrase ("it does not hang", "is it OOM?") lives in
its sentence. A phrase counts as the reporter's statement only when its sentence is not a
question and no negation stands just before it in the same clause; the others are kept, marked,
so a reader sees what was set aside and why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from doctor.evidence.patterns import MAX_TEXT, Pattern, load_library

#: The fact lists a pattern may feed (``fact:`` in the library); ``outcome`` entries only tell
#: whether a workaround named in the same sentence helped; ``topics`` entries name a cause of
#: ``doctor/engine/taxonomy.yaml`` (``cause:``) the reporter's words point at; ``healthy``
#: entries say the job runs fine (a question about it, not a fault report); ``context`` entries
#: name the setup or a sign the reporter mentions (fp16, torch.compile, low GPU utilization),
#: which the differential rules (SYM054+) combine with the state.
FACTS = ("states", "when", "where", "changed", "fixes", "outcome", "topics", "healthy", "context")

#: Chinese and Japanese end a sentence with a full-width mark and no space after it.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(\[])|\n\s*\n|(?<=[.!?])\s*\n|(?<=[。！？])\s*")
#: A negation in the few words before a phrase, in the same clause.
_NEGATION = re.compile(
    r"\b(?:not|never|no longer|isn'?t|doesn'?t|don'?t|didn'?t|wasn'?t|aren'?t|won'?t|can'?t|cannot|"
    r"no|nor|neither|without any)\s+(?:\w+[\s,]+){0,2}$", re.I)
_CLAUSE_BREAK = re.compile(r"[,;:，；：]|\bbut\b|\bhowever\b|\band\b|\bwhile\b|但是|不过|然而", re.I)
#: A Chinese negation written straight before the phrase, with no space ("不报错", "没有任何报错",
#: "也没报错"): the word-based ``_NEGATION`` cannot see it, as Chinese has no spaces between words.
_CJK_NEGATION = re.compile(r"(?:不|没有?|未|无|并非|从未|从没)(?:任何|再|出现|发生|会|有|什么)?$")
#: A guess rather than a report ("maybe it is shm", "I suspect the network"): a cause hint
#: (``topics``) in such a clause is kept but not asserted, since people name suspects freely.
_HEDGE = re.compile(
    r"\b(?:maybe|perhaps|possibly|might|may be|could be|could it|suspect\w*|wonder\w*|guess\w*|not sure|"
    r"unsure|whether|rule[sd]? out|ruling out|instead of|rather than|unlike|unrelated)\b", re.I)
#: A state said as a possibility rather than a report ("it might hang", "maybe it is just slow",
#: "not sure whether it hangs"; a condition such as "if we use two nodes it hangs" still reports):
#: still counted in ``states`` (the rules before the differential read it so), but marked
#: ``guessed`` so that rules ranking causes by the state alone (the differential, SYM054+) act
#: only on a state the reporter asserts outright.
_STATE_GUESS = re.compile(
    r"\b(?:maybe|perhaps|possibly|might|may|could|would|not sure|unsure|whether)\b", re.I)
#: A question that presupposes what it names ("Why does training hang?", "How do I fix the CUDA
#: OOM?") still reports it; a yes/no question ("Is it OOM?", "Could it be shm?") only guesses.
_PRESUPPOSING = re.compile(
    r"^\W*(?:(?:so|but|and|ok|hi|hello|any (?:idea|ideas|clue|hint)s?)\W+)*(?:why\b|how come\b|"
    r"how (?:do|can|could|should|would|to|might) (?:i |we |you |one )?(?:fix|avoid|solve|debug|resolve|prevent|"
    r"stop|get rid of|handle|deal with|work around|diagnose|find|speed|reduce|make)\b|"
    r"what (?:causes|is causing|could cause|can cause|would cause|might cause|makes)\b|"
    r"what (?:can|should|could) (?:i|we) do\b|what (?:is|are|was|were|could be|can be|might be|would be) "
    r"(?:the |a )?(?:possible |likely |root |main |real )?(?:reasons?|causes?)\b)|"
    # Chinese asks "why" anywhere in the sentence: 为什么/为啥 (why), 什么原因 (what reason), 怎么回事
    r"为什么|为何|为啥|什么原因|啥原因|怎么回事", re.I)
#: A question whether what one sees is a problem at all ("..., is that normal?", "can I ignore
#: these warnings?") reports no fault: every phrase of its sentence is only asked about.
_NORMALITY = re.compile(
    r"\b(?:is (?:this|that|it|this behaviou?r|that behaviou?r) (?:normal|expected|ok|okay|fine|harmful|bad|safe|"
    r"a (?:problem|bug|concern|real (?:problem|issue))|an? (?:issue|error)|something to worry about)|"
    r"(?:can|could|should) (?:i|we) (?:safely )?ignore|should (?:i|we) (?:be )?worr\w*|do (?:i|we) need to worry|"
    r"are (?:these|those|they) (?:normal|expected|harmful|a problem))\b", re.I)
#: What no training run does normally: asking whether a NaN or infinite loss is normal still
#: reports one ("Is it normal to have NaN loss?"), unlike asking about a warning or a slow step.
_NEVER_NORMAL = re.compile(r"\b(?:nan|inf|infinite|infinity)\b(?:\W+\w+){0,2}?\W+(?:loss|grad\w*)\b|"
                           r"\b(?:loss|grad\w*)\b(?:\W+\w+){0,3}?\W+(?:nan|inf|infinite|infinity)\b", re.I)
#: A yes/no question guesses from its first word on ("Is it OOM?", "Could the network be at
#: fault?"); any other question only asks in its last clause ("Training crashes with an OOM
#: after 3 epochs, any idea?" still reports the OOM).
_YES_NO = re.compile(
    r"^\W*(?:is|are|was|were|could|can|would|should|does|do|did|might|may|has|have|will|shall|any chance|"
    r"isn'?t|aren'?t|doesn'?t|don'?t)\b", re.I)
#: The placeholder text of issue templates, left in by many reporters ("A clear and concise
#: description of what the bug is", "Reproduce this error with a file ..."): it describes no job,
#: so its words add nothing ("this error" in it is no crash).
_TEMPLATE = re.compile(
    r"\ba clear and concise description of\b|\bsteps to reproduce the behaviou?r\b|\breproduce this (?:error|bug|issue) "
    r"with\b|\bprovide a (?:full )?(?:log|screenshot)\b|\bif it is not possible, leave it blank\b|"
    r"\bwhat you expected to happen\b|\bplease (?:describe|provide|paste|include|fill)\b|\bthe output of `?python collect_env|"
    r"\bif you are submitting an issue for the first time\b|\bhave you searched\b|\bi have searched (?:the|related|existing)\b|"
    r"\bplease use english\b|\bcopy-and-paste the text below\b", re.I)
#: A heading (Markdown ``#`` or a bold line) of a section whose words are not the report: what the
#: reporter expected ("Expected behavior" says how the job should have run). An environment
#: section is not one: reporters often write what they saw there ("GPU util was 0%"), and its
#: dumps are machine blocks the splitter already took out of the prose.
_HEADING = re.compile(r"^\s*(?:#{1,6}\s+|\*\*)")
_SIDE_SECTION = re.compile(
    r"^\s*(?:#{1,6}\s+|\*\*)\W*(?:expected (?:behaviou?r|results?|outputs?)|desired behaviou?r|期望(?:行为|结果)?|"
    r"预期(?:行为|结果)?)", re.I)
#: Sentences and characters read per document: a ticket says what matters early, and a 1 MB
#: essay (or garbage with no sentence end) would otherwise cost seconds for nothing new.
MAX_SENTENCES = 2000
MAX_PROSE_CHARS = 256 * 1024
_STEPS = re.compile(r"\bafter (?:about |around |roughly |~)?(\d[\d,.]*)\s*(k)?\s*(?:steps|iterations|iters|batches)\b", re.I)


@dataclass(frozen=True)
class Phrase:
    id: str
    fact: str
    value: str
    text: str
    line: int
    asserted: bool
    why_not: str   # "" | negated | question | hedged | expected (in a template's Expected behavior section)
    #: a state phrase in a clause that only supposes it ("it might hang"): asserted, but not firm
    guessed: bool = False

    def to_json(self, rel: str) -> dict[str, Any]:
        return {"id": self.id, "fact": self.fact, "value": self.value, "text": self.text[:200],
                "where": f"{rel}, line {self.line}", "asserted": self.asserted, "why_not": self.why_not,
                "guessed": self.guessed}


@lru_cache(maxsize=1)
def library() -> tuple[Pattern, ...]:
    """Every phrase pattern of ``patterns/*.yaml`` (checked by the one pattern loader)."""
    folder = Path(str(resources.files("doctor.probes.symptoms"))) / "patterns"
    out: list[Pattern] = []
    for f in sorted(folder.glob("*.yaml")):
        out.extend(load_library(f))
    return tuple(out)


def sentences(text: str) -> list[tuple[int, str]]:
    """(1-based line, sentence) for every sentence of the prose; wrapped lines are joined.
    At most ``MAX_SENTENCES`` sentences, from the first ``MAX_PROSE_CHARS`` characters."""
    out: list[tuple[int, str]] = []
    pos, line, counted = 0, 1, 0
    for m in list(_SENTENCE_END.finditer(text)) + [None]:
        end = m.start() if m else len(text)
        chunk = text[pos:end]
        if chunk.strip():
            lead = len(chunk) - len(chunk.lstrip())
            line += text.count("\n", counted, pos + lead)  # counted once, left to right
            counted = pos + lead
            out.append((line, " ".join(chunk[:MAX_TEXT].split())))
            if len(out) >= MAX_SENTENCES or pos > MAX_PROSE_CHARS:
                break
        pos = m.end() if m else len(text)
    return out


def _negated(sentence: str, start: int) -> bool:
    before = sentence[max(0, start - 80):start]
    if _CJK_NEGATION.search(before[-6:]):
        return True
    cut = [b.end() for b in _CLAUSE_BREAK.finditer(before)]
    clause = before[cut[-1]:] if cut else before
    return bool(_NEGATION.search(clause))


def _hedged(sentence: str, start: int) -> bool:
    before = sentence[max(0, start - 80):start]
    cut = [b.end() for b in _CLAUSE_BREAK.finditer(before)]
    return bool(_HEDGE.search(before[cut[-1]:] if cut else before))


def _guessed(sentence: str, start: int) -> bool:
    """A state in a clause that only supposes it ("it might hang", "maybe it is slow")."""
    before = sentence[max(0, start - 80):start]
    cut = [b.end() for b in _CLAUSE_BREAK.finditer(before)]
    return bool(_STATE_GUESS.search(before[cut[-1]:] if cut else before))


#: A sentence end the splitter kept inside one sentence ("... was killed when I test. do you know
#: why?": a lowercase start does not open a new sentence for it); a question asks from there on.
_INNER_END = re.compile(r"[.!](?=\s+\S)")


def _last_clause(sentence: str) -> int:
    """Where the clause a question mark closes begins (0: the whole sentence)."""
    cut = [b.end() for b in _CLAUSE_BREAK.finditer(sentence)] + [b.end() for b in _INNER_END.finditer(sentence)]
    return max(cut) if cut else 0


def value_of(p: Pattern) -> str:
    """What an entry adds: its ``cause`` for a topic entry, its ``value`` otherwise."""
    return str(p.fields.get("cause") if p.fields.get("fact") == "topics" else p.fields.get("value"))


def phrases(text: str) -> list[Phrase]:
    """Every pattern hit in the prose, each marked asserted or not (and why)."""
    lib = library()
    out: list[Phrase] = []
    side = ""
    for line, s in sentences(text):
        if _HEADING.match(s):  # a section starts: its heading decides how its sentences count
            side = "expected" if _SIDE_SECTION.match(s) else ""
        # a template's placeholder is blanked, not the sentence: reporters often write on after it
        # ("Steps to reproduce the behavior: with 3 GPUs the training was slower")
        s = _TEMPLATE.sub(lambda m: " " * len(m.group(0)), s)
        if not s.strip():
            continue
        question = s.rstrip().endswith(("?", "？"))
        normality = question and bool(_NORMALITY.search(s))
        # "is a NaN loss normal?" reports the NaN (and is no sign of a healthy job)
        reports_nan = normality and bool(_NEVER_NORMAL.search(s))
        normality = normality and not reports_nan
        presupposed = reports_nan or (question and not normality and bool(_PRESUPPOSING.search(s)))
        asks_from = 0 if not question or _YES_NO.search(s) or normality else _last_clause(s)
        hits = [(p, m) for p in lib for m in [p.regex.search(s)] if m]
        outcomes = {str(p.fields.get("value")) for p, _ in hits if p.fields.get("fact") == "outcome"}
        for p, m in hits:
            fact = str(p.fields.get("fact"))
            if fact == "outcome" or (fact == "healthy" and reports_nan):
                continue
            value = value_of(p)
            # "is this normal?" is itself the sign of a working job: a healthy phrase is never "asked"
            asked = question and fact != "healthy" and (
                fact == "fixes" or (not presupposed and m.start() >= asks_from))
            why = "question" if asked else ""
            if fact == "fixes":
                # a workaround: its outcome, not a negation before it, says whether it helped
                if not why and "bad" not in outcomes and "good" in outcomes:
                    out.append(Phrase(p.id, "fixes", value, s, line, True, ""))
                out.append(Phrase(p.id, "tried", value, s, line, not why, why))
                continue
            if not why and side and fact not in ("context", "changed"):
                why = side  # what the reporter expected, not what happened
            if not why and _negated(s, m.start()):
                why = "negated"
            if not why and fact == "topics" and _hedged(s, m.start()):
                why = "hedged"
            guess = not why and fact == "states" and _guessed(s, m.start())
            out.append(Phrase(p.id, fact, value, s, line, not why, why, guess))
    return out


def after_steps(text: str) -> int | None:
    """The step count a reporter gives ("after 2k steps"), the first one named."""
    m = _STEPS.search(text)
    if not m:
        return None
    try:
        n = float(m.group(1).replace(",", ""))
    except ValueError:
        return None
    return int(n * (1000 if m.group(2) else 1))
