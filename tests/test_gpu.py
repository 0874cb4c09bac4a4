"""GPU probe: NVML collection through a fake NVML that fails per call and per device, and the
nvidia-smi parsers on real output captured on the H200 (tests/fixtures/gpu/README.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pynvml
import pytest
from doctor.probes import gpu

from doctor.engine import facts as facts_mod
from doctor.evidence.bundle import Bundle
from doctor.evidence.contract import (
    CollectContext,
    Hints,
    ProbeFailed,
    ProbeSkipped,
    RankProcess,
    Sample,
)
from doctor.evidence.errors import EvidenceError

sys.path.insert(0, str(Path(__file__).parent))
from fake_nvml import FakeNvml, device  # noqa: E402

FIX = Path(__file__).parent / "fixtures" / "gpu"
H200 = FIX / "h200"
PUBLIC = FIX / "public"
E = pynvml  # error codes


@pytest.fixture(autouse=True)
def _fresh_static_cache():
    """Static values are cached per process; each test starts without them."""
    gpu._STATIC.clear()
    yield
    gpu._STATIC.clear()


def build(*docs: dict[str, Any] | Path) -> dict[str, Any]:
    """Facts from probe documents (as collect writes them) and/or fixture files."""
    parsed = []
    for i, doc in enumerate(docs):
        if isinstance(doc, Path):
            parsed.append(gpu.PROBE.parse(doc, doc.name, Hints.from_path(doc.name)))
        else:
            path = Path(f"/tmp/doc{i}.json")
            parsed.append(gpu.PROBE._parse_json(json.dumps(doc), path.name, Hints()))
    facts = facts_mod.empty_facts("loose", None)
    gpu.PROBE.build(parsed, facts)
    return facts["gpu"]


def folder_facts(folder: Path) -> dict[str, Any]:
    facts, _ = facts_mod.build(facts_mod.items_from_folder(folder), "loose")
    return facts


# -- NVML: every call fails on its own ----------------------------------------------------------

def test_field_failures_are_recorded_per_device_and_never_abort():
    nv = FakeNvml([device(), device(uuid="GPU-b")], fail={
        "nvmlDeviceGetPowerUsage": {0: E.NVML_ERROR_NOT_SUPPORTED},
        "nvmlDeviceGetMigMode": {None: E.NVML_ERROR_NO_PERMISSION},
        "nvmlDeviceGetComputeRunningProcesses": {1: E.NVML_ERROR_UNKNOWN},
    })
    doc = gpu.collect_document(nv, host="h", xid=False)
    d0, d1 = doc["devices"]
    assert d0["errors"]["power.draw_w"] == "not supported" and d0["power"]["draw_w"] is None
    assert d1["power"]["draw_w"] == 76.0 and "power.draw_w" not in d1["errors"]
    assert d0["errors"]["mig"] == d1["errors"]["mig"] == "no permission"
    assert d1["errors"]["processes"] == "unknown error" and "processes" not in d0["errors"]
    # the rest of each device is still read
    assert d0["clocks"]["sm"] == 345 and d0["max_clocks"]["sm"] == 1980 and d1["mem"]["total_mib"] == 143771
    assert doc["cost"]["failed_calls"] == 4


def test_lost_gpu_stops_that_device_only_and_is_a_hardware_fault():
    nv = FakeNvml([device(), device(uuid="GPU-lost"), device(uuid="GPU-c")], lost={1})
    doc = gpu.collect_document(nv, host="h", samples=2, interval=0)
    assert doc["devices"][1]["lost"] and doc["devices"][1]["errors"]["handle"] == "GPU is lost"
    assert not doc["devices"][0]["lost"] and doc["devices"][2]["clocks"]["sm"] == 345
    assert all(r["index"] != 1 for r in doc["samples"]["rows"])
    facts = build(doc)
    assert [f["label"] for f in facts["faulty"]] == ["h:gpu1"]
    assert facts["faulty"][0]["severe"] and "lost" in facts["faulty"][0]["why"][0]


def test_gpu_lost_in_the_middle_of_a_device_keeps_what_was_read():
    nv = FakeNvml([device()], fail={"nvmlDeviceGetTemperature": {0: E.NVML_ERROR_GPU_IS_LOST}})
    d = gpu.collect_document(nv, host="h", xid=False)["devices"][0]
    assert d["lost"] and d["errors"]["lost_at"] == "temp.gpu"
    assert d["clocks"]["sm"] == 345 and d["power"]["draw_w"] is None  # read before / not after


@pytest.mark.parametrize("code, exc, reason", [
    (E.NVML_ERROR_LIBRARY_NOT_FOUND, ProbeSkipped, "NVML library not found (libnvidia-ml.so.1): no NVIDIA driver on this host"),
    (E.NVML_ERROR_DRIVER_NOT_LOADED, ProbeSkipped, "driver is not loaded"),
    (E.NVML_ERROR_NO_PERMISSION, ProbeFailed, "no permission"),
    (E.NVML_ERROR_LIB_RM_VERSION_MISMATCH, ProbeFailed, "versions differ"),
    (E.NVML_ERROR_UNKNOWN, ProbeFailed, "nvmlInit failed: unknown error"),
])
def test_init_failures_skip_or_fail_with_a_precise_reason(monkeypatch, tmp_path, code, exc, reason):
    nv = FakeNvml([device()], init_error=code)
    monkeypatch.setattr(gpu, "load_nvml", lambda: nv)
    ctx = CollectContext(bundle=Bundle.create(tmp_path / "b"), host="h", procs=[], probe_name="gpu")
    with pytest.raises(exc, match=reason.replace("(", r"\(").replace(")", r"\)")):
        gpu.PROBE.collect(ctx)


def test_no_gpu_and_no_binding_are_skipped(monkeypatch, tmp_path):
    ctx = CollectContext(bundle=Bundle.create(tmp_path / "b"), host="h", procs=[], probe_name="gpu")
    nv = FakeNvml([])
    monkeypatch.setattr(gpu, "load_nvml", lambda: nv)
    with pytest.raises(ProbeSkipped, match="NVML sees no GPU"):
        gpu.PROBE.collect(ctx)
    assert nv.inited == 0  # shut down again
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(ProbeSkipped, match="nvidia-ml-py"):
        gpu.load_nvml()


def test_real_nvml_on_this_machine_without_a_driver_is_skipped(tmp_path):
    """CI and this machine have no NVIDIA driver: the real binding must say so precisely."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        if exc.value != pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
            pytest.skip(f"NVML present but failing differently: {exc.value}")
    else:
        pynvml.nvmlShutdown()
        pytest.skip("a GPU driver is installed here")
    ctx = CollectContext(bundle=Bundle.create(tmp_path / "b"), host="h", procs=[], probe_name="gpu")
    with pytest.raises(ProbeSkipped) as info:
        gpu.PROBE.collect(ctx)
    assert str(info.value) == "NVML library not found (libnvidia-ml.so.1): no NVIDIA driver on this host"


