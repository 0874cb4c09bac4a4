"""Flight-recorder evidence: the restricted unpickler, parsing real dumps (NCCL pickles from
NVRx, gloo pickles and JSON from torch 2.13), the cross-rank analysis and the diagnosis.

Evidence is real: NVIDIA's fault-injection dumps (tests/fixtures/fr/nvrx, copied without their
ground-truth fault_injection.log), gloo jobs captured by tests/fixtures/fr/capture_fr.py and the
scenario captures under tests/fixtures/evidence/<scenario>/fr. Malicious and damaged inputs are
made here, from real dumps where a dump is needed.
"""

from __future__ import annotations

import copyreg
import os
import pickle
import random
import shutil
from pathlib import Path

import pytest
from doctor.probes import flight_recorder as FR

from doctor.engine import celexpr
from doctor.engine import facts as facts_mod
from doctor.engine.findings import rank_findings
from doctor.engine.rule import evaluate, load_file
from doctor.engine.ruleset import namespaces_of
from doctor.evidence.contract import CollectContext, Hints, ProbeSkipped, RankProcess, Sample
from doctor.evidence.errors import EvidenceError
from doctor.evidence.unpickle import UnpickleError, safe_loads

from .conftest import FIXTURES, ROOT, diagnose_json, mldoctor

NVRX = FIXTURES / "fr" / "nvrx"
GLOO = FIXTURES / "fr" / "gloo"
EV = FIXTURES / "evidence"
FAULTED = {  # from each case's fault_injection.log (NVIDIA/nvidia-resiliency-ext @ d8686d9)
    "gpu_error_1st": ({12, 14}, "rank_stuck_in_cuda"),
    "gpu_error_2nd": ({9, 14}, "rank_stuck_in_cuda"),
    "lock_gil_1st": ({9, 14}, "rank_outside_collective"),
    "lock_gil_2nd": ({10, 15}, "rank_outside_collective"),
}


def fr_facts(path: Path) -> dict:
    facts, _ = facts_mod.build(facts_mod.items_from_folder(path), "loose")
    return facts


def copy_dumps(src: Path, dest: Path) -> Path:
    """The case's dumps only: never its ground truth."""
    dest.mkdir(parents=True, exist_ok=True)
    for p in src.iterdir():
        if p.name.startswith("_dump_"):
            shutil.copy(p, dest / p.name)
            os.chmod(dest / p.name, 0o644)
    return dest


