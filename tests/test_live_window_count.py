"""Issue #18: a sampling window extended by a further slice is one window, not two.

``samples.n_windows`` counts windows (PERF013 asks for a second window only when there was one;
``windows_over`` counts a pattern seen in two windows apart). The live loop's extension of an
adaptive window used to name its files after its own round, so the build counted it as a second
window; a slice now says which round's window it ``continues``, and its seconds add to that
window's length.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from doctor.engine import facts as facts_mod
from doctor.evidence.bundle import Bundle

SLOW = Path(__file__).parent / "fixtures" / "slow" / "slow_rank" / "bundle"


def _slice(bundle: Bundle, src: Path, round_no: int, duration: float, continues: int | None) -> None:
    """One live slice: the fixture's raw profiles of every rank as round ``round_no`` and the
    window document the samples probe writes beside them."""
    host_dir = next((src / "hosts").iterdir())
    meta = json.loads((host_dir / "samples" / "samples-r1-window.json").read_text())
    meta.update({"round": round_no, "duration_s": duration})
    if continues is not None:
        meta["continues"] = continues
    for raw in sorted((host_dir / "samples").glob("samples-r1-rank*.txt")):
        rank = int(raw.stem.rsplit("rank", 1)[1])
        bundle.add_artifact(f"hosts/h/samples/samples-r{round_no}-rank{rank}.txt", raw.read_text(), "samples",
                            host="h", rank=rank)
    bundle.add_artifact(f"hosts/h/samples/samples-r{round_no}-window.json", json.dumps(meta), "samples", host="h")


def _facts(bundle: Bundle) -> dict:
    return facts_mod.build(facts_mod.items_from_bundle(bundle), "live")[0]["samples"]


def test_an_extended_slice_is_part_of_the_window_it_continues(tmp_path):
    b = Bundle.create(tmp_path / "b", {"type": "live"})
    _slice(b, SLOW, 2, 2.0, None)
    _slice(b, SLOW, 3, 8.0, continues=2)
    s = _facts(b)
    assert s["n_windows"] == 1, s["n_windows"]
    assert s["window"]["duration_s"] == 10.0  # 2 s first slice + 8 s extension
    assert s["duration_s"] == 10.0


def test_two_windows_asked_apart_still_count_as_two(tmp_path):
    b = Bundle.create(tmp_path / "b", {"type": "live"})
    _slice(b, SLOW, 2, 2.0, None)
    _slice(b, SLOW, 4, 2.0, None)  # a second window (samples_again), not an extension
    s = _facts(b)
    assert s["n_windows"] == 2
    assert s["window"]["duration_s"] == 2.0


def test_the_live_extension_names_the_window_it_continues(tmp_path, monkeypatch):
    """The agent's extension request carries ``continues`` = the first slice's round."""
    from doctor.live import agent
    from doctor.live.window import MIN_EARLY_S

    col = agent.Collector(Bundle.create(tmp_path / "b", {"type": "live"}), None, agent.Trace(), {})  # type: ignore[arg-type]
    col.window_taken, col.window_round, col.window_ranks = 2.0, 2, None

    class _Report:
        facts = {"samples": {"progress": "hung", "frozen_ranks": [1]}}

    reqs = agent._extend_window(col, _Report(), 10.0, col.trace)  # type: ignore[arg-type]
    assert len(reqs) == 1
    name, opts = reqs[0]
    assert name == "samples" and opts["continues"] == 2 and opts["window"] == "extended"
    assert opts["min_window_s"] == MIN_EARLY_S and opts["stop_after_steps"] >= 1


def test_loose_profiles_without_a_window_document_are_one_window(tmp_path):
    folder = tmp_path / "loose"
    folder.mkdir()
    host_dir = next((SLOW / "hosts").iterdir())
    for raw in sorted((host_dir / "samples").glob("samples-r1-rank*.txt"))[:2]:
        shutil.copy(raw, folder / raw.name.replace("samples-r1-", "profile-"))
    s = facts_mod.build(facts_mod.items_from_folder(folder), "loose")[0]["samples"]
    assert s["n_windows"] == 1