def test_batched_counters_fail_per_field_and_fall_back_when_refused():
    nv = FakeNvml([device(ecc_counts={(1, 0): 2, (1, 1): 9, (0, 0): 5, (0, 1): 40}, remapped=(1, 2, 1, 0))],
                  fail={}, missing=set())
    nv.devices[0]["field_fail"] = {82: E.NVML_ERROR_NO_PERMISSION}
    d = gpu.collect_document(nv, host="h", xid=False)["devices"][0]
    assert d["ecc"] == {"mode": "enabled", "volatile_uncorrected": 2, "aggregate_uncorrected": 9,
                        "volatile_corrected": 5, "aggregate_corrected": 40, "sram_threshold_exceeded": None}
    assert d["remapped_rows"] == {"correctable": 1, "uncorrectable": 2, "pending": True, "failure": False}
    assert d["errors"]["temp.memory"] == "no permission" and d["temp"]["gpu"] == 28
    gpu._STATIC.clear()
    old = FakeNvml([device(ecc_counts={(1, 0): 2, (1, 1): 9, (0, 0): 5, (0, 1): 40})],
                   fail={"nvmlDeviceGetFieldValues": {None: E.NVML_ERROR_FUNCTION_NOT_FOUND}})
    d2 = gpu.collect_document(old, host="h", xid=False)["devices"][0]
    assert d2["ecc"]["volatile_uncorrected"] == 2 and d2["ecc"]["aggregate_corrected"] == 40
    assert old.calls["nvmlDeviceGetTotalEccErrors"] == 4 and old.calls["nvmlDeviceGetRemappedRows"] == 1


