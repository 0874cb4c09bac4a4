"""nvidia-smi dmon / pmon / --query-gpu loops as GPU evidence (tests/fixtures/host_tools/h200).

Captured on the H200 lent to the project while a compute-bound job and an input-starved job
(DataLoader num_workers=0 with per-sample decode) ran (tests/fixtures/profiler/capture_device.sh).
"""

from __future__ import annotations

from pathlib import Path

from doctor.probes.gpu import PROBE
from doctor.probes.gpu.smi_dmon import looks_like_dmon, parse_dmon

from doctor.engine import facts as F
from doctor.evidence.contract import Sample

H200 = Path(__file__).resolve().parent / "fixtures" / "host_tools" / "h200"


def _gpu(path: Path) -> dict:
    facts, _ = F.build(F.items_from_folder(path), "loose")
    return facts["gpu"]


def test_dmon_rows_become_samples_of_each_gpu() -> None:
    data = parse_dmon((H200 / "healthy" / "nvidia-smi-dmon.txt").read_text())
    (d,) = data["devices"]
    assert d["index"] == 0 and d["clocks"]["sm"] == 1980 and d["util"]["gpu"] == 100
    assert len(data["samples"][0]) == 10 and {s["util"] for s in data["samples"][0]} == {100}


def test_every_metric_group_selection_reads() -> None:
    # -s pucvmet adds violation, memory, ECC and PCIe columns: the shared ones still land
    data = parse_dmon((H200 / "dataloader" / "nvidia-smi-dmon-pucvmet.txt").read_text())
    (d,) = data["devices"]
    assert d["power"]["draw_w"] == 125.0 and d["util"]["gpu"] == 0 and d["temp"]["memory"] in (41, 42)


def test_pmon_names_the_processes() -> None:
    data = parse_dmon((H200 / "healthy" / "nvidia-smi-pmon.txt").read_text())
    (d,) = data["devices"]
    assert [(p["pid"], p["type"], p["name"]) for p in d["processes"]] == [(754, "C", "python3")]


def test_busy_and_idle_jobs_differ_in_the_facts() -> None:
    busy, idle = _gpu(H200 / "healthy" / "nvidia-smi-dmon.txt"), _gpu(H200 / "dataloader" / "nvidia-smi-dmon.txt")
    assert busy["sources"] == ["smi-dmon"] and busy["devices"][0]["busy"]
    assert busy["samples"][0]["util_low_share"] == 0.0
    assert not idle["devices"][0]["busy"] and idle["samples"][0]["util_low_share"] == 1.0


def test_query_csv_loop_gives_the_same_idle_share() -> None:
    assert _gpu(H200 / "dataloader" / "nvidia-smi-query.csv")["samples"][0]["util_low_share"] == 1.0
    assert _gpu(H200 / "healthy" / "nvidia-smi-query.csv")["samples"][0]["util_low_share"] == 0.0


def test_sniff_needs_the_header_at_the_top() -> None:
    for p in sorted(H200.glob("*/nvidia-smi-*")):
        assert PROBE.sniff(Sample.read(p)), p
    text = (H200 / "healthy" / "nvidia-smi-dmon.txt").read_text()
    assert looks_like_dmon("$ nvidia-smi dmon\n" + text)
    # a log quoting dmon lines far down is not GPU evidence by itself
    assert not looks_like_dmon("\n".join(f"step {i} loss 0.5" for i in range(20)) + "\n" + text)


def test_violation_columns_feed_the_thermal_flag() -> None:
    text = (H200 / "healthy" / "nvidia-smi-dmon-pucvmet.txt").read_text()
    (d,) = parse_dmon(text)["devices"]
    assert d["violation_share"] == {"power": 0.0, "thermal": 0.0}
    # the same readings with the thermal-violation column set in 3 of 5 rows
    lines = text.splitlines()
    cols = lines[0].lstrip("#").split()
    at = cols.index("tviol")
    hot = lines[:2] + [" ".join(v if j != at else ("1" if i < 3 else "0") for j, v in enumerate(ln.split()))
                       for i, ln in enumerate(lines[2:])]
    (d,) = parse_dmon("\n".join(hot))["devices"]
    assert d["violation_share"]["thermal"] == 0.6
