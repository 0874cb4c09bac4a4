"""What the reporter says: the prose of a ticket or paste as ``symptoms`` facts.

Why a kind of its own: a ticket's sentences ("hangs at init, only multi-node; works with
NCCL_P2P_DISABLE=1") carry what no log holds: how the job looked, when, where, what changed and
which workaround helped. They are weaker than machine evidence (people guess), so rules read
them at a lower confidence. This kind never claims a file by content: the ticket splitter
(``doctor.evidence.ticket``) hands it a document's prose (``reads_prose``); the TUI's answers
produce the same facts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from doctor.evidence.contract import Hints, Parsed, Probe, Sample
from doctor.evidence.errors import EvidenceError

from . import read

#: Values each list can hold (the library's ``value`` fields); documented in the schema.
STATES = "hang | slow | crash | oom | diverge"
WHEN = "init | first_step | epoch_end | checkpoint | evaluation | after_steps | after_hours | gradual"
WHERE = "rank0_only | one_rank | one_node | multi_node | single_node_works | single_gpu_works"
CHANGED = "driver | nccl | torch | cuda | container | nodes | code | data | config | versions (walkthrough: some library or driver)"
FIXES = ("nccl_p2p_disable | nccl_ib_disable | nccl_shm_disable | num_workers_0 | fp32 | no_compile | "
         "bigger_shm | longer_timeout | smaller_batch | nccl_socket_ifname")

CONTEXT = ("fp16 | amp | bf16 | compile | high_lr | low_gpu_util | multi_gpu | dataloader | scaling | "
           "crash_segfault | crash_killed | crash_nccl | crash_cuda | shared_storage")

TOPICS = "cause ids of doctor/engine/taxonomy.yaml, from probes/symptoms/patterns/topics.yaml"

MAX_PROSE = 4 * 1024 * 1024


class SymptomsProbe(Probe):
    name: ClassVar[str] = "symptoms"
    title: ClassVar[str] = "Reported symptoms"
    collects: ClassVar[str] = ("What a ticket's or paste's prose (or the TUI's answers) say: state, when, where, "
                               "what changed, which workaround helped and which causes the words name; negated, "
                               "questioned (and, for causes, hedged) phrases are kept but not asserted.")
    priority: ClassVar[int] = 0
    build_order: ClassVar[int] = 90
    max_bytes: ClassVar[int] = 64 * 1024 * 1024
    reads_prose: ClassVar[bool] = True
    #: Tickets built from real captured evidence (tests/fixtures/tickets/make_tickets.py).
    fixtures: ClassVar[tuple[str, ...]] = ("tests/fixtures/tickets/[a-z]*.md",)
    facts_schema: ClassVar[dict[str, str]] = {
        "symptoms.states": f"list<string>: job states the reporter asserts ({STATES}), first mentioned first",
        "symptoms.state": "string: the first asserted state, or ''",
        "symptoms.firm_states": ("list<string>: the asserted states said outright in at least one sentence, "
                                 "not only as a possibility ('it might hang'); what the differential rules read"),
        "symptoms.when": f"list<string>: when it happens ({WHEN})",
        "symptoms.where": f"list<string>: where it happens ({WHERE})",
        "symptoms.changed": f"list<string>: what changed before it started ({CHANGED})",
        "symptoms.fixes": f"list<string>: workarounds the reporter says helped ({FIXES})",
        "symptoms.context": (f"list<string>: setup and signs the reporter names besides the state ({CONTEXT}), "
                             "asserted like the others"),
        "symptoms.tried": "list<string>: workarounds the reporter mentions trying, whatever the outcome (values as fixes)",
        "symptoms.topics": (f"list<string>: causes the reporter's words name ({TOPICS}), first mentioned "
                            "first; a hint at low confidence, never machine evidence"),
        "symptoms.healthy": ("bool: the reporter says the job runs fine and asserts no fault state, or says the run "
                             "ends well ('still finishes fine', 'harmless'): a question about a working job"),
        "symptoms.after_steps": "int|null: the step count named ('after 2k steps'), null when none",
        "symptoms.phrases": "list<map>: every phrase hit, asserted or not",
        "symptoms.phrases[].id": "string: pattern id in probes/symptoms/patterns",
        "symptoms.phrases[].fact": "string: the list it feeds (states, when, where, changed, fixes, tried, topics, healthy)",
        "symptoms.phrases[].value": "string: the value it adds (a cause id for topics)",
        "symptoms.phrases[].text": "string: the sentence (cut to 200 characters)",
        "symptoms.phrases[].where": "string: document and line ('issue.md prose, line 12')",
        "symptoms.phrases[].asserted": "bool: counted as the reporter's statement",
        "symptoms.phrases[].why_not": "string: '' | negated | question | hedged (a guess: 'maybe', 'I suspect'; topics only) | expected (under a bug-report template's Expected behavior heading)",
        "symptoms.phrases[].guessed": "bool: a state said only as a possibility ('it might hang'); still asserted",
        "symptoms.sources": "list<string>: the documents the prose came from",
    }

    def sniff(self, sample: Sample) -> bool:
        """Never by content: prose reaches this kind only through the ticket splitter."""
        return False

    def parse(self, path: Path, rel: str, hints: Hints) -> Parsed:
        with open(path, "rb") as fh:
            text = fh.read(MAX_PROSE).decode("utf-8", errors="replace")
        if not text.strip():
            raise EvidenceError(rel, "no prose")
        found = read.phrases(text)
        return Parsed(self.name, rel, {"phrases": [p.to_json(rel) for p in found],
                                       "after_steps": read.after_steps(text)}, None, None)

    def build(self, parsed: list[Parsed], facts: dict[str, Any]) -> None:
        phrases = [ph for p in parsed for ph in p.data["phrases"]]
        lists: dict[str, list[str]] = {k: [] for k in ("states", "when", "where", "changed", "fixes", "tried",
                                                       "topics", "healthy", "context")}
        for ph in phrases:
            bucket = lists.get(ph["fact"])
            if bucket is not None and ph["asserted"] and ph["value"] not in bucket:
                bucket.append(ph["value"])
        # "runs fine" only settles the job's state when no sentence reports a fault; "the run
        # finishes fine" or "harmless" does even then (warnings seen in a run that ended well)
        said = lists.pop("healthy")
        healthy = "ends_fine" in said or (bool(said) and not lists["states"])
        steps = next((p.data["after_steps"] for p in parsed if p.data.get("after_steps") is not None), None)
        # a state is firm when one sentence says it outright, not only as a possibility
        firm = [s for s in lists["states"] if any(ph["fact"] == "states" and ph["value"] == s and ph["asserted"]
                                                   and not ph.get("guessed") for ph in phrases)]
        facts["symptoms"] = {**lists, "state": lists["states"][0] if lists["states"] else "", "healthy": healthy,
                             "firm_states": firm,
                             "after_steps": steps, "phrases": phrases[:200],
                             "sources": sorted({p.path for p in parsed})}

    def unexplained_state(self, facts: dict[str, Any]) -> dict[str, str] | None:
        """With no rule fired, what the reporter says the job did is still better than "healthy":
        a ticket that reads "training dies after two epochs" and quotes nothing mldoctor knows
        is a crashed job whose cause is not in the evidence, not a job with no problem. Only an
        asserted state counts (not a negated or questioned one, nor one only supposed: "it might
        hang"), and not when the reporter also says the job ends well (then the alarming words
        describe warnings of a good run)."""
        sym = facts.get("symptoms") or {}
        if sym.get("healthy"):
            return None
        states = sym.get("firm_states") if "firm_states" in sym else sym.get("states")
        said = next((s for s in states or [] if s in _REPORTED_STATE), "")
        if not said:
            return None
        return {"state": _REPORTED_STATE[said],
                "summary": f"The reporter says the job {_REPORTED_WORDS[said]}, and no rule names a cause from "
                           "the evidence given; the logs, stacks or metrics of the failing run would decide."}


#: The job state a reported symptom stands for, and how the verdict words it.
_REPORTED_STATE = {"crash": "crashed", "oom": "crashed", "hang": "hung", "slow": "slow", "diverge": "diverging"}
_REPORTED_WORDS = {"crash": "crashes", "oom": "runs out of memory", "hang": "hangs", "slow": "is slow",
                   "diverge": "diverges (NaN/inf or a rising loss)"}


PROBE = SymptomsProbe()