def test_older_binding_without_event_reasons_uses_throttle_reasons():
    nv = FakeNvml([device(reasons=0x8 | 0x40)], missing={"nvmlDeviceGetCurrentClocksEventReasons"})
    d = gpu.collect_document(nv, host="h", xid=False)["devices"][0]
    assert d["reasons"] == ["hw_slowdown", "hw_thermal_slowdown"]
    assert nv.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 1


def test_nvlink_counters_and_links():
    nv = FakeNvml([device(nvlink_links=18, nvlink_errors={(0, 2): 7, (5, 0): 3, (5, 1): 1})])
    d = gpu.collect_document(nv, host="h", xid=False)["devices"][0]
    assert d["nvlink"] == {"links": 18, "active": 18, "errors": {"replay": 3, "recovery": 1, "crc_flit": 7, "crc_data": 0},
                           "error_total": 11}


def test_xid_event_during_sampling_makes_a_hardware_fault():
    nv = FakeNvml([device(procs=[(4321, 70000)], xids=[79]), device(uuid="GPU-b")])
    doc = gpu.collect_document(nv, host="n1", samples=3, interval=0, rank_of_pid={4321: 6})
    assert doc["xid"]["registered"] == [0, 1] and doc["xid"]["events"][0]["xid"] == 79
    facts = build(doc)
    assert facts["xid_events"] == [{"host": "n1", "gpu": "n1:gpu0", "xid": 79, "hardware": True}]
    assert facts["faulty"][0]["ranks"] == [6] and facts["faulty"][0]["severe"]


def test_xid_registration_refused_is_recorded():
    nv = FakeNvml([device()], fail={"nvmlDeviceRegisterEvents": {0: E.NVML_ERROR_NOT_SUPPORTED}})
    doc = gpu.collect_document(nv, host="h", samples=2, interval=0)
    assert doc["xid"]["registered"] == [] and doc["xid"]["error"] == "GPU 0: not supported"
    assert len(doc["samples"]["rows"]) == 2


def test_sampling_respects_the_time_budget():
    nv = FakeNvml([device()])
    doc = gpu.collect_document(nv, host="h", samples=50, interval=0.05, deadline_s=0.2, xid=False)
    assert len(doc["samples"]["rows"]) < 50
    assert doc["errors"]["samples"].startswith("stopped after")


def test_collect_writes_an_artifact_that_builds_back_into_facts(monkeypatch, tmp_path):
    nv = FakeNvml([device(procs=[(111, 70000)], util=[(100, 40)], sm=[1500, 1455, 1440, 1430],
                          reasons=0x4, power_mw=[692_000, 691_000, 690_000], temp=[60, 61, 62]),
                   device(uuid="GPU-b", procs=[(222, 500)])])
    monkeypatch.setattr(gpu, "load_nvml", lambda: nv)
    bundle = Bundle.create(tmp_path / "b")
    ctx = CollectContext(bundle=bundle, host="node7", probe_name="gpu",
                         procs=[RankProcess(pid=111, rank=0), RankProcess(pid=222, rank=1)],
                         options={"gpu_samples": 3, "gpu_sample_interval": 0})
    gpu.PROBE.collect(ctx)
    assert nv.inited == 0
    bundle.save()
    facts, _ = facts_mod.build(facts_mod.items_from_bundle(Bundle.load(tmp_path / "b")), "bundle")
    g = facts["gpu"]
    assert g["source"] == "nvml" and g["n_devices"] == 2
    assert g["pid_to_gpu"] == {"111": ["node7:gpu0"], "222": ["node7:gpu1"]}
    assert g["by_rank"]["0"]["primary"] == "node7:gpu0" and g["by_rank"]["0"]["busy"]
    assert g["busy_ranks"] == [0]
    s = g["samples"][0]
    assert (s["label"], s["n"], s["sm_min"], s["sm_median"], s["reason_share"]) == ("node7:gpu0", 3, 1430, 1440, {"sw_power_cap": 1.0})
    assert [d["label"] for d in g["power_capped"]] == ["node7:gpu0"] and g["throttled"] == []


