"""Evidence bundles written by ``--out``: archive, manifest and checksums, 0600, and the same
findings when the archive is diagnosed again (real captured evidence only)."""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from doctor.engine.diagnose import diagnose_path
from doctor.engine.report import Report
from doctor.evidence import plugins
from doctor.evidence.bundle import Bundle
from doctor.evidence.errors import UserError
from doctor.evidence.unpickle import safe_loads
from doctor.render.output import write_outputs

from .conftest import FIXTURES, mldoctor

SLOW_ENV = FIXTURES / "env_capture" / "slow_transport"
EVIDENCE = FIXTURES / "evidence"
SCENARIOS = sorted(p.name for p in EVIDENCE.iterdir() if p.is_dir()) if EVIDENCE.is_dir() else []
NAME = re.compile(r"mldoctor-(?P<job>[A-Za-z0-9._-]+)-\d{8}T\d{6}Z\.tar\.gz")


def copy_evidence(src: Path, tmp_path: Path) -> Path:
    """A private copy: the shared fixtures may be re-captured while tests run."""
    dest = tmp_path / "evidence" / src.name
    shutil.copytree(src, dest)
    return dest


def outcome(report: Report) -> dict:
    """What must not change between the first diagnosis and the one from the archive."""
    doc = report.to_json()
    return {
        "verdict": doc["verdict"],
        "findings": [{k: f[k] for k in ("cause", "rule", "severity", "confidence", "score", "ranks", "hosts",
                                        "gpus", "summary", "evidence")} for f in doc["findings"]],
        "kinds": doc["evidence"]["kinds"], "files": doc["evidence"]["files"],
        "errors": [e.split(": ", 1)[-1] for e in doc["evidence"]["errors"]],
        "job": doc["job"],
        "not_evaluable": sorted(n["rule"] for n in doc["not_evaluable"]),
    }


def members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


@pytest.mark.parametrize("src", [SLOW_ENV, *[EVIDENCE / s for s in SCENARIOS]], ids=lambda p: p.name)
def test_loose_folder_to_archive_gives_the_same_findings(src, tmp_path):
    folder = copy_evidence(src, tmp_path)
    first = diagnose_path(folder)
    out = tmp_path / "out"
    written = write_outputs(first, out, from_path=folder)

    archive = written["bundle"]
    m = NAME.fullmatch(archive.name)
    assert m and m.group("job") == src.name
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [archive.name, archive.name + ".sha256", "report.md", "report.html", "report.json"])
    for p in out.iterdir():
        assert p.stat().st_mode & 0o777 == 0o600, p
    assert out.stat().st_mode & 0o777 == 0o700
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    assert (out / (archive.name + ".sha256")).read_text() == f"{digest}  {archive.name}\n"

    # manifest: every loose file is an artifact under loose/, with a checksum and the kind a probe gave it
    files = members(archive)
    top = archive.name.removesuffix(".tar.gz")
    assert all(name.startswith(top + "/") for name in files)
    manifest = json.loads(files[f"{top}/manifest.json"])
    arts = {a["path"]: a for a in manifest["artifacts"]}
    loose = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert sorted(arts) == [f"loose/{rel}" for rel in loose]
    for path, art in arts.items():
        data = files[f"{top}/{path}"]
        assert hashlib.sha256(data).hexdigest() == art["sha256"] and len(data) == art["size"]
    ignored = set(first.facts["evidence"]["ignored"])
    for rel in loose:
        kind = arts[f"loose/{rel}"]["kind"]
        assert (kind == "") == (rel in ignored), (rel, kind)
    # the kind of the probe that recognized each file (others may read it too: they sniff again)
    kinds = {rel: arts[f"loose/{rel}"]["kind"] for rel in loose}
    assert set(kinds.values()) - {""} <= {p.name for p in plugins.probes()}
    for rel, kind in kinds.items():
        if re.fullmatch(r"env-rank\d+\.txt|environ-rank\d+", Path(rel).name):
            assert kind == "env", (rel, kind)
        if re.fullmatch(r"pyspy-rank\d+\.(txt|json)", Path(rel).name):
            assert kind == "stacks", (rel, kind)
    # binary evidence (flight-recorder pickles) is copied byte for byte when it holds no secret
    for rel in loose:
        if rel.endswith(".pkl"):
            data = files[f"{top}/loose/{rel}"]
            assert data == (folder / rel).read_bytes()
            safe_loads(data)
    # the reports written with the bundle travel inside it, checksummed
    assert files[f"{top}/reports/report.json"] == (out / "report.json").read_bytes()
    assert {r["path"] for r in manifest["reports"]} == {"reports/report.json", "reports/report.md"}

    loaded = Bundle.load(archive, workdir=tmp_path)
    assert loaded.verify() == []
    again = diagnose_path(archive)
    assert again.source["type"] == "bundle"
    assert outcome(again) == outcome(first)


