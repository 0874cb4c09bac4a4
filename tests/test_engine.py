"""The core engine: rules load and check, bad rules fail with file:line, exit codes, bundles."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from doctor.engine import facts as facts_mod
from doctor.engine.rule import format_ranks
from doctor.engine.ruleset import load_ruleset
from doctor.evidence.bundle import Bundle
from doctor.evidence.errors import RuleError

from .conftest import FIXTURES, diagnose_json, mldoctor

SLOW_ENV = FIXTURES / "env_capture" / "slow_transport"
GOOD_RULE = (Path(__file__).parents[1] / "rules" / "network" / "NET001.yaml").read_text()


def test_nccl_slow_transport_from_env_dump_terminal_and_json():
    report = diagnose_json(SLOW_ENV)
    top = report["findings"][0]
    assert report["schema"] == "mldoctor.report/1"
    assert top["cause"] == "nccl_slow_transport"
    assert any("NCCL_P2P_DISABLE=1" in e for e in top["evidence"])
    assert any("NCCL_IB_DISABLE=1" in e for e in top["evidence"])
    assert top["ranks"] == [0, 1]
    term = mldoctor("diagnose", "--from", str(SLOW_ENV))
    assert term.returncode == 1
    assert "nccl_slow_transport" in term.stdout and "NCCL_P2P_DISABLE=1" in term.stdout


def test_default_transport_env_is_not_flagged():
    report = diagnose_json(FIXTURES / "env_capture" / "default_transport")
    assert not [f for f in report["findings"] if f["cause"] == "nccl_slow_transport"]


def test_env_values_outside_allowlist_are_dropped():
    doc = json.loads(mldoctor("facts", "--from", str(SLOW_ENV)).stdout)
    text = json.dumps(doc)
    assert "hf_FAKEplanted" not in text and "hunter2" not in text and "FAKEplanted/secret" not in text
    assert doc["env"]["vars"]["NCCL_P2P_DISABLE"] == "1"
    assert doc["job"]["world_size"] == 2


@pytest.mark.parametrize("bad, needle", [
    ("when: 'env.vars.exists(k, '\n", "CEL does not compile"),
    ("when: 'env.nope == 1'\n", "unknown fact path 'env.nope'"),
    ("cause: not_a_cause\n", "is not in the taxonomy"),
    ("severity: apocalyptic\n", "severity must be one of"),
    ("when: [unclosed\n", "invalid YAML"),
])
def test_broken_rule_file_gives_file_line_error_and_exit_2(tmp_path, bad, needle):
    lines = [ln for ln in GOOD_RULE.splitlines(keepends=True)]
    key = bad.split(":", 1)[0]
    out, skip = [], False
    for ln in lines:
        if ln.startswith(key + ":"):
            out.append(bad)
            skip = True
            continue
        if skip and ln.startswith((" ", "\t")):
            continue
        skip = False
        out.append(ln)
    d = tmp_path / "rules"
    d.mkdir()
    (d / "NET901.yaml").write_text("".join(out).replace("id: NET001", "id: NET901"))
    res = mldoctor("diagnose", "--from", str(SLOW_ENV), "--rules", str(d))
    assert res.returncode == 2
    lines_err = res.stderr.strip().splitlines()
    assert len(lines_err) == 1, res.stderr
    assert "Traceback" not in res.stderr
    assert f"{d / 'NET901.yaml'}:" in lines_err[0] and needle in lines_err[0]
    line_no = int(lines_err[0].split("NET901.yaml:")[1].split(":")[0])
    assert line_no >= 1


def test_rule_id_must_match_file_name(tmp_path):
    (tmp_path / "NET902.yaml").write_text(GOOD_RULE)
    with pytest.raises(RuleError, match=r"NET902.yaml:1: id 'NET001' does not match"):
        load_ruleset([tmp_path])


def test_rules_test_and_lint_pass():
    res = mldoctor("rules", "test")
    assert res.returncode == 0, res.stdout + res.stderr
    assert " 0 failed" in res.stdout
    lint = mldoctor("rules", "lint")
    assert lint.returncode == 0, lint.stdout


def test_missing_evidence_is_inconclusive(tmp_path):
    """A note with only the reporter's words: read as prose (the state they report, no cause),
    inconclusive (exit 3) because nothing in it can name a cause; a file nothing reads is listed."""
    (tmp_path / "notes.txt").write_text("the job hung again, no idea why\n")
    (tmp_path / "data.bin").write_bytes(bytes(range(256)) * 4)
    report = diagnose_json(tmp_path)
    # the reporter's state, and only the differential's usual causes of a plain hang (guesses)
    assert report["verdict"]["state"] == "hung" and report["verdict"]["summary"].startswith("Possible cause, not confirmed")
    assert report["findings"] and all(f.get("differential") for f in report["findings"])
    assert report["evidence"]["kinds"] == ["symptoms"]
    assert report["evidence"]["ignored"] == ["data.bin"]
    assert mldoctor("diagnose", "--from", str(tmp_path)).returncode == 3
    (tmp_path / "notes.txt").write_text("no idea what is going on with this cluster\n")
    assert diagnose_json(tmp_path)["verdict"]["state"] == "unknown"


def test_bad_path_is_one_line_exit_2(tmp_path):
    res = mldoctor("diagnose", "--from", str(tmp_path / "nope"))
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "no such file" in res.stderr


def test_garbage_next_to_good_evidence_is_reported_not_fatal(tmp_path):
    shutil.copytree(SLOW_ENV, tmp_path / "ev")
    (tmp_path / "ev" / "random.bin").write_bytes(bytes(range(256)) * 64)
    report = diagnose_json(tmp_path / "ev")
    assert report["findings"][0]["cause"] == "nccl_slow_transport"


def test_bundle_roundtrip_and_checksums(tmp_path):
    b = Bundle.create(tmp_path / "b", {"type": "test"})
    for f in sorted(SLOW_ENV.iterdir()):
        b.add_artifact(f"hosts/h1/env/{f.name}", f.read_bytes(), "env", host="h1",
                       text=not f.name.startswith("environ"))
    b.save()
    loaded = Bundle.load(tmp_path / "b")
    assert loaded.verify() == []
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert all(len(a["sha256"]) == 64 for a in manifest["artifacts"])
    report = diagnose_json(tmp_path / "b")
    assert report["findings"][0]["cause"] == "nccl_slow_transport"
    arch = loaded.archive(tmp_path / "out", job="demo job")
    assert arch.stat().st_mode & 0o777 == 0o600
    assert (arch.parent / (arch.name + ".sha256")).read_text().split()[0]
    report2 = diagnose_json(arch)
    assert [f["cause"] for f in report2["findings"]] == [f["cause"] for f in report["findings"]]
    # tampering is detected
    victim = next((tmp_path / "b" / "hosts" / "h1" / "env").iterdir())
    victim.write_bytes(victim.read_bytes() + b"X=1\n")
    assert any("sha256 does not match" in p for p in Bundle.load(tmp_path / "b").verify())


def test_archive_with_path_traversal_is_refused(tmp_path):
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        data = tmp_path / "x"
        data.write_text("pwned")
        tar.add(data, arcname="../../escape.txt")
    res = mldoctor("diagnose", "--from", str(evil))
    assert res.returncode == 2 and "escape" in res.stderr
    assert not (tmp_path.parent / "escape.txt").exists()


def test_format_ranks():
    assert format_ranks([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert format_ranks([]) == "none"


def test_taxonomy_copy_has_every_shared_cause():
    import yaml

    from doctor.engine import taxonomy

    listed = (FIXTURES / "taxonomy_ids.txt").read_text().splitlines()
    shared_ids = {line.strip() for line in listed if line.strip() and not line.startswith("#")}
    assert len(shared_ids) > 30 and shared_ids <= set(taxonomy.causes())
    assert yaml.safe_load((Path(taxonomy.__file__).parent / "taxonomy.yaml").read_text())


def test_facts_schema_reference_is_generated():
    res = mldoctor("facts", "--schema")
    assert "`env.vars`" in res.stdout and "`job.world_size`" in res.stdout


def test_help_does_not_import_heavy_modules():
    code = ("import sys; sys.argv=['mldoctor','--help']\n"
            "from doctor import cli\n"
            "try:\n    cli.app()\nexcept SystemExit:\n    pass\n"
            "bad=[m for m in ('torch','pandas','textual','cel','mcp') if m in sys.modules]\n"
            "print('HEAVY', bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    assert "HEAVY []" in out


def test_explain_prints_playbook_and_unknown_cause_fails():
    res = mldoctor("explain", "collective_mismatch")
    assert res.returncode == 0 and "collective" in res.stdout.lower() and "Fix" in res.stdout
    bad = mldoctor("explain", "nope_cause")
    assert bad.returncode == 2 and "unknown cause" in bad.stderr


def test_facts_build_handles_empty_folder(tmp_path):
    facts, _ = facts_mod.build(facts_mod.items_from_folder(tmp_path), "loose")
    assert facts["evidence"]["files"] == 0