# -- derived flags: throttled vs power-capped, peers, PCIe, sharing ------------------------------

def _busy(sm: int, **over: Any) -> dict[str, Any]:
    base = dict(util=(100, 50), sm=sm, reasons=0x4, power_mw=695_000, temp=65, procs=[])
    base.update(over)
    return device(**base)


def test_power_capped_under_load_is_healthy_but_hot_or_lowered_limit_is_not():
    nv = FakeNvml([_busy(1500, uuid="a"), _busy(1500, uuid="b", temp=86),
                   _busy(1500, uuid="c", limit_mw=500_000, power_mw=495_000)])
    g = build(gpu.collect_document(nv, host="h", xid=False))
    assert [d["label"] for d in g["power_capped"]] == ["h:gpu0"]
    why = {d["label"]: d["why"] for d in g["throttled"]}
    assert set(why) == {"h:gpu1", "h:gpu2"}
    assert "slowdown temperature" in why["h:gpu1"][0]
    assert "below the default 700 W" in why["h:gpu2"][0]


def test_a_gpu_slower_than_its_busy_peers_is_throttled():
    nv = FakeNvml([_busy(1500, uuid="a"), _busy(1490, uuid="b"), _busy(1510, uuid="c"), _busy(1300, uuid="d")])
    g = build(gpu.collect_document(nv, host="h", xid=False))
    assert [d["label"] for d in g["throttled"]] == ["h:gpu3"]
    assert "peers' median 1495 MHz" in g["throttled"][0]["why"][0]
    assert {d["label"] for d in g["power_capped"]} == {"h:gpu0", "h:gpu1", "h:gpu2"}


def test_fault_reason_counts_only_when_it_persists_across_samples():
    # the snapshot takes the first value, the samples the rest: 1 of 5 samples with HW slowdown
    blip = FakeNvml([_busy(1500, reasons=[0x4, 0x8, 0x4, 0x4, 0x4, 0x4])])
    assert build(gpu.collect_document(blip, host="h", samples=5, interval=0, xid=False))["throttled"] == []
    gpu._STATIC.clear()
    steady = FakeNvml([_busy(700, reasons=[0x4, 0x8 | 0x80, 0x88, 0x88, 0x4])])
    g = build(gpu.collect_document(steady, host="h", samples=4, interval=0, xid=False))
    assert g["throttled"][0]["fault_reasons"] == ["hw_slowdown", "hw_power_brake_slowdown"]
    assert g["samples"][0]["fault_share"] == 0.75


def test_pcie_below_max_counts_only_under_load():
    nv = FakeNvml([_busy(1500, uuid="a", pcie=(4, 5, 16, 16)), device(uuid="b", pcie=(1, 5, 16, 16)),
                   _busy(1500, uuid="c", pcie=(5, 5, 8, 16))])
    g = build(gpu.collect_document(nv, host="h", xid=False))
    assert [d["label"] for d in g["pcie_degraded"]] == ["h:gpu0", "h:gpu2"]
    dev = {d["label"]: d for d in g["devices"]}
    assert dev["h:gpu1"]["pcie_downtrained_idle"] and not dev["h:gpu1"]["pcie_degraded"]


