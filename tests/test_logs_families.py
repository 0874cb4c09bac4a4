"""logs.families: the failure families rules weigh priors against, named once in probes/logs/facts.py.

A kind name misspelt in FAMILIES would silently never count, and a rule's stand-back with it;
so every name must be a kind some signature of the library emits. The fact itself is built from
a real captured gloo collective-timeout log (tests/fixtures/logs/timeout_short)."""

from __future__ import annotations

from pathlib import Path

from doctor.engine import facts as facts_mod
from probes.logs.facts import FAMILIES
from probes.logs.library import library

FIX = Path(__file__).parent / "fixtures"


def test_every_family_kind_is_emitted_by_a_signature() -> None:
    kinds = {s.kind for s in library().signatures}
    for family, members in FAMILIES.items():
        assert members <= kinds, f"{family}: {sorted(members - kinds)}"


def test_families_do_not_overlap() -> None:
    seen: dict[str, str] = {}
    for family, members in FAMILIES.items():
        for k in members:
            assert k not in seen, f"{k} in {seen.get(k)} and {family}"
            seen[k] = family


def test_a_collective_timeout_log_is_in_the_hang_family() -> None:
    facts, _ = facts_mod.build(facts_mod.items_from_folder(FIX / "logs" / "timeout_short"), "loose")
    logs = facts["logs"]
    assert "gloo_timeout" in logs["counts"]  # the gloo side of a collective timeout
    assert "hang" in logs["families"]
    assert not {"cuda", "memory"} & set(logs["families"])


def test_timeout_explainers_are_emitted_kinds_and_reach_the_facts() -> None:
    from probes.logs.facts import TIMEOUT_EXPLAINERS
    assert TIMEOUT_EXPLAINERS <= {s.kind for s in library().signatures}
    facts, _ = facts_mod.build(facts_mod.items_from_folder(FIX / "logs" / "worker_kill"), "loose")
    logs = facts["logs"]
    assert logs["timeout_explained_by"] == sorted(TIMEOUT_EXPLAINERS & logs["counts"].keys())
    assert "dataloader_worker_died" in logs["timeout_explained_by"]
