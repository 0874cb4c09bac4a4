"""GPU evidence: NVML readings taken live, and the same facts read back from ``nvidia-smi`` output.

Four sources give one normalized device record each (:mod:`.record`), so the same rules work on
a live host and on the files attached to a ticket:

- live: NVML through nvidia-ml-py (:mod:`.nvml`), written as this probe's own JSON artifact
  (schema ``mldoctor.gpu/1``), with optional short repeated sampling and Xid events;
- ``nvidia-smi -q`` text, whole or pasted sections (:mod:`.smi_q`);
- ``nvidia-smi --query-gpu=... --format=csv``, repeated rows from ``-l`` as samples (:mod:`.smi_csv`);
- the default ``nvidia-smi`` table (:mod:`.smi_table`);
- ``nvidia-smi dmon`` / ``pmon`` loops (:mod:`.smi_dmon`), dmon rows as samples.

This module is the probe itself: which files are GPU evidence, which source wins when several
describe one GPU, and the facts the rules read; the flags come from :mod:`.derive`.
``python -m doctor.probes.gpu`` (:mod:`.cli`) prints the live document, for capturing fixtures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from doctor.evidence.contract import Hints, Parsed, Probe, ProbeFailed, ProbeSkipped, Sample
from doctor.evidence.errors import EvidenceError
from doctor.evidence.sections import Section, SectionContext

from . import report
from .derive import HARDWARE_XIDS, derive, derive_peers, summarize_samples
from .nvml import _STATIC as _STATIC  # tests and the bench empty the static cache between runs
from .nvml import collect_document, init_nvml, load_nvml, nvml_reason, shutdown_nvml
from .record import SCHEMA_ID, decode_reasons, device_label, empty_device
from .smi_csv import csv_header_known, parse_smi_csv
from .smi_dmon import looks_like_dmon, parse_dmon
from .smi_q import looks_like_q_sections, parse_smi_q
from .smi_table import SMI_TABLE_MARK, parse_smi_table

__all__ = [
    "PROBE", "SCHEMA_ID", "GpuProbe", "collect_document", "decode_reasons", "derive", "derive_peers",
    "empty_device", "init_nvml", "load_nvml", "parse_smi_csv", "parse_smi_q", "parse_smi_table",
    "summarize_samples",
]

class GpuProbe(Probe):
    name: ClassVar[str] = "gpu"
    title: ClassVar[str] = "GPU state (NVML / nvidia-smi)"
    collects: ClassVar[str] = (
        "Per GPU: name, UUID, PCI bus, clocks and their maxima, clock event (throttle) reasons, "
        "temperatures, power and its limits, utilization, memory, ECC counts, remapped rows, retired "
        "pages, PCIe link and replays, NVLink errors, compute processes (PIDs) and MIG mode, through "
        "NVML live or from nvidia-smi -q / --query-gpu csv / table output; optional short sampling and "
        "Xid events. Of processes only the PID, memory and executable base name are kept, never command lines."
    )
    priority: ClassVar[int] = 70
    build_order: ClassVar[int] = 40
    live_first_round: ClassVar[bool] = True
    follow_ups: ClassVar[dict[str, dict[str, Any]]] = {"gpu": {}, "gpu_samples": {"gpu_samples": 10}}
    max_bytes: ClassVar[int] = 32 * 1024 * 1024
    fixtures: ClassVar[tuple[str, ...]] = (
        "tests/fixtures/gpu/h200/*/gpu.json",
        "tests/fixtures/gpu/h200/*/nvidia-smi*.txt",
        "tests/fixtures/gpu/public/*",
        "tests/fixtures/slow/gpu_*/bundle/hosts/*/gpu/gpu-round*.json",
        "tests/fixtures/stacks/gpu_cuda_hang/nvidia-smi.txt",
        "tests/fixtures/host_tools/h200/*/nvidia-smi-*",
    )
    facts_schema: ClassVar[dict[str, str]] = {
        "gpu.source": "string: nvml | nvidia-smi (nvml when any NVML reading is present)",
        "gpu.sources": "list<string>: every format read: nvml-json, smi-q, smi-csv, smi-table, smi-dmon, smi-pmon",
        "gpu.n_devices": "int: GPUs seen",
        "gpu.driver_versions": "list<string>: distinct driver versions",
        "gpu.devices": "list<map>: one record per GPU (small: one per device)",
        "gpu.devices[].label": "string: host:gpuN (gpuN without a host)",
        "gpu.devices[].index": "int: GPU index on its host",
        "gpu.devices[].uuid": "string: GPU UUID or null",
        "gpu.devices[].name": "string: product name",
        "gpu.devices[].host": "string: host name ('' when unknown)",
        "gpu.devices[].pci_bus": "string: PCI bus id",
        "gpu.devices[].clocks": "map<string,int>: current sm, mem, graphics clocks in MHz (null unknown)",
        "gpu.devices[].max_clocks": "map<string,int>: max sm, mem, graphics clocks in MHz",
        "gpu.devices[].reasons": "list<string>: active clock event reasons (gpu_idle, sw_power_cap, hw_slowdown, ...)",
        "gpu.devices[].fault_reasons": "list<string>: the active reasons that mean a fault (hw_slowdown, hw_thermal_slowdown, hw_power_brake_slowdown, sw_thermal_slowdown; thermal_policy when the NVML thermal violation counter grew over >= 25 % of the sampling window), by sample share when sampled",
        "gpu.devices[].temp": "map<string,int>: gpu, memory, slowdown, shutdown, max_operating in C",
        "gpu.devices[].power": "map<string,float>: draw_w, limit_w (enforced), default_limit_w",
        "gpu.devices[].util": "map<string,int>: gpu and memory utilization in %",
        "gpu.devices[].mem": "map<string,int>: used_mib, total_mib",
        "gpu.devices[].ecc": "map<string,any>: mode, volatile_/aggregate_ uncorrected/corrected counts, sram_threshold_exceeded",
        "gpu.devices[].remapped_rows": "map<string,any>: correctable, uncorrectable, pending, failure",
        "gpu.devices[].retired_pages": "map<string,any>: sbe, dbe, pending (pre-Ampere)",
        "gpu.devices[].pcie": "map<string,int>: gen, gen_max, width, width_max, replay",
        "gpu.devices[].nvlink": "map<string,any>: links, active, errors (replay/recovery/crc_flit/crc_data sums), error_total",
        "gpu.devices[].processes": "list<map>: pid, used_mib, rank (when known)",
        "gpu.devices[].processes[].pid": "int: process id holding a context on the GPU",
        "gpu.devices[].processes[].used_mib": "int: GPU memory it holds",
        "gpu.devices[].processes[].rank": "int: its job rank, when the process table names it",
        "gpu.devices[].processes[].name": "string: process name (nvidia-smi table only)",
        "gpu.devices[].processes[].type": "string: context type from the nvidia-smi table: C (compute), G (graphics), C+G",
        "gpu.devices[].reasons_mask": "int: raw clock event reasons bitmask (nvidia-smi csv), decoded into reasons",
        "gpu.devices[].timestamp": "string: nvidia-smi's timestamp of the reading, as printed",
        "gpu.devices[].ranks": "list<int>: job ranks with a context on this GPU",
        "gpu.devices[].mig": "map<string,bool>: current, pending MIG mode",
        "gpu.devices[].xids": "list<map>: Xid events seen on this GPU during the probe (xid, t)",
        "gpu.devices[].errors": "map<string,string>: field -> why it could not be read (not supported, no permission, GPU is lost, ...)",
        "gpu.devices[].lost": "bool: NVML or nvidia-smi says the GPU is lost",
        "gpu.devices[].violation_ns": "map<string,int>: cumulative ns the power / thermal policy held clocks down (NVML violation status when sampling; nvidia-smi -q 'Clocks Event Reasons Counters')",
        "gpu.devices[].violation_share": "map<string,float>: share of the sampling window the power / thermal policy held clocks down",
        "gpu.devices[].pstate": "string: performance state P0..P12",
        "gpu.devices[].app_clocks": "map<string,int>: application clocks graphics, mem in MHz",
        "gpu.devices[].busy": "bool: utilization (median over samples when sampled) >= 50 %",
        "gpu.devices[].idle": "bool: GpuIdle reason active or 0 % utilization",
        "gpu.devices[].util_eff": "float: utilization in % used for the flags (sample median, which can fall between two readings, or the snapshot)",
        "gpu.devices[].sm_eff": "float: SM clock in MHz used for the flags (sample median, which can fall between two readings, or the snapshot)",
        "gpu.devices[].sm_frac": "float: sm_eff / max SM clock",
        "gpu.devices[].hw_fault": "bool: lost, volatile uncorrectable ECC, RMA-level aggregate ECC, row remap failure/pending, retired pages pending, reset required, or a hardware Xid",
        "gpu.devices[].throttle_fault": "bool: a fault reason active (HW slowdown, HW/SW thermal, HW power brake) or hot while busy",
        "gpu.devices[].power_capped_ok": "bool: busy, SW power cap, power near the limit, no fault reason, normal temperature, default limit, not behind peers: healthy",
        "gpu.devices[].at_power_cap": "bool: power draw >= 90 % of the enforced limit",
        "gpu.devices[].power_limit_lowered": "bool: enforced power limit < 95 % of the default",
        "gpu.devices[].clocks_locked_low": "bool: application clocks setting active with app clocks below max",
        "gpu.devices[].hot": "bool: temperature within 5 C of the slowdown threshold (84 C without thresholds)",
        "gpu.devices[].slow_vs_peers": "bool: busy and SM clock behind the host peers' median by > max(100 MHz, 5 %)",
        "gpu.devices[].peer_sm_median": "int: median SM clock of the busy GPUs of its host (null with < 2)",
        "gpu.devices[].pcie_degraded": "bool: busy and PCIe gen or width below its max",
        "gpu.devices[].pcie_downtrained_idle": "bool: link below max while not busy (normal power saving)",
        "gpu.devices[].mem_full": "bool: memory used >= 95 % of total",
        "gpu.devices[].hw_fault_severe": "bool: hw_fault other than a pending remap/retirement or reset request",
        "gpu.devices[].busy_low_power": "bool: utilization >= 90 % while drawing < 35 % of the power limit (a spinning or tiny kernel)",
        "gpu.devices[].why": "map<string,list<string>>: human reasons per flag group: fault, throttle, pcie, info",
        "gpu.devices[].sources": "list<string>: formats this device was read from",
        "gpu.by_host": "map<string,map>: per host: n_devices, busy, hw_fault, throttle_fault labels",
        "gpu.by_host[].n_devices": "int: GPUs seen on the host",
        "gpu.by_host[].busy": "list<string>: labels of its busy GPUs",
        "gpu.by_host[].hw_fault": "list<string>: labels of its GPUs with a hardware fault",
        "gpu.by_host[].throttle_fault": "list<string>: labels of its GPUs held down by a fault reason",
        "gpu.samples": "list<map>: per sampled GPU: label, n, sm_min, sm_median, sm_max, util_median, util_max, power_median_w, temp_max, reason_share, fault_share",
        "gpu.samples[].label": "string: host:gpuN",
        "gpu.samples[].n": "int: samples taken",
        "gpu.samples[].sm_min": "int: lowest SM clock in MHz",
        "gpu.samples[].sm_median": "float: median SM clock in MHz",
        "gpu.samples[].sm_max": "int: highest SM clock in MHz",
        "gpu.samples[].util_median": "float: median utilization in %",
        "gpu.samples[].util_max": "int: highest utilization in %",
        "gpu.samples[].power_median_w": "float: median power draw in W",
        "gpu.samples[].temp_max": "int: highest temperature in C",
        "gpu.samples[].reason_share": "map<string,float>: clock event reason -> share of samples it was active in",
        "gpu.samples[].util_low_share": "float: share of samples with utilization <= 10 % (the GPU idle in that interval)",
        "gpu.samples[].fault_share": "float: share of samples with the most frequent fault reason active",
        "gpu.samples[].lost": "bool: some sample found the GPU lost",
        "gpu.pid_to_gpu": "map<string,list<string>>: pid -> GPU labels it has a context on",
        "gpu.by_rank": "map<string,map>: rank -> gpus (labels), primary (label with most memory), busy, util, throttle_fault, hw_fault",
        "gpu.by_rank[].gpus": "list<string>: labels of every GPU the rank holds a context on",
        "gpu.by_rank[].pids": "list<int>: the rank's processes seen on GPUs",
        "gpu.by_rank[].primary": "string: label of its main GPU (where it holds the most memory)",
        "gpu.by_rank[].busy": "bool: its main GPU is busy",
        "gpu.by_rank[].util": "float: its main GPU's utilization in % (util_eff)",
        "gpu.by_rank[].throttle_fault": "bool: its main GPU is held down by a fault reason",
        "gpu.by_rank[].hw_fault": "bool: its main GPU has a hardware fault",
        "gpu.faulty": "list<map>: GPUs with a hardware fault: label, host, index, uuid, why",
        "gpu.faulty[].label": "string: host:gpuN",
        "gpu.faulty[].host": "string: host name ('' when unknown)",
        "gpu.faulty[].index": "int: GPU index on its host",
        "gpu.faulty[].uuid": "string: GPU UUID",
        "gpu.faulty[].severe": "bool: failing now (lost, uncorrectable ECC, remap failure, hardware Xid), not only a pending remap/retirement awaiting a reset",
        "gpu.faulty[].why": "list<string>: the fault readings",
        "gpu.faulty[].ranks": "list<int>: ranks with a context on it",
        "gpu.throttled": "list<map>: GPUs held down by a fault reason, heat, a lowered limit, locked clocks, or behind peers: label, host, index, why, ranks",
        "gpu.throttled[].label": "string: host:gpuN",
        "gpu.throttled[].host": "string: host name ('' when unknown)",
        "gpu.throttled[].index": "int: GPU index on its host",
        "gpu.throttled[].uuid": "string: GPU UUID",
        "gpu.throttled[].why": "list<string>: what holds it down",
        "gpu.throttled[].ranks": "list<int>: ranks with a context on it",
        "gpu.throttled[].sm": "float: SM clock in MHz (sample median when sampled)",
        "gpu.throttled[].max_sm": "int: max SM clock",
        "gpu.throttled[].fault_reasons": "list<string>: active fault reasons",
        "gpu.power_capped": "list<map>: busy GPUs at their software power cap and otherwise healthy: label, why",
        "gpu.power_capped[].label": "string: host:gpuN",
        "gpu.power_capped[].host": "string: host name ('' when unknown)",
        "gpu.power_capped[].index": "int: GPU index on its host",
        "gpu.power_capped[].uuid": "string: GPU UUID",
        "gpu.power_capped[].why": "list<string>: the readings that make it healthy",
        "gpu.power_capped[].power_w": "float: power draw",
        "gpu.power_capped[].limit_w": "float: enforced power limit",
        "gpu.power_capped[].ranks": "list<int>: ranks with a context on it",
        "gpu.pcie_degraded": "list<map>: busy GPUs below their PCIe gen/width: label, why, replay",
        "gpu.pcie_degraded[].label": "string: host:gpuN",
        "gpu.pcie_degraded[].host": "string: host name ('' when unknown)",
        "gpu.pcie_degraded[].index": "int: GPU index on its host",
        "gpu.pcie_degraded[].uuid": "string: GPU UUID",
        "gpu.pcie_degraded[].why": "list<string>: link now vs capable",
        "gpu.pcie_degraded[].ranks": "list<int>: ranks with a context on it",
        "gpu.pcie_degraded[].replay": "int: PCIe replay counter",
        "gpu.shared": "list<map>: GPUs that two or more job ranks use as their main GPU: label, ranks, pids",
        "gpu.shared[].label": "string: host:gpuN",
        "gpu.shared[].index": "int: GPU index on its host",
        "gpu.shared[].ranks": "list<int>: the ranks sharing it",
        "gpu.shared[].pids": "list<int>: their processes",
        "gpu.shared[].host": "string: host",
        "gpu.shared[].why": "list<string>: which ranks and processes",
        "gpu.crowded": "list<map>: GPUs holding two or more compute processes of one program while another GPU of the same host holds none (ranks piled on one device; no rank mapping needed): label, host, index, pids, name, idle",
        "gpu.crowded[].label": "string: host:gpuN",
        "gpu.crowded[].host": "string: host",
        "gpu.crowded[].index": "int: GPU index on its host",
        "gpu.crowded[].pids": "list<int>: the processes of that program on it",
        "gpu.crowded[].name": "string: their program name",
        "gpu.crowded[].idle": "list<string>: GPUs of the same host with no process",
        "gpu.crowded[].why": "list<string>: how many processes on which GPU, and the idle ones",
        "gpu.busy_ranks": "list<int>: ranks whose main GPU is busy (util >= 50 %)",
        "gpu.xid_events": "list<map>: Xid events seen during the probe: host, gpu, xid, hardware (bool)",
        "gpu.xid": "map<string,any>: registered (labels), error (why registration failed), window_s",
        "gpu.cost": "map<string,any>: NVML calls, failed calls, seconds per snapshot and sampling (live only)",
    }

    # -- recognizing files ----------------------------------------------------------------------

    def sniff(self, sample: Sample) -> bool:
        if sample.is_binary:
            return False
        text = sample.text
        head = text[:4096].lstrip() or text.lstrip()  # its first character is the file's
        if head.startswith("{"):
            # json.dumps(sort_keys=True) puts "schema" late; the sample holds the first 64 KiB.
            return f'"{SCHEMA_ID}"' in text
        if text.find("NVSMI LOG", 0, 2000) != -1:
            return True
        # dmon / pmon: a "# gpu" header line (bounded find first, the parse check only then)
        if text.find("gpu ", 0, 4000) != -1 and text.find("#", 0, 4000) != -1 and looks_like_dmon(text[:4000]):
            return True
        # the substring tests first: this runs on every file of a folder (16k stack dumps);
        # bounded finds rather than slices or splits, which copied the head for one search
        end = head.find("\n")  # the first non-blank line (head is left-stripped)
        if head.find(",", 0, len(head) if end == -1 else end) != -1 \
                and csv_header_known(head if end == -1 else head[:end]) >= 2:
            return True
        if text.find("B") != -1 and "MiB" in text and SMI_TABLE_MARK.search(text[:8000]):  # "B": a memchr scan
            return True
        # every -q line is "key<padding> : value" (looks_like_q_sections looks at 20000 characters)
        return text.find(" : ", 0, 20000) != -1 and looks_like_q_sections(text)

    def parse(self, path: Path, rel: str, hints: Hints) -> Parsed:
        text = path.read_text(encoding="utf-8", errors="replace")
        stripped = text.lstrip()
        try:
            if stripped.startswith("{"):
                return self._parse_json(text, rel, hints)
            first = next((ln for ln in text.splitlines()[:50] if ln.strip()), "")
            if "NVSMI LOG" not in text[:2000] and looks_like_dmon(text[:4000]):
                data = parse_dmon(text)
                fmt = "smi-pmon" if data["devices"] and not data["samples"] and any(
                    d["processes"] for d in data["devices"]) else "smi-dmon"
            elif "NVSMI LOG" in text[:2000] or (not SMI_TABLE_MARK.search(text[:8000]) and csv_header_known(first) < 2):
                data = parse_smi_q(text)
                fmt = "smi-q"
            elif csv_header_known(first) >= 2:
                data = parse_smi_csv(text)
                fmt = "smi-csv"
            else:
                data = parse_smi_table(text)
                fmt = "smi-table"
        except ValueError as exc:
            raise EvidenceError(rel, str(exc)) from None
        data.update({"source": "nvidia-smi", "format": fmt, "host": hints.host or ""})
        return Parsed(self.name, rel, data, hints.rank, hints.host)

    def _parse_json(self, text: str, rel: str, hints: Hints) -> Parsed:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise EvidenceError(rel, f"not valid JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA_ID:
            raise EvidenceError(rel, f"JSON without schema {SCHEMA_ID!r}")
        if not isinstance(doc.get("devices"), list):
            raise EvidenceError(rel, "gpu document has no devices list")
        devices = []
        for i, raw in enumerate(doc["devices"]):
            if not isinstance(raw, dict):
                raise EvidenceError(rel, f"device {i} is not an object")
            d = empty_device(int(raw.get("index", i)))
            for k, v in raw.items():
                if isinstance(d.get(k), dict) and isinstance(v, dict):
                    d[k].update(v)
                else:
                    d[k] = v
            devices.append(d)
        samples: dict[int, list[dict[str, Any]]] = {}
        for row in (doc.get("samples") or {}).get("rows") or []:
            if isinstance(row, dict) and isinstance(row.get("index"), int):
                samples.setdefault(row["index"], []).append(row)
        xid = doc.get("xid") or {}
        for ev in xid.get("events") or []:
            for d in devices:
                if d["index"] == ev.get("gpu"):
                    d.setdefault("xids", []).append({"xid": ev.get("xid"), "t": ev.get("t")})
        host = str(doc.get("host") or hints.host or "")
        data = {"source": "nvml", "format": "nvml-json", "host": host, "devices": devices,
                "samples": samples, "driver_version": doc.get("driver_version"),
                "xid": {k: xid.get(k) for k in ("registered", "error", "window_s")},
                "cost": doc.get("cost") or {}, "ranks": doc.get("ranks") or {}}
        return Parsed(self.name, rel, data, hints.rank, host or None)

    # -- facts ----------------------------------------------------------------------------------

    def build(self, parsed: list[Parsed], facts: dict[str, Any]) -> None:
        pref = {"nvml-json": 0, "smi-q": 1, "smi-csv": 2, "smi-table": 3, "smi-dmon": 4, "smi-pmon": 5}
        merged: dict[tuple[str, str], dict[str, Any]] = {}
        formats: list[str] = []
        drivers: list[str] = []
        xid_info: dict[str, Any] = {"registered": [], "error": "", "window_s": 0.0}
        cost: dict[str, Any] = {}
        for p in sorted(parsed, key=lambda p: pref.get(p.data.get("format", ""), 9)):
            data = p.data
            host = data.get("host") or p.host or ""
            if data["format"] not in formats:
                formats.append(data["format"])
            if data.get("driver_version") and data["driver_version"] not in drivers:
                drivers.append(str(data["driver_version"]))
            for d in data["devices"]:
                d["host"] = host
                rows = (data.get("samples") or {}).get(d["index"])
                cur = self._match(merged, host, d)
                if cur is None:
                    d["sources"] = [data["format"]]
                    merged[(host, str(len(merged)))] = d
                    cur = d
                else:
                    _fill_missing(cur, d)
                    if data["format"] not in cur["sources"]:
                        cur["sources"].append(data["format"])
                if rows and "_rows" not in cur:
                    cur["_rows"] = rows  # the preferred source's samples win
                cur["label"] = device_label(cur["host"], cur["index"])
            if data["format"] == "nvml-json":
                x = data.get("xid") or {}
                xid_info["registered"] += [device_label(host, i) for i in (x.get("registered") or [])]
                if x.get("error"):
                    xid_info["error"] = f"{host}: {x['error']}" if host else str(x["error"])
                xid_info["window_s"] = max(xid_info["window_s"], float(x.get("window_s") or 0.0))
                if data.get("cost"):
                    cost[host or "local"] = data["cost"]
        devices = sorted(merged.values(), key=lambda d: (d["host"], d["index"]))
        sample_summaries = []
        for d in devices:
            rows = d.pop("_rows", None)
            summary = summarize_samples(rows) if rows else None
            if summary:
                sample_summaries.append({"label": d["label"], **summary})
                if summary["lost"]:
                    d["lost"] = True
            derive(d, summary)
        derive_peers(devices)
        self._facts(facts, devices, sample_summaries, formats, drivers, xid_info, cost)

    @staticmethod
    def _match(merged: dict[tuple[str, str], dict[str, Any]], host: str, d: dict[str, Any]) -> dict[str, Any] | None:
        """The same GPU read from another source: same host and UUID, bus id, or index.

        nvidia-smi output carries no host name; such a file joins the GPU of a named host when
        its UUID or bus id matches (one ticket usually holds one host's files)."""
        for (h, _), cur in merged.items():
            if h != host:
                if not (host == "" or h == "") or not _same_id(cur, d):
                    continue
                if host == "":
                    d["host"] = h
                else:
                    cur["host"] = host
                return cur
            if d.get("uuid") and cur.get("uuid"):
                if d["uuid"] == cur["uuid"]:
                    return cur
                continue
            if d.get("pci_bus") and cur.get("pci_bus"):
                if _bus_norm(d["pci_bus"]) == _bus_norm(cur["pci_bus"]):
                    return cur
                continue
            if d["index"] == cur["index"]:
                return cur
        return None

    def _facts(self, facts: dict[str, Any], devices: list[dict[str, Any]], sample_summaries: list[dict[str, Any]],
               formats: list[str], drivers: list[str], xid_info: dict[str, Any], cost: dict[str, Any]) -> None:
        pid_to_gpu: dict[str, list[str]] = {}
        by_rank: dict[str, dict[str, Any]] = {}
        xid_events = []
        for d in devices:
            ranks = sorted({p["rank"] for p in d["processes"] if isinstance(p.get("rank"), int)})
            d["ranks"] = ranks
            for p in d["processes"]:
                pid_to_gpu.setdefault(str(p["pid"]), []).append(d["label"])
            for ev in d.get("xids", []):
                xid_events.append({"host": d["host"], "gpu": d["label"], "xid": ev.get("xid"),
                                   "hardware": ev.get("xid") in HARDWARE_XIDS})
            d.setdefault("xids", [])
        # A rank's main GPU is where it holds the most memory: NCCL ranks often also keep a small
        # context on GPU 0 (torch.cuda calls before set_device), which is not sharing the GPU.
        primary: dict[int, tuple[int, dict[str, Any]]] = {}
        for d in devices:
            for p in d["processes"]:
                r = p.get("rank")
                if isinstance(r, int):
                    used = p.get("used_mib") or 0
                    if r not in primary or used > primary[r][0]:
                        primary[r] = (used, d)
                    ent = by_rank.setdefault(str(r), {"gpus": [], "pids": []})
                    ent["gpus"].append(d["label"])
                    if p["pid"] not in ent["pids"]:
                        ent["pids"].append(p["pid"])
        shared_map: dict[str, list[int]] = {}
        for r, (_, d) in primary.items():
            e = by_rank[str(r)]
            e.update({"primary": d["label"], "busy": d["busy"], "util": d["util_eff"],
                      "throttle_fault": d["throttle_fault"], "hw_fault": d["hw_fault"]})
            shared_map.setdefault(d["label"], []).append(r)
        by_label = {d["label"]: d for d in devices}
        shared = []
        for lab, rs in shared_map.items():
            if len(rs) < 2:
                continue
            pids = [p["pid"] for p in by_label[lab]["processes"] if p.get("rank") in rs]
            shared.append({"label": lab, "host": by_label[lab]["host"], "index": by_label[lab]["index"],
                           "ranks": sorted(rs), "pids": pids,
                           "why": [f"ranks {', '.join(map(str, sorted(rs)))} (pids {', '.join(map(str, pids))}) "
                                   "hold their main CUDA context on it"]})

        crowded = _crowded(devices)

        def rec(d: dict[str, Any], group: str, **extra: Any) -> dict[str, Any]:
            return {"label": d["label"], "host": d["host"], "index": d["index"], "uuid": d.get("uuid"),
                    "why": list(d["why"][group]), "ranks": d["ranks"], **extra}

        faulty = [rec(d, "fault", severe=d["hw_fault_severe"]) for d in devices if d["hw_fault"]]
        throttled = [rec(d, "throttle", sm=d["sm_eff"], max_sm=d["max_clocks"]["sm"], fault_reasons=d["fault_reasons"])
                     for d in devices if d["throttle_fault"] or d["slow_vs_peers"] or d["power_limit_lowered"]
                     or d["clocks_locked_low"]]
        capped = [rec(d, "info", power_w=d["power"]["draw_w"], limit_w=d["power"]["limit_w"])
                  for d in devices if d["power_capped_ok"]]
        pcie = [rec(d, "pcie", replay=d["pcie"]["replay"]) for d in devices if d["pcie_degraded"]]
        by_host: dict[str, dict[str, Any]] = {}
        for d in devices:
            h = by_host.setdefault(d["host"] or "", {"n_devices": 0, "busy": [], "hw_fault": [], "throttle_fault": []})
            h["n_devices"] += 1
            for flag in ("busy", "hw_fault", "throttle_fault"):
                if d[flag]:
                    h[flag].append(d["label"])
        facts["gpu"] = {
            "source": "nvml" if "nvml-json" in formats else "nvidia-smi",
            "sources": formats, "n_devices": len(devices), "driver_versions": drivers,
            "devices": devices, "by_host": by_host, "samples": sample_summaries,
            "pid_to_gpu": pid_to_gpu, "by_rank": by_rank, "faulty": faulty, "throttled": throttled,
            "power_capped": capped, "pcie_degraded": pcie, "shared": shared,
            "crowded": crowded, "busy_ranks": sorted(int(r) for r, e in by_rank.items() if e.get("busy")),
            "xid_events": xid_events, "xid": xid_info, "cost": cost,
        }

    # -- live -----------------------------------------------------------------------------------

    def collect(self, ctx: Any) -> None:
        nv = load_nvml()
        init_nvml(nv)
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as exc:
            shutdown_nvml(nv)
            raise ProbeFailed(f"NVML could not count the GPUs: {nvml_reason(nv, exc)}") from exc
        if not count:
            shutdown_nvml(nv)
            raise ProbeSkipped("NVML sees no GPU on this host")
        rank_of_pid = {p.pid: p.rank for p in getattr(ctx, "procs", []) if p.rank is not None}
        opts = getattr(ctx, "options", {}) or {}
        try:
            doc = collect_document(
                nv, host=ctx.host, samples=int(opts.get("gpu_samples", 0) or 0),
                interval=float(opts.get("gpu_sample_interval", 0.5)), rank_of_pid=rank_of_pid,
                deadline_s=max(1.0, float(getattr(ctx, "timeout", 10.0)) * 0.8),
                nvlink=bool(opts.get("gpu_nvlink", True)),
            )
        finally:
            shutdown_nvml(nv)
        name = "gpu.json" if not getattr(ctx, "round", 0) else f"gpu-round{ctx.round}.json"
        ctx.add(name, json.dumps(doc, indent=1), meta={
            "devices": len(doc["devices"]), "calls": doc["cost"]["calls"], "snapshot_s": doc["cost"]["snapshot_s"]})

    # -- the report -----------------------------------------------------------------------------
    def report_sections(self, facts: dict[str, Any], context: SectionContext) -> list[Section]:
        return report.sections(facts, context)


def _same_id(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Same physical GPU by UUID, else by PCI bus id (never by index alone)."""
    if a.get("uuid") and b.get("uuid"):
        return a["uuid"] == b["uuid"]
    if a.get("pci_bus") and b.get("pci_bus"):
        return _bus_norm(a["pci_bus"]) == _bus_norm(b["pci_bus"])
    return False


def _bus_norm(bus: str) -> str:
    """``00000000:18:00.0`` and ``0000:18:00.0`` name the same device."""
    dom, _, rest = bus.lower().partition(":")
    return f"{int(dom, 16) if dom.isalnum() else dom}:{rest}"


def _fill_missing(cur: dict[str, Any], new: dict[str, Any]) -> None:
    """Fill the unknowns of ``cur`` (the preferred source) from ``new``."""
    for k, v in new.items():
        if k in ("index", "host", "sources", "label"):
            continue
        c = cur.get(k)
        if isinstance(c, dict) and isinstance(v, dict):
            for kk, vv in v.items():
                if c.get(kk) is None and vv is not None:
                    c[kk] = vv
        elif (c is None or c == [] or c is False) and v not in (None, [], False):
            cur[k] = v



def _crowded(devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """GPUs where one program runs two or more compute processes while a GPU of the same host
    runs none.

    Why: a pasted nvidia-smi table carries no rank mapping, so ``gpu.shared`` cannot see ranks
    that all landed on GPU 0 (no ``set_device(local_rank)``); the shape itself tells it: N copies
    of one program on one GPU and idle GPUs beside it. Small extra contexts on GPU 0 next to each
    rank's own GPU leave no GPU idle and are not counted.
    """
    by_host: dict[str, list[dict[str, Any]]] = {}
    for d in devices:
        by_host.setdefault(d.get("host") or "", []).append(d)
    out: list[dict[str, Any]] = []
    for host, devs in by_host.items():
        idle = [d["label"] for d in devs if not d["processes"]]
        if not idle:
            continue
        for d in devs:
            names: dict[str, list[int]] = {}
            for p in d["processes"]:
                if "C" in str(p.get("type") or "C"):
                    names.setdefault(str(p.get("name") or ""), []).append(p["pid"])
            for name, pids in names.items():
                if len(pids) >= 2:
                    out.append({"label": d["label"], "host": host, "index": d["index"], "pids": pids,
                                "name": name, "idle": idle,
                                "why": [f"{len(pids)} {name or 'compute'} processes on {d['label']} "
                                        f"while {', '.join(idle)} run none"]})
    return out


PROBE = GpuProbe()