def test_cli_diagnose_out_then_from_archive(tmp_path):
    """The path a user takes: `diagnose --from DIR --out OUT`, then `diagnose --from OUT/*.tar.gz`."""
    name = next((s for s in ("rank0_exclusive", "checkpoint_io", "lock_self") if s in SCENARIOS), None)
    folder = copy_evidence(EVIDENCE / name if name else SLOW_ENV, tmp_path)
    out = tmp_path / "out"
    res = mldoctor("diagnose", "--from", str(folder), "--out", str(out), "--json")
    assert res.returncode in (0, 1, 3), res.stderr
    first = json.loads(res.stdout)
    archive = next(out.glob("mldoctor-*.tar.gz"))
    sha = subprocess.run(["sha256sum", "-c", archive.name + ".sha256"], cwd=out, capture_output=True, text=True)
    assert sha.returncode == 0 and ": OK" in sha.stdout
    res = mldoctor("diagnose", "--from", str(archive), "--json")
    again = json.loads(res.stdout)
    key = lambda d: [(f["cause"], f["ranks"], f["summary"], f["evidence"]) for f in d["findings"]]  # noqa: E731
    assert key(again) == key(first) and again["verdict"] == first["verdict"]
    assert json.loads((out / "report.json").read_text())["findings"] == first["findings"]


def test_live_bundle_and_bundle_folder_are_reexported(tmp_path):
    """The live agent passes its Bundle; `--from BUNDLE_DIR --out` re-exports one. Same findings."""
    live = Bundle.create(tmp_path / "live", {"type": "live", "host": "node07", "job": "4242"})
    for p in sorted(SLOW_ENV.iterdir()):
        rank = int(p.name[-1]) if p.name[-1].isdigit() else None
        live.add_artifact(f"hosts/node07/env/{p.name}", p.read_bytes(), "env", host="node07", rank=rank)
    live.save()
    first = diagnose_path(live.root)
    out = tmp_path / "out"
    written = write_outputs(first, out, bundle=live)
    assert NAME.fullmatch(written["bundle"].name).group("job") == "4242"
    files = members(written["bundle"])
    manifest = json.loads(next(v for k, v in files.items() if k.endswith("/manifest.json")))
    assert manifest["target"]["job"] == "4242" and manifest["hosts"] == ["node07"]
    assert outcome(diagnose_path(written["bundle"])) == outcome(first)
    # and again from the bundle folder itself (not touched: its manifest stays as it was)
    before = (live.root / "manifest.json").read_bytes()
    out2 = tmp_path / "out2"
    written2 = write_outputs(first, out2, from_path=live.root)
    assert (live.root / "manifest.json").read_bytes() == before
    assert outcome(diagnose_path(written2["bundle"])) == outcome(first)


def test_env_artifacts_keep_allowlisted_values_only(tmp_path):
    """A raw /proc environ given to the bundle keeps NCCL_*/rank keys and drops the rest."""
    b = Bundle.create(tmp_path / "b")
    raw = (SLOW_ENV / "environ-rank0").read_bytes()
    b.add_artifact("env/environ-rank0", raw, "env", rank=0)
    kept = (b.root / "env" / "environ-rank0").read_bytes().split(b"\0")
    keys = {e.split(b"=", 1)[0].decode() for e in kept if e}
    assert {"NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "RANK", "WORLD_SIZE", "MASTER_ADDR"} <= keys
    assert not keys & {"PATH", "HOME", "HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY",
                       "NCCL_FAKE_PASSWORD", "TORCH_HUB_TOKEN"}


def test_tampered_artifact_is_reported(tmp_path):
    out = tmp_path / "out"
    archive = write_outputs(diagnose_path(SLOW_ENV), out, from_path=SLOW_ENV)["bundle"]
    b = Bundle.load(archive, workdir=tmp_path)
    target = b.root / "loose" / "env-rank0.txt"
    target.write_text(target.read_text().replace("NCCL_IB_DISABLE=1", "NCCL_IB_DISABLE=0"))
    problems = b.verify()
    assert problems == ["loose/env-rank0.txt: sha256 does not match the manifest (modified after collection)"]
    rep = diagnose_path(b.root)
    assert any(s["action"] == "verify" and "env-rank0.txt" in s["detail"] for s in rep.trace)


def test_archive_with_escaping_member_is_refused(tmp_path):
    bad = tmp_path / "mldoctor-evil-20260101T000000Z.tar.gz"
    with tarfile.open(bad, "w:gz") as tar:
        for name, data in (("b/manifest.json", b'{"schema": "mldoctor.bundle/1"}'), ("../escaped.txt", b"x")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(UserError, match="would escape the folder"):
        Bundle.load(bad, workdir=tmp_path)
    assert not (tmp_path / "escaped.txt").exists()
    res = mldoctor("diagnose", "--from", str(bad))
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1


def test_oversized_loose_file_is_left_out_with_a_note(tmp_path, monkeypatch):
    import doctor.render.output as output

    folder = copy_evidence(SLOW_ENV, tmp_path)
    (folder / "huge.log").write_text("x" * 5000)
    monkeypatch.setattr(output, "MAX_LOOSE_COPY", 4096)
    archive = write_outputs(diagnose_path(folder), tmp_path / "out", from_path=folder)["bundle"]
    files = members(archive)
    manifest = json.loads(next(v for k, v in files.items() if k.endswith("/manifest.json")))
    assert not any(k.endswith("huge.log") for k in files)
    assert any("huge.log" in n and "copy limit" in n for n in manifest["notes"])
