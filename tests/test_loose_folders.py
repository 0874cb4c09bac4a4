"""Loose evidence folders: nothing found is dropped without a word (issue 18, items 12 and 13).

The evidence is a real OOM log captured on the H200 (tests/fixtures/gpu/h200/oom/torchrun.log)
and copies of a real healthy rank log; the folder shapes (links, FIFOs, the file cap) are made
here, because they are about the folder, not the job.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from doctor.engine import facts as facts_mod
from doctor.engine.diagnose import diagnose_path

ROOT = Path(__file__).resolve().parents[1]
OOM = ROOT / "tests" / "fixtures" / "gpu" / "h200" / "oom" / "torchrun.log"


def test_files_past_the_cap_make_the_verdict_unknown_not_healthy(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(facts_mod, "MAX_LOOSE_FILES", 5)
    for i in range(8):
        (tmp_path / f"note{i:02d}.txt").write_text("nothing to see here\n")
    shutil.copy(OOM, tmp_path / "zz-last.log")  # sorted last: past the cap
    report = diagnose_path(tmp_path)
    assert report.verdict["state"] == "unknown", report.verdict
    errors = report.facts["evidence"]["errors"]
    assert any("4 of 9 files not read" in e for e in errors), errors
    monkeypatch.setattr(facts_mod, "MAX_LOOSE_FILES", 100)
    assert diagnose_path(tmp_path).findings[0].cause == "gpu_oom"  # the same folder, read whole


def test_links_fifos_and_unreadable_folders_are_named(tmp_path: Path) -> None:
    shutil.copy(OOM, tmp_path / "torchrun.log")
    outside = tmp_path.parent / f"{tmp_path.name}-outside.log"
    outside.write_text("secret outside the folder\n")
    (tmp_path / "link.log").symlink_to(outside)
    (tmp_path / "linkdir").symlink_to(tmp_path.parent)
    os.mkfifo(tmp_path / "pipe.log")
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "x.log").write_text("x\n")
    locked.chmod(0)
    try:
        facts, _ = facts_mod.build(facts_mod.items_from_folder(tmp_path), "loose")
    finally:
        locked.chmod(0o755)
    ignored = "\n".join(facts["evidence"]["ignored"])
    assert "link.log (symbolic link: not followed)" in ignored
    assert "linkdir (symbolic link: not followed)" in ignored
    assert "pipe.log (not a regular file" in ignored
    if os.geteuid() != 0:  # root lists any folder
        assert "locked (cannot list" in ignored
    assert facts["evidence"]["unread"] >= 3
    assert "logs" in facts["evidence"]["kinds"]  # the real evidence is still read


@pytest.mark.parametrize("name", ["a.log"])
def test_a_single_file_is_read(tmp_path: Path, name: str) -> None:
    shutil.copy(OOM, tmp_path / name)
    items = facts_mod.items_from_folder(tmp_path / name)
    assert [i.rel for i in items] == [name] and not items[0].skip
