"""The profiler kind: torch.profiler tables captured from real jobs (tests/fixtures/profiler).

CPU tables come from this host (capture.py --device cpu), CUDA tables from the H200 lent to the
project (capture.py --device cuda); each scenario is a real loop with one habit, so the facts
must single that habit out and leave the healthy loop's shares near zero.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from doctor.probes.profiler import PROBE
from doctor.probes.profiler.table import parse_tables

from doctor.engine import facts as F
from doctor.evidence.contract import Sample

FIX = Path(__file__).resolve().parent / "fixtures" / "profiler"


def _build(path: Path) -> dict:
    facts, _ = F.build(F.items_from_folder(path), "loose")
    return facts


def _facts(path: Path) -> dict:
    return _build(path)["profiler"]


def test_reads_every_column_of_a_cuda_table() -> None:
    tab = parse_tables((FIX / "h200" / "cuda-item_sync-by-cpu-total.txt").read_text())[0]
    assert tab["device"] == "cuda"
    assert tab["columns"][:2] == ["name", "self_cpu_pct"] and "self_dev" in tab["columns"]
    assert tab["self_cpu_us"] == pytest.approx(39552.0) and tab["self_dev_us"] == pytest.approx(29429.0)
    sync = next(r for r in tab["rows"] if r["name"] == "cudaStreamSynchronize")
    assert sync["calls"] == 16 and sync["self_cpu"] == pytest.approx(17860.0)


def test_old_autograd_profiler_headers_map_to_the_same_keys() -> None:
    # torch 1.x column names (profiler_util.py before the rename), spaced as _build_table spaces
    text = (FIX / "cpu" / "cpu-healthy.txt").read_text()
    old = text.replace("Self CPU %", "Self CPU total %").replace("    Self CPU  ", "Self CPU total  ") \
        .replace("  # of Calls", "Number of Calls")
    new_tab, old_tab = parse_tables(text)[0], parse_tables(old)[0]
    assert old_tab["columns"] == new_tab["columns"]
    assert [r["name"] for r in old_tab["rows"]] == [r["name"] for r in new_tab["rows"]]


def test_a_paste_that_lost_its_indentation_still_reads() -> None:
    text = (FIX / "cpu" / "cpu-dataloader.txt").read_text()
    flat = "\n".join(ln.strip() for ln in text.splitlines())
    assert [r["name"] for r in parse_tables(flat)[0]["rows"]] == [r["name"] for r in parse_tables(text)[0]["rows"]]


@pytest.mark.parametrize(("name", "share", "at_least"), [
    ("h200/cuda-dataloader-by-cpu-total.txt", "dataloader", 0.3),  # 1.56 s of 1.58 s, less 1 s of start-up
    ("cpu/cpu-dataloader.txt", "dataloader", 0.8),
    ("h200/cuda-recompile-by-cpu-total.txt", "compile", 0.5),
    ("cpu/cpu-recompile.txt", "compile", 0.5),
    ("h200/cuda-item_per_sample-by-cpu-total.txt", "host_sync", 0.3),
])
def test_each_habit_shows_in_its_own_share(name: str, share: str, at_least: float) -> None:
    f = _facts(FIX / name)
    assert f["shares"][share] >= at_least
    others = {k: v for k, v in f["shares"].items() if k not in (share, "copy", "dtoh_device", "dataloader_raw")}
    assert all(v < 0.1 for v in others.values()), others


def test_healthy_loop_has_no_share_and_a_busy_gpu() -> None:
    f = _facts(FIX / "h200" / "cuda-healthy-by-cpu-total.txt")
    assert all(v < 0.05 for v in f["shares"].values()), f["shares"]
    assert f["steps"] == 8 and f["gpu_busy"] == 1.0
    # the profiler's own flush (one cudaDeviceSynchronize in the window) is no per-step read
    assert f["host_sync_per_step"] == 0 and f["host_sync_rows"] == []


def test_per_step_reads_and_gpu_busy_tell_a_costly_sync_from_a_cheap_one() -> None:
    cheap = _facts(FIX / "h200" / "cuda-item_sync-by-cpu-total.txt")
    costly = _facts(FIX / "h200" / "cuda-item_per_sample-by-cpu-total.txt")
    assert cheap["host_sync_per_step"] == 2 and cheap["gpu_busy"] > 0.8
    assert costly["host_sync_per_step"] == 512 and costly["gpu_busy"] < 0.5


def test_compiles_counted_inside_the_window() -> None:
    assert _facts(FIX / "h200" / "cuda-recompile-by-cpu-total.txt")["compiles"] == 7
    assert _facts(FIX / "h200" / "cuda-healthy-by-cpu-total.txt")["compiles"] == 0


def test_sniff_claims_tables_only() -> None:
    for p in sorted(FIX.glob("*/*.txt")):
        assert PROBE.sniff(Sample.read(p)), p
    logs = Path(__file__).resolve().parent / "fixtures" / "slow" / "steps" / "healthy" / "metrics.jsonl"
    assert not PROBE.sniff(Sample.read(logs))


def test_a_table_inside_a_ticket_is_read(tmp_path: Path) -> None:
    table = (FIX / "h200" / "cuda-dataloader-by-cpu-total.txt").read_text()
    ticket = tmp_path / "issue.md"
    ticket.write_text("Training is much slower than I expected and the GPU looks idle most of the time.\n"
                      "I profiled eight steps with torch.profiler and this is what it printed:\n\n"
                      f"```\n{table}```\n\nWhat should I change in my training script?\n")
    f = _build(ticket)
    assert f["profiler"]["shares"]["dataloader_raw"] >= 0.9


def test_a_log_that_printed_a_table_stays_a_log_and_is_read_too(tmp_path: Path) -> None:
    table = (FIX / "cpu" / "cpu-dataloader.txt").read_text()
    log = tmp_path / "train.log"
    log.write_text("".join(f"[rank0] epoch 0 step {i} loss 2.{i:03d} lr 1e-3\n" for i in range(40)) + table
                   + "Traceback (most recent call last):\nRuntimeError: boom\n")
    sample = Sample.read(log)
    assert not PROBE.sniff(sample) and PROBE.also_sniff(sample)
    f = _build(log)
    assert "logs" in f["evidence"]["kinds"] and f["profiler"]["shares"]["dataloader"] >= 0.8


def test_lightning_simple_profiler_report_gives_the_batch_wait_share() -> None:
    starved = _facts(FIX / "h200" / "lightning-dataloader.txt")
    collated = _facts(FIX / "h200" / "lightning-workers0.txt")
    assert starved["steps"] == collated["steps"] == 40
    assert starved["shares"]["dataloader"] > 0.7 and starved["shares"]["dataloader_raw"] > 0.9
    # 0.147 s of train_dataloader_next in a 0.661 s run_training_epoch: under the start-up allowance
    assert collated["shares"]["dataloader_raw"] == pytest.approx(0.147 / 0.661, abs=0.01)
    assert collated["shares"]["dataloader"] == 0.0
    healthy = _facts(FIX / "h200" / "lightning-healthy.txt")
    assert 0.1 < healthy["shares"]["dataloader_raw"] < 0.2 and healthy["shares"]["dataloader"] == 0.0
    assert starved["top"][0]["name"] == "[_TrainingEpochLoop].train_dataloader_next"


def test_report_sections_show_the_shares_the_rules_read_and_the_top_ops() -> None:
    from doctor.engine.diagnose import diagnose_path
    from doctor.render import view

    rep = diagnose_path(Path(__file__).resolve().parent / "fixtures" / "profiler" / "cpu" / "cpu-item_sync.txt")
    items = dict(view.section(rep, "profiler").body.items)
    assert items["device"] == "CPU only"
    assert "blocking host reads (item, synchronize)" in items
    top = view.section(rep, "profiler-top").body.rows
    assert top and all(r.cells[1].text.endswith("%") for r in top)