def test_two_ranks_with_their_main_context_on_one_gpu_are_shared_but_a_stray_context_is_not():
    # rank 1 keeps a small context on GPU 0 (torch.cuda before set_device): not sharing
    ok = FakeNvml([device(uuid="a", procs=[(10, 30000), (11, 500)]), device(uuid="b", procs=[(11, 30000)])])
    assert build(gpu.collect_document(ok, host="h", rank_of_pid={10: 0, 11: 1}, xid=False))["shared"] == []
    gpu._STATIC.clear()
    bad = FakeNvml([device(uuid="a", procs=[(10, 30000), (11, 30000)]), device(uuid="b")])
    g = build(gpu.collect_document(bad, host="h", rank_of_pid={10: 0, 11: 1}, xid=False))
    assert g["shared"][0]["ranks"] == [0, 1] and g["shared"][0]["pids"] == [10, 11]


def test_pending_remap_is_not_severe_but_failure_is():
    nv = FakeNvml([device(uuid="a", remapped=(0, 4, 1, 0)), device(uuid="b", remapped=(0, 8, 0, 1))])
    g = build(gpu.collect_document(nv, host="h", xid=False))
    sev = {d["label"]: d["severe"] for d in g["faulty"]}
    assert sev == {"h:gpu0": False, "h:gpu1": True}


def test_static_values_are_cached_between_snapshots():
    nv = FakeNvml([device()])
    gpu.collect_document(nv, host="h", xid=False)
    gpu.collect_document(nv, host="h", xid=False)
    assert nv.calls["nvmlDeviceGetMaxClockInfo"] == 2  # sm + mem once, not per snapshot
    assert nv.calls["nvmlDeviceGetClockInfo"] == 6


# -- nvidia-smi parsers on real output --------------------------------------------------------------

