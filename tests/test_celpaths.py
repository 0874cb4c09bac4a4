"""The CEL path checker parses every shipped rule and catches typos after indexes and macros."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from doctor.engine import celexpr, celpaths
from doctor.engine import facts as facts_mod

ROOT = Path(__file__).resolve().parents[1]
NS = {"stacks", "logs", "job", "evidence", "gpu", "env", "metrics", "flight_recorder", "procs",
      "system", "samples", "slurm", "meta"}


def _expressions() -> list[tuple[str, str]]:
    out = []
    for path in sorted((ROOT / "rules").glob("*/*.yaml")):
        if path.name.endswith(".test.yaml"):
            continue
        rule = yaml.safe_load(path.read_text())
        for key in ("when", "ranks", "hosts", "gpus", "evidence"):
            if isinstance(rule.get(key), str):
                out.append((f"{path.stem}.{key}", rule[key]))
        for name, src in (rule.get("vars") or {}).items():
            out.append((f"{path.stem}.vars.{name}", src))
        for i, fu in enumerate(rule.get("follow_up") or []):
            for key in ("ranks", "when"):
                if isinstance(fu.get(key), str):
                    out.append((f"{path.stem}.follow_up[{i}].{key}", fu[key]))
    return out


EXPRS = _expressions()


def test_every_shipped_expression_parses() -> None:
    assert len(EXPRS) > 150
    failed = []
    for where, src in EXPRS:
        try:
            celpaths.fact_paths(src, NS)
        except celpaths.CelSyntaxError as exc:
            failed.append(f"{where}: {exc}")
    assert failed == []


@pytest.mark.parametrize("src,path", [
    ("stacks.groups[0].stat == 'x'", "stacks.groups[].stat"),
    ('logs.events.filter(e, e.kind == "x")[0].feilds.reason', "logs.events[].feilds"),
    ("stacks.groups.exists(g, g.stat == 'x')", "stacks.groups[].stat"),
    ("size(stacks.groups.map(g, g.rankz)) > 0", "stacks.groups[].rankz"),
    ("has(job.wrold_size)", "job.wrold_size"),
    ("job.world_size > 2 ? gpu.devicez : []", "gpu.devicez"),
    ("metrics.nan.stepp > 3", "metrics.nan.stepp"),  # a field of a record (plain map) is checked
])
def test_typos_after_indexes_macros_and_functions_are_caught(src: str, path: str) -> None:
    problems = celexpr.check_paths(src, facts_mod.schema(), NS)
    assert any(repr(path) in p for p in problems), problems


@pytest.mark.parametrize("src", [
    "stacks.groups[0].state == 'collective'",
    'logs.events.filter(e, e.kind == "x")[0].fields.size() > 0',
    "stacks.groups.exists(g, g.state == 'collective' && g.ranks.size() > 1)",
    '"gpu_oom" in logs.counts && logs.by_kind["gpu_oom"].exists(e, e.rank != null)',
    "'a.b' == 'a.b'",  # strings are not paths
    "metrics.nan.step > 3",
])
def test_correct_paths_pass(src: str) -> None:
    assert celexpr.check_paths(src, facts_mod.schema(), NS) == []


def test_tokenizer_reads_cel_literals() -> None:
    kinds = [t.kind for t in celpaths.tokenize("x.y[0] + 1.5e3 - 0x1F != r'a\\b' && \"\"\"q\"\"\" in [1u]")]
    assert kinds.count("str") == 2 and kinds.count("num") == 4 and kinds[-1] == "end"
