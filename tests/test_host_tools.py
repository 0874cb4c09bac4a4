"""Host tool output (top, uptime, vmstat, free, lscpu) captured on a real 16-core host
(tests/fixtures/host_tools/capture.sh): idle, oversubscribed for 75 s, and after the load while
a direct-I/O writer ran."""

from __future__ import annotations

from pathlib import Path

from doctor.probes.host_tools import PROBE

from doctor.engine import facts as F
from doctor.evidence.contract import Sample

H200 = Path(__file__).resolve().parent / "fixtures" / "host_tools" / "h200"


def _facts(path: Path) -> dict:
    facts, _ = F.build(F.items_from_folder(path), "loose")
    return facts


def test_oversubscribed_host_reads_load_run_queue_and_cores() -> None:
    h = _facts(H200 / "oversubscribed")["host_tools"]
    assert h["cores"] == 16 and h["load1"] == 65.18 and h["runnable"] == 96.0
    assert h["load_per_core"] > 4 and h["runnable_per_core"] == 6.0 and h["cpu"]["idle"] == 0.0
    assert set(h["tools"]) == {"top", "uptime", "vmstat", "free", "lscpu"}


def test_the_since_boot_vmstat_line_is_skipped() -> None:
    # vmstat's first line averages since boot (vmstat(8)); its 29% idle must not hide 0% now
    h = _facts(H200 / "oversubscribed" / "vmstat.txt")["host_tools"]
    assert h["runnable"] == 96.0 and h["cpu"]["idle"] == 0.0


def test_a_lagging_load_average_meets_an_idle_cpu() -> None:
    h = _facts(H200 / "io_writer")["host_tools"]
    assert h["load_per_core"] > 4 and h["runnable_per_core"] < 0.5 and h["cpu"]["idle"] >= 90
    assert 0 < h["iowait_pct"] < 20


def test_free_without_its_command_keeps_only_shares() -> None:
    h = _facts(H200 / "oversubscribed_15s" / "free-g.txt")["host_tools"]
    assert "mem_total_mb" not in h and h["swap_used_frac"] == 0.0
    h = _facts(H200 / "idle" / "free-h.txt")["host_tools"]
    assert h["mem_total_mb"] == 125 * 1024.0 and h["mem_available_frac"] == 1.0


def test_cores_come_from_the_system_kind_when_no_tool_prints_them(tmp_path: Path) -> None:
    h = _facts(H200 / "oversubscribed_15s")["host_tools"]
    assert h["cores"] == 0 and h["load_per_core"] == 0.0


def test_sniff_wants_the_tool_first_line() -> None:
    for p in sorted(H200.glob("*/*.txt")):
        if "nvidia-smi" not in p.name:
            assert PROBE.sniff(Sample.read(p)), p


def test_a_log_quoting_uptime_stays_a_log(tmp_path: Path) -> None:
    uptime = (H200 / "oversubscribed" / "uptime.txt").read_text()
    log = tmp_path / "train.log"
    log.write_text("".join(f"[rank0] step {i} loss 0.{i:03d} lr 3e-4\n" for i in range(30)) + uptime)
    assert not PROBE.sniff(Sample.read(log))
    first = tmp_path / "uptime.txt"
    first.write_text("$ uptime\n" + uptime)
    assert PROBE.sniff(Sample.read(first))


def test_sysstat_reports_skip_the_since_boot_one() -> None:
    # mpstat/iostat captured on this 2-CPU host while other jobs ran (tests/fixtures/host_tools/local)
    local = H200.parent / "local"
    h = _facts(local / "plain")["host_tools"]
    assert h["cores"] == 2 and {"mpstat", "iostat"} <= set(h["tools"])
    assert h["disk_util_device"] == "vda" and 0 <= h["disk_util_max"] <= 100
    # iostat's first report (since boot) has 0.31 % iowait and 49 % idle; the interval report 0 and 0
    io = _facts(local / "plain" / "iostat.txt")["host_tools"]
    assert io["iowait_pct"] == 0.0 and io["cpu"]["idle"] == 0.0


def test_report_section_digests_the_readings_and_marks_what_is_past_the_rules_lines() -> None:
    """The report shows the numbers the host rules compare, marking a value past their line."""
    from doctor.engine.diagnose import diagnose_path
    from doctor.render import view

    over = view.section(diagnose_path(H200 / "oversubscribed"), "host-tools")
    items = dict(over.body.items)
    assert items["cores"] == "16"
    assert items["load average (1 / 15 min)"].endswith("per core (high)")
    idle = view.section(diagnose_path(H200 / "idle"), "host-tools")
    assert "(high)" not in " ".join(v for _, v in idle.body.items)