def _dev(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    data = gpu.PROBE.parse(path, path.name, Hints()).data
    return data, data["devices"][0]


def test_smi_q_h200_under_load():
    data, d = _dev(H200 / "load" / "nvidia-smi-q.txt")
    assert data["driver_version"] == "580.159.04"
    assert (d["name"], d["uuid"], d["pci_bus"]) == ("NVIDIA H200", "GPU-9d2222a2-148d-e103-899b-a50a0f7fccca", "00000000:00:06.0")
    assert (d["clocks"]["sm"], d["max_clocks"]["sm"], d["max_clocks"]["mem"]) == (1455, 1980, 3201)
    assert d["reasons"] == ["sw_power_cap"]
    assert (d["power"]["draw_w"], d["power"]["limit_w"], d["power"]["default_limit_w"]) == (689.52, 700.0, 700.0)
    assert (d["temp"]["gpu"], d["temp"]["memory"], d["util"]["gpu"]) == (61, 50, 99)
    assert d["ecc"]["mode"] == "enabled" and d["ecc"]["volatile_uncorrected"] == 0
    assert d["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
    assert d["pcie"] == {"gen": 5, "gen_max": 5, "width": 16, "width_max": 16, "replay": 0}
    assert d["processes"] == [{"pid": 518, "used_mib": 1130, "type": "C", "name": "python3"}]
    assert d["violation_ns"]["power"] > 0 and d["mig"]["current"] is False


def test_smi_csv_loop_becomes_samples():
    data, d = _dev(H200 / "load" / "query-gpu-loop.csv")
    assert data["format"] == "smi-csv" and len(data["samples"][0]) == 10
    assert d["reasons"] == ["sw_power_cap"] and d["max_clocks"]["sm"] == 1980
    assert {s["util"] for s in data["samples"][0]} <= {99, 100}


def test_smi_table_580_and_older_layouts():
    _, d = _dev(H200 / "dup" / "nvidia-smi.txt")
    assert (d["name"], d["pci_bus"], d["power"]["limit_w"], d["mem"]["total_mib"]) == ("NVIDIA H200", "00000000:00:06.0", 700.0, 143771)
    assert [p["pid"] for p in d["processes"]] == [874, 875]
    _, old = _dev(PUBLIC / "pai-1396-p5000-table.txt")
    assert (old["name"], old["util"]["gpu"], old["processes"][0]["pid"], old["processes"][0]["used_mib"]) == ("Quadro P5000", 12, 23534, 489)
    _, v100 = _dev(PUBLIC / "k8s-device-plugin-243-v100s-table.txt")
    assert (v100["power"]["draw_w"], v100["util"]["gpu"], v100["ecc"]["volatile_uncorrected"]) == (219.0, 100, 0)


def test_pasted_smi_q_sections_without_a_gpu_header():
    _, d = _dev(PUBLIC / "l4rz-v100-power-brake-smi-q.txt")
    assert d["reasons"] == ["hw_slowdown", "hw_power_brake_slowdown"] and d["clocks"]["sm"] == 382
    _, r = _dev(PUBLIC / "gpud-pr80-remapped-rows-pending-smi-q.txt")
    assert r["remapped_rows"]["pending"] is True and r["remapped_rows"]["uncorrectable"] == 4


def test_the_four_sources_agree_on_the_same_h200():
    """NVML JSON, -q, csv and table of one idle H200 merge into one device with the same facts."""
    g = folder_facts(H200 / "idle")["gpu"]
    assert g["n_devices"] == 1 and g["source"] == "nvml"
    d = g["devices"][0]
    assert sorted(d["sources"]) == ["nvml-json", "smi-csv", "smi-q", "smi-table"]
    assert d["label"] == "vm:gpu0" and d["idle"] and not d["busy"]
    per = {}
    for name in ("gpu.json", "nvidia-smi-q.txt", "query-gpu.csv"):
        _, x = _dev(H200 / "idle" / name)
        per[name] = (x["uuid"], x["max_clocks"]["sm"], x["mem"]["total_mib"], x["power"]["limit_w"], tuple(x["reasons"]), x["pcie"]["gen_max"])
    assert len(set(per.values())) == 1, per


def test_bad_input_is_one_line_errors():
    bad_json = FIX / "h200" / "bench" / "run2-bench-idle.json"  # real JSON, not ours: not sniffed
    assert not gpu.PROBE.sniff(Sample.read(bad_json))
    for text, why in [('{"schema": "mldoctor.gpu/1", "devices": 3}', "no devices list"),
                      ('{"schema": "mldoctor.gpu/1", "devi', "not valid JSON"),
                      ("index, clocks.sm [MHz], memory.used [MiB]\n", "no data rows")]:
        p = Path("/tmp/mldoctor-gpu-bad.txt")
        p.write_text(text)
        with pytest.raises(EvidenceError, match=why):
            gpu.PROBE.parse(p, "bad.txt", Hints())


def test_other_evidence_is_not_claimed():
    for p in [H200 / "stuck" / "torchrun.log", H200 / "stuck" / "pyspy-native-rank0-snap1.txt",
              H200 / "stuck" / "env-rank0.txt", H200 / "env" / "versions.txt"]:
        assert not gpu.PROBE.sniff(Sample.read(p)), p


def test_stuck_rank_joins_stacks_and_gpu():
    facts = folder_facts(H200 / "stuck")
    assert facts["stacks"]["state_ranks"] == {"cuda_sync": [0]}
    r0 = facts["gpu"]["by_rank"]["0"]
    assert r0["busy"] and r0["primary"] == "vm:gpu0" and r0["util"] == 100
    d = facts["gpu"]["devices"][0]
    assert d["busy_low_power"] and d["sm_eff"] == 1980


def test_thermal_violation_over_the_window_is_a_throttle_fault():
    # violation counter: 0 at the snapshot, +0.9 s per call afterwards (sampling window ~0 s here,
    # so any growth saturates the share at 1.0)
    nv = FakeNvml([_busy(1200, reasons=0x4, viol_ns={0: 0, 1: [0, 900_000_000]})])
    g = build(gpu.collect_document(nv, host="h", samples=3, interval=0.01, xid=False))
    assert g["throttled"][0]["fault_reasons"] == ["thermal_policy"]
    assert g["devices"][0]["violation_share"]["thermal"] == 1.0 and not g["devices"][0]["power_capped_ok"]