class Evil:
    """Pickles to a call of os.system: what a hostile "dump" would carry."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


# -- the restricted unpickler -----------------------------------------------------------------

def test_malicious_pickle_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    data = pickle.dumps(Evil(marker))
    with pytest.raises(UnpickleError) as exc:
        safe_loads(data)
    assert "refused" in str(exc.value) and "\n" not in str(exc.value)
    assert not marker.exists()
    # the same payload inside an otherwise real-looking dump, through the whole pipeline
    dump = safe_loads((NVRX / "lock_gil_2nd" / "_dump_3").read_bytes())
    dump["entries"].append(Evil(marker))
    for proto in (2, 4, 5):
        (tmp_path / "_dump_3").write_bytes(pickle.dumps(dump, protocol=proto))
        facts = fr_facts(tmp_path)
        errs = [e for e in facts["evidence"]["errors"] if e.startswith("_dump_3")]
        assert len(errs) == 1 and "refused" in errs[0] and "\n" not in errs[0], facts["evidence"]
    assert not marker.exists()


# Hand-assembled opcode streams (protocol 2): each would run code or build an object if the
# unpickler let it name a callable or a class.
_P = b"\x80\x02"
DANGEROUS = {
    "GLOBAL+REDUCE": _P + b"cos\nsystem\nX\x04\x00\x00\x00trueq\x85R.",
    "STACK_GLOBAL": b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x04true\x85R.",
    "INST": b"(X\x04\x00\x00\x00trueios\nsystem\n.",
    "OBJ": _P + b"(cbuiltins\nlist\no.",
    "NEWOBJ": _P + b"cbuiltins\nobject\n)\x81.",
    "NEWOBJ_EX": b"\x80\x04cbuiltins\nobject\n)}\x92.",
    "REDUCE on data": _P + b"}q\x00)R.",
    "BUILD on a dict": _P + b"}q\x00}X\x01\x00\x00\x00aK\x01sb.",
    "EXT1": _P + b"\x82\x01.",
    "PERSID": _P + b"Pfoo\n.",
    "BINPERSID": _P + b"X\x03\x00\x00\x00fooQ.",
}


@pytest.mark.parametrize("name", sorted(DANGEROUS))
@pytest.mark.parametrize("scan", [None, True])
def test_code_running_opcodes_fail_cleanly(name, scan):
    with pytest.raises(UnpickleError) as exc:
        safe_loads(DANGEROUS[name], scan=scan)
    msg = str(exc.value)
    assert msg and "\n" not in msg and len(msg) < 300


def test_extension_registry_in_use_turns_the_opcode_scan_on():
    # A library that registered copyreg extension codes would let EXT* fetch a callable
    # without find_class; safe_loads must then scan the opcodes first.
    copyreg.add_extension("os", "system", 0xF00D)
    try:
        data = _P + b"\x83\x0d\xf0X\x04\x00\x00\x00true\x85R."  # EXT2 0xF00D, then REDUCE
        with pytest.raises(UnpickleError) as exc:
            safe_loads(data)
        assert "EXT2" in str(exc.value)
    finally:
        copyreg.remove_extension("os", "system", 0xF00D)
        copyreg.clear_extension_cache()


def test_limits_on_size_nesting_and_items():
    plain = {"a": [1, 2.5, None, True, "s", b"b", (1, 2), {3}, frozenset({4})]}
    assert safe_loads(pickle.dumps(plain)) == plain
    with pytest.raises(UnpickleError, match="over the limit"):
        safe_loads(pickle.dumps(list(range(1000))), max_bytes=100)
    deep: list = []
    for _ in range(200):
        deep = [deep]
    with pytest.raises(UnpickleError, match="nested deeper"):
        safe_loads(pickle.dumps(deep))
    shared = [0] * 1000
    bomb = [shared] * 2000  # 2,000 references to one list: small pickle, 2M items to walk
    with pytest.raises(UnpickleError, match="more than"):
        safe_loads(pickle.dumps(bomb), max_items=1_000_000)
    for bad in (b"", b"\x80", os.urandom(64), pickle.dumps(plain)[:-5]):
        with pytest.raises(UnpickleError):
            safe_loads(bad)


# -- sniffing and parsing ---------------------------------------------------------------------

def test_sniff_claims_dumps_by_content_and_leaves_ground_truth_alone(tmp_path):
    probe = FR.PROBE
    assert probe.sniff(Sample.read(NVRX / "gpu_error_1st" / "_dump_12"))
    assert probe.sniff(Sample.read(GLOO / "cross_group_order" / "fr_trace_rank2.json"))
    renamed = tmp_path / "whatever.bin"
    shutil.copy(GLOO / "healthy" / "_dump_1", renamed)
    assert probe.sniff(Sample.read(renamed)), "content, not the name, makes a dump"
    log = tmp_path / "fault_injection.log"
    log.write_text("Fault ranks: [12, 14]\nFault delay: 180.0\nRank 12, fault_type: GPU_ERROR\n")
    assert not probe.sniff(Sample.read(log))
    (tmp_path / "notes.json").write_text('{"entries": 3, "name": "x"}')
    assert not probe.sniff(Sample.read(tmp_path / "notes.json"))
    # The case as it was published, ground truth beside the dumps: FR reads only the dumps.
    folder = copy_dumps(NVRX / "gpu_error_1st", tmp_path / "published")
    shutil.copy(log, folder / "fault_injection.log")
    facts = fr_facts(folder)
    assert facts["flight_recorder"]["dumps"] == 16
    assert "fault_injection.log" not in str(facts["evidence"]["errors"])


def test_parse_nccl_pickle_gloo_pickle_and_json():
    d = FR.load_dump((NVRX / "gpu_error_1st" / "_dump_12").read_bytes(), "_dump_12", Hints.from_path("_dump_12"))
    assert (d.rank, d.fmt, d.version, d.lib_version) == (12, "pickle", "2.9", "2.27.3")
    tp = d.pgs["41"]
    assert tp.desc == "TENSOR_MODEL_PARALLEL_GROUP" and tp.ranks == (12, 13)
    assert (tp.enqueued, tp.completed) == (42817, 42805)  # pg_status key '5' (pg_id) mapped to name '41'
    assert d.pgs["7"].ranks == (12, 14) and d.pgs["7"].enqueued == 312  # no entries: pg_id 1 by order
    assert d.backends == ["nccl"]

    g = FR.load_dump((GLOO / "subgroup_cascade" / "_dump_0").read_bytes(), "_dump_0", Hints.from_path("_dump_0"))
    assert g.fmt == "pickle" and g.backends == ["gloo"] and g.version == "2.10"
    assert g.pgs["0"].space == "op_id"  # gloo counts unrecorded send/recv in pg_status

    rel = "gloo/cross_group_order/fr_trace_rank2.json"
    j = FR.load_dump((GLOO / "cross_group_order" / "fr_trace_rank2.json").read_bytes(), rel, Hints.from_path(rel))
    assert (j.rank, j.fmt) == (2, "json") and j.pgs["3"].entries[-1].op == "gloo:all_reduce"


def test_rank_key_wins_over_the_file_name(tmp_path):
    dump = safe_loads((NVRX / "lock_gil_1st" / "_dump_9").read_bytes())
    dump["rank"] = 9
    (tmp_path / "_dump_4").write_bytes(pickle.dumps(dump, protocol=2))
    d = FR.PROBE.parse(tmp_path / "_dump_4", "_dump_4", Hints.from_path("_dump_4"))
    assert d.rank == 9
    del dump["rank"]
    (tmp_path / "dump.pkl").write_bytes(pickle.dumps(dump, protocol=2))
    with pytest.raises(EvidenceError, match="without a rank"):
        FR.PROBE.parse(tmp_path / "dump.pkl", "dump.pkl", Hints.from_path("dump.pkl"))


def test_truncated_and_random_dumps_give_one_line_errors_and_the_rest_still_counts(tmp_path):
    case = copy_dumps(NVRX / "lock_gil_2nd", tmp_path / "case")
    (case / "_dump_3").write_bytes(random.Random(3).randbytes(4096))
    whole = (case / "_dump_5").read_bytes()
    (case / "_dump_5").write_bytes(whole[: len(whole) // 2])
    facts = fr_facts(case)
    errs = facts["evidence"]["errors"]
    assert sorted(e.split(":", 1)[0] for e in errs) == ["_dump_3", "_dump_5"], errs
    assert all("\n" not in e and len(e) < 300 for e in errs)
    fr = facts["flight_recorder"]
    assert fr["dumps"] == 14 and fr["missing_dumps"] == [3, 5]
    assert fr["culprits"] == [10, 15]
    # the CLI: no traceback, and the diagnosis still names both
    report = diagnose_json(case)
    assert set(report["findings"][0]["ranks"]) == {10, 15}
    res = mldoctor("diagnose", "--from", str(case), "--json")
    assert "Traceback" not in res.stderr


# -- the analysis -----------------------------------------------------------------------------

@pytest.mark.parametrize("case", sorted(FAULTED))
def test_nvrx_culprits_from_the_dumps_alone(case, tmp_path):
    ranks, cause = FAULTED[case]
    fr = fr_facts(copy_dumps(NVRX / case, tmp_path / case))["flight_recorder"]
    assert set(fr["culprits"]) == ranks, fr["culprit_reasons"]
    kind = "not_completed" if cause == "rank_stuck_in_cuda" else "not_issued"
    assert set(fr["culprit_kinds"].values()) == {kind}
    assert fr["missing_dumps"] == [] and fr["n_mismatches"] == 0 and fr["cycles"] == []
    assert all(str(r) in fr["culprit_reasons"] for r in ranks)
    # Victims are not culprits: in lock_gil_1st ranks 0-7 wait in default_pg for 8-15, which
    # themselves wait for 9 and 14.
    assert set(fr["waiting_ranks"]) >= set(range(16)) - ranks - set(fr["idle_ranks"])


@pytest.mark.parametrize("case", sorted(FAULTED))
def test_nvrx_diagnosis_names_both_faulted_ranks_first(case, tmp_path):
    ranks, cause = FAULTED[case]
    report = diagnose_json(copy_dumps(NVRX / case, tmp_path / case))
    top = report["findings"][0]
    assert set(top["ranks"]) == ranks and top["cause"] == cause, report["findings"]
    assert report["verdict"]["state"] == "hung"


def test_fr_rules_alone_rank_both_faulted_ranks_first(tmp_path):
    """The same, with only the FR rules: independent of other rule packs being edited."""
    schema = facts_mod.schema()
    ns = namespaces_of(schema)
    mine = [load_file(p, schema, ns) for p in sorted((ROOT / "rules" / "hang").glob("FR0*.yaml"))
            if not p.name.endswith(".test.yaml")]
    assert len(mine) >= 7

    for case, (ranks, cause) in FAULTED.items():
        facts = fr_facts(copy_dumps(NVRX / case, tmp_path / case))
        ctx = celexpr.context(facts, ns)
        findings, _ = rank_findings([evaluate(r, ctx, facts) for r in mine], facts)
        assert (set(findings[0].ranks), findings[0].cause) == (ranks, cause), case


def test_gloo_captures():
    fr = fr_facts(GLOO / "subgroup_cascade")["flight_recorder"]
    assert fr["culprits"] == [3] and fr["culprit_kinds"] == {"3": "not_issued"}
    assert fr["by_rank"]["2"]["waits_in"].startswith("pg 2")  # rank 2 waits in its pair group...
    assert fr["by_rank"]["0"]["waits_in"] == "pg 0 (default_pg) seq 10 gloo:all_reduce"  # ...0,1 in default
    assert 2 not in fr["culprits"], "rank 2 is behind in default_pg only because it waits for 3"

    fr = fr_facts(GLOO / "cross_group_order")["flight_recorder"]
    assert [c["ranks"] for c in fr["cycles"]] == [[0, 1, 2, 3]] and fr["cycles"][0]["culprits"] == [2]

    fr = fr_facts(GLOO / "dtype_mismatch")["flight_recorder"]
    m = fr["mismatches"]
    assert len(m) == 1 and m[0]["kind"] == "dtype" and m[0]["culprits"] == [1]
    assert fr["first_divergence"]["seq"] == m[0]["seq"] and fr["waiting_ranks"] == []

    fr = fr_facts(GLOO / "late_join")["flight_recorder"]
    t = fr["timeouts"][0]
    assert t["late_ranks"] == [3] and t["waiting_ranks"] == [0, 1, 2] and t["timeout_ms"] == 2000
    assert t["waited_ms"] >= 3000

    for healthy in ("healthy", "healthy_live"):
        fr = fr_facts(GLOO / healthy)["flight_recorder"]
        assert fr["culprits"] == [] and fr["mismatches"] == [] and fr["timeouts"] == [], healthy


def test_scenario_captures_op_mismatch_and_partial_dumps():
    fr = fr_facts(EV / "extra_collective" / "fr")["flight_recorder"]
    assert fr["first_divergence"]["kind"] == "op" and fr["first_divergence"]["culprits"] == [1]
    ops = {v["value"] for v in fr["mismatches"][0]["values"]}
    assert ops == {"gloo:all_reduce", "gloo:barrier"}
    partial = FIXTURES / "fr" / "partial"
    fr = fr_facts(partial / "lock_gil_2nd_no_rank10")["flight_recorder"]
    assert fr["missing_dumps"] == [10] and fr["culprit_kinds"] == {"15": "not_issued"}
    assert fr["undumped_blockers"] == [], "rank 15 explains the hang; 10 is not accused on absence alone"
    fr = fr_facts(partial / "lock_gil_2nd_no_rank10_15")["flight_recorder"]
    assert fr["missing_dumps"] == [10, 15] and fr["undumped_blockers"] == [10, 15]
    assert fr["culprit_kinds"] == {"10": "no_dump", "15": "no_dump"}


def test_collect_copies_watchdog_dumps(tmp_path):
    from doctor.evidence.bundle import Bundle

    prefix = tmp_path / "fr" / "trace_"
    prefix.parent.mkdir()
    shutil.copy(GLOO / "healthy" / "_dump_1", f"{prefix}1")
    bundle = Bundle.create(tmp_path / "bundle")
    me = os.getpid()
    procs = [RankProcess(pid=me, rank=1, env={"TORCH_FR_DUMP_TEMP_FILE": str(prefix)}),
             RankProcess(pid=me, rank=2, env={"TORCH_FR_DUMP_TEMP_FILE": str(prefix)})]
    ctx = CollectContext(bundle=bundle, host="h", procs=procs, probe_name="flight_recorder")
    assert FR.PROBE.collect(ctx) == {"dumps": 1, "ranks": 2}
    arts = bundle.manifest["artifacts"]
    assert [(a["path"], a["rank"]) for a in arts] == [("hosts/h/flight_recorder/_dump_1", 1)]
    with pytest.raises(ProbeSkipped, match="no flight-recorder dump"):
        FR.PROBE.collect(CollectContext(bundle=bundle, host="h", probe_name="flight_recorder",
                                        procs=[RankProcess(pid=me, rank=5, env={"TORCH_FR_DUMP_TEMP_FILE": str(prefix)})]))


def test_every_fact_written_is_documented():
    schema = FR.PROBE.facts_schema
    maps = {p for p, doc in schema.items() if doc.startswith(("map", "any"))}

    def check(prefix: str, value: object) -> None:
        if prefix in maps:
            return
        assert prefix in schema, f"undocumented fact path {prefix}"
        if isinstance(value, list) and value and isinstance(value[0], dict):
            for rec in value:
                for k, v in rec.items():
                    check(f"{prefix}[].{k}", v)

    for folder in (NVRX / "lock_gil_1st", GLOO / "cross_group_order", GLOO / "dtype_mismatch",
                   GLOO / "late_join", FIXTURES / "fr" / "partial" / "lock_self_no_rank1"):
        for k, v in fr_facts(folder)["flight_recorder"].items():
            check(f"flight_recorder.{k}", v)
