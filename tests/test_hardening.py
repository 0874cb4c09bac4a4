"""Hardening against hostile input (docs: shared/knowledge/robustness-2026-12-03.md).

Each test fails on the code before the fix: manifests that read outside the bundle, symlinks and
FIFOs, the quadratic scrubber, pickle, archive and YAML bombs, wrong-shape input, and report
writes that follow planted links or overwrite the user's files.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import struct
import tarfile
import time
from pathlib import Path

import pytest

from doctor.evidence import bundle as bundle_mod
from doctor.evidence import yamlsrc
from doctor.evidence.bundle import Bundle, bad_relpath
from doctor.evidence.errors import RuleError, UserError
from doctor.evidence.redact import scrub
from doctor.evidence.unpickle import UnpickleError, safe_loads
from doctor.render import output

# -- the scrubber ------------------------------------------------------------------------------
PLANTED = [
    "post https://hooks.slack.com/services/T0AAAAAAA/B0BBBBBBB/SlAcKwEbHoOkSeCrEt12",
    "xoxb-123456789012-FaKeSlAcKtOkEnAaa", "xoxp-123456789012-FaKeSlAcKtOkEnBbb",
    "DB_PASS=FaKeDbPassValue99", "POSTGRES_PASSWORD=FaKePgValue77", "MY_APP_SECRET=FaKeAppValue55",
    "aws_secret_access_key wJalrXUtnFEMIK7MDENGbPxRfiCYFaKeKeY1", "aws_secret_access_key = wJalrXUtnFEMIK7MDENGbPxRfiCYFaKeKeY2",
    "id AKIAFAKEFAKEFAKE1234 used", "ghp_FaKeGiThUbToKeN0123456789abcdef", "gho_FaKeGiThUbToKeN0123456789abcdeg",
    "github_pat_11FAKE0000_FaKePaTtOkEnValue0123456789", "glpat-FaKeGiTlAbToKeN01234",
    "hf_FaKeHuGgInGfAcEtOkEn0123", "sk-proj-FaKeOpEnAiKeY0123456789abcd",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJGQUtFIn0.FaKeJwTsIgNaTuRe012",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIFaKePeMbOdY0123\n-----END RSA PRIVATE KEY-----",
    "https://admin:FaKeUrLpAsSwOrD99@etcd.example:2379/v2", "AIzaSyFaKeGoOgLeApIkEy0123456789abcdefg",
    "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=FaKeAzUrEkEy0123+/abc==;EndpointSuffix=x",
]
SECRETS = ["SlAcKwEbHoOkSeCrEt12", "FaKeSlAcKtOkEnAaa", "FaKeSlAcKtOkEnBbb", "FaKeDbPassValue99", "FaKePgValue77",
           "FaKeAppValue55", "FaKeKeY1", "FaKeKeY2", "AKIAFAKEFAKEFAKE1234", "FaKeGiThUbToKeN0123456789abcdef",
           "FaKeGiThUbToKeN0123456789abcdeg", "FaKePaTtOkEn", "FaKeGiTlAbToKeN", "FaKeHuGgInGfAcE", "FaKeOpEnAiKeY",
           "FaKeJwTsIgNaTuRe", "MIIFaKePeMbOdY", "FaKeUrLpAsSwOrD99", "FaKeGoOgLeApIkEy", "FaKeAzUrEkEy"]


@pytest.mark.parametrize(("line", "secret"), list(zip(PLANTED, SECRETS, strict=True)))
def test_scrub_masks_common_secret_formats(line, secret):
    assert secret not in scrub(line)


@pytest.mark.parametrize("line", [
    "step 100 loss=2.3456 lr=1e-4 grad_norm=0.87", "NCCL INFO Channel 00/02 : 0[1b000] -> 1[1c000] via P2P/IPC",
    "Segmentation fault at 0x7f3a2c001000", "GPU 0: H100 (UUID: GPU-5a3b2c1d-1234-5678-9abc-def012345678)",
    "forward pass: 0.21 s", "max_tokens=4096 TOKENIZERS_PARALLELISM=false", "NCCL_IB_HCA=mlx5_0:1,mlx5_1:1",
])
def test_scrub_keeps_ordinary_training_lines(line):
    assert scrub(line) == line


@pytest.mark.parametrize("text", ["-" * 32_000, "progress " + "." * 50_000, "a." * 50_000, "-eyJ" * 20_000])
def test_scrub_is_fast_on_long_runs(text):
    t0 = time.perf_counter()
    scrub(text)
    assert time.perf_counter() - t0 < 2.0  # was 99 s for 32,000 dashes (quadratic)


# -- manifests ---------------------------------------------------------------------------------
def _bundle(tmp_path: Path, artifacts, **extra) -> Path:
    root = tmp_path / "b"
    root.mkdir(exist_ok=True)
    (root / "manifest.json").write_text(json.dumps({"schema": "mldoctor.bundle/1", "artifacts": artifacts, **extra}))
    return root


@pytest.mark.parametrize("path", ["/etc/shadow", "../../outside/secret.txt", "/proc/self/environ", "/dev/zero",
                                  "a/../../x", 5, None, ""])
def test_manifest_path_outside_the_bundle_is_refused(tmp_path, path):
    root = _bundle(tmp_path, [{"path": path, "kind": "logs", "sha256": "0", "size": 1}])
    with pytest.raises(UserError) as exc:
        Bundle.load(root)
    assert str(root) in str(exc.value) and "\n" not in str(exc.value)


def test_manifest_symlink_fifo_and_linked_folder_are_skipped_with_a_note(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.log").write_text("OUTSIDE-SECRET\n")
    root = _bundle(tmp_path, [{"path": p, "kind": "logs", "sha256": "0", "size": 1}
                              for p in ("link.log", "fifo.log", "ldir/victim.log", "ok.log")])
    (root / "link.log").symlink_to(outside / "victim.log")
    os.mkfifo(root / "fifo.log")
    (root / "ldir").symlink_to(outside)
    (root / "ok.log").write_text("fine\n")
    b = Bundle.load(root)
    assert [a["path"] for a in b.manifest["artifacts"]] == ["ok.log"]
    notes = b.verify()
    assert any("link.log: is a symlink" in n for n in notes) and any("fifo.log" in n for n in notes)
    assert any("ldir/victim.log" in n for n in notes)


@pytest.mark.parametrize("manifest", [
    {"artifacts": {"a": 1}}, {"artifacts": ["loose/x.log"]}, {"artifacts": [{"kind": "logs"}]},
    {"artifacts": [{"path": 5}]}, {"probes": [1, "x", None]}, {"artifacts": [{"path": "x", "kind": 3}]},
])
def test_manifest_of_the_wrong_shape_is_one_line(tmp_path, manifest):
    root = tmp_path / "b"
    root.mkdir()
    (root / "manifest.json").write_text(json.dumps({"schema": "mldoctor.bundle/1", **manifest}))
    with pytest.raises(UserError):
        Bundle.load(root)


def test_manifest_nested_deeply_is_one_line(tmp_path):
    root = tmp_path / "b"
    root.mkdir()
    (root / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UserError, match="nested too deeply"):
        Bundle.load(root)


def test_slurm_merger_uses_the_shared_path_check():
    from doctor.live import slurm

    assert slurm.bad_relpath is bad_relpath
    assert bad_relpath("/etc/shadow") and bad_relpath("../x") and bad_relpath(3) and not bad_relpath("hosts/a.log")


# -- pickles -----------------------------------------------------------------------------------
def test_pickle_memo_index_bomb_is_refused_before_loading():
    bomb = b"\x80\x04N" + b"r" + struct.pack("<I", 2**28) + b"."  # 4 GB with the C unpickler
    with pytest.raises(UnpickleError, match="memo index"):
        safe_loads(bomb)


def test_pickle_container_bomb_is_refused_while_scanning():
    bomb = b"\x80\x02](" + b"}" * 2_100_000 + b"e."
    with pytest.raises(UnpickleError, match="containers"):
        safe_loads(bomb)


def test_plain_pickles_still_load():
    import pickle

    data = {"entries": [{"a": i, "s": "x", "t": (i, 1.5)} for i in range(100)], "shared": [[1]] * 3}
    for proto in (2, 4, 5):
        assert safe_loads(pickle.dumps(data, protocol=proto)) == data


# -- archives ----------------------------------------------------------------------------------
def _tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_archive_bomb_is_capped_and_cleaned_up(tmp_path, monkeypatch):
    monkeypatch.setattr(bundle_mod, "MIN_ARCHIVE_TOTAL", 1 << 20)
    arc = _tar(tmp_path / "bomb.tar.gz", [("b/manifest.json", b'{"schema": "mldoctor.bundle/1"}'),
                                          ("b/zeros", b"\0" * (8 << 20))])
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(UserError, match="unpacks to more than") as exc:
        Bundle.load(arc, workdir=work)
    assert str(arc) in str(exc.value) and not list(work.iterdir())


@pytest.mark.parametrize("manifest", [b"{not json", b'{"schema": "other/1"}', b'{"schema": "mldoctor.bundle/1", "artifacts": null, "probes": 3}',
                                      b'{"schema": "mldoctor.bundle/1", "artifacts": [{"path": "/etc/passwd"}]}'])
def test_bad_archive_names_the_archive_and_leaves_no_temp_folder(tmp_path, manifest):
    arc = _tar(tmp_path / "bad.tar.gz", [("b/manifest.json", manifest)])
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(UserError) as exc:
        Bundle.load(arc, workdir=work)
    assert str(arc) in str(exc.value) and str(work) not in str(exc.value)
    assert not list(work.iterdir())


# -- YAML --------------------------------------------------------------------------------------
def _laughs() -> str:
    text = "a: &a [" + ",".join(['"lol"'] * 9) + "]\n"
    for i in range(8):
        text += f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join(["*" + chr(97 + i)] * 9) + "]\n"
    return text


def test_yaml_alias_bomb_is_refused(tmp_path):
    p = tmp_path / "BOMB.yaml"
    p.write_text(_laughs())
    t0 = time.perf_counter()
    with pytest.raises(RuleError, match=r"BOMB\.yaml:\d+: .*alias bomb"):
        yamlsrc.load(p)
    with pytest.raises(RuleError):
        yamlsrc.safe_data(_laughs())
    assert time.perf_counter() - t0 < 5


def test_yaml_nesting_is_capped(tmp_path):
    p = tmp_path / "DEEP.yaml"
    p.write_text("x: " + "[" * 600 + "]" * 600)
    with pytest.raises(RuleError, match=r"DEEP\.yaml:\d+: nested deeper"):
        yamlsrc.load(p)


# -- output paths ------------------------------------------------------------------------------
def test_write_never_follows_a_planted_symlink(tmp_path):
    target = tmp_path / "target"
    target.write_text("orig")
    os.chmod(target, 0o644)
    (tmp_path / "link.md").symlink_to(target)
    with pytest.raises(UserError, match="symlink"):
        output.write_file(tmp_path / "link.md", "# report")
    with pytest.raises(UserError):
        output._write(tmp_path / "link.md", "# report")
    assert target.read_text() == "orig" and (target.stat().st_mode & 0o777) == 0o644


def test_write_to_a_fifo_does_not_block(tmp_path):
    os.mkfifo(tmp_path / "r.md")
    with pytest.raises(UserError, match="FIFO|not a regular"):
        output.write_file(tmp_path / "r.md", "x")


def test_run_folder_keeps_the_users_report_and_avoids_planted_files(tmp_path):
    (tmp_path / "report.md").write_text("mine")
    os.mkfifo(tmp_path / "report.html")
    run = output._run_folder(tmp_path)
    assert run.parent == tmp_path and run.name.startswith("mldoctor-") and not list(run.iterdir())
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert output._run_folder(fresh) == fresh
    assert (tmp_path / "report.md").read_text() == "mine"


def test_gzip_utf16_and_file_names_are_scrubbed_before_the_archive(tmp_path):
    token = "ghp_GzIpPeDlOgToKeN0123456789abcdefghij"
    data, _ = output._prepare(gzip.compress(f"token {token}\n".encode()), "", None)
    assert token not in gzip.decompress(data).decode()
    data, _ = output._prepare(f"token {token}\n".encode("utf-16"), "", None)
    assert token not in data.decode("utf-16")
    data, _ = output._prepare(f"token {token}\n".encode("utf-16-le"), "", None)
    assert token not in data.decode("utf-16-le")
    assert output._prepare(b"\x1f\x8bnot gzip at all", "", None) is None
    b = Bundle.create(tmp_path / "stage")
    art = b.add_artifact("loose/rank0-hf_AbCdEfGhIjKlMnOpQrStUvWx.log", "x\n", "")
    assert "hf_AbCd" not in art.path and "hf_AbCd" not in json.dumps(b.manifest)


def test_out_at_a_file_is_one_line(tmp_path):
    from doctor.engine.report import Report

    f = tmp_path / "afile"
    f.write_text("x")
    rep = Report(verdict={"state": "healthy", "summary": ""}, findings=[], facts={}, source={})
    with pytest.raises(UserError):
        output.write_outputs(rep, f)


def test_internal_error_exit_code_is_4(monkeypatch, capsys):
    import importlib

    cli = importlib.import_module("doctor.cli.main")

    def boom():
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli, "app", boom)
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 4 and "internal error" in capsys.readouterr().err
