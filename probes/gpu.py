"""GPU evidence: NVML readings taken live, and the same facts read back from ``nvidia-smi`` output.

Four sources give one normalized device record each, so the same rules work on a live host and
on the files attached to a ticket:

- live: NVML through nvidia-ml-py (``import pynvml``), written as this probe's own JSON artifact
  (schema ``mldoctor.gpu/1``), with optional short repeated sampling and Xid events;
- ``nvidia-smi -q`` text (whole or pasted sections);
- ``nvidia-smi --query-gpu=... --format=csv`` (with or without units; repeated rows from ``-l``
  become samples);
- the default ``nvidia-smi`` table.

Every NVML call can fail on its own (not supported, no permission, GPU lost): the reason is kept
per field in the device's ``errors`` map and the probe goes on. The reading is cheap (about 40
calls a GPU) because it may run on every host of a large job while the job is stuck.
"""

from __future__ import annotations

import csv
import io
import json
import re
import socket
import statistics
import time
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from doctor.evidence.contract import Hints, Parsed, Probe, ProbeFailed, ProbeSkipped, Sample
from doctor.evidence.errors import EvidenceError

SCHEMA_ID = "mldoctor.gpu/1"

# -- thresholds (named; the rules' docs quote them) -------------------------------------------

#: Power draw at or above this share of the enforced limit counts as "at the cap". NVML sets
#: SW Power Cap when the power controller holds clocks down to stay under the limit, so a GPU
#: doing that draws close to the limit (NVML clock event reasons; H100/H200 under GEMM sit at
#: 95-100 %).
POWER_AT_CAP_FRAC = 0.90
#: An enforced power limit below this share of the default limit means someone lowered it
#: (``nvidia-smi -pl``); the NVML docs' "enforced vs default" comparison.
POWER_LIMIT_LOWERED_FRAC = 0.95
#: A GPU counts as busy at or above this utilization ("a kernel was running" share; NVML).
BUSY_UTIL_PCT = 50
#: Under load, a GPU whose SM clock trails its host peers' median by more than both of these is
#: slower than its peers: GPUs of one node should stay within ~5 % (ml-engineering book) and a
#: 100-200 MHz lag under load is the alert level a vendor glossary suggests (factryze, "SM clock").
PEER_CLOCK_LAG_FRAC = 0.05
PEER_CLOCK_LAG_MHZ = 100
#: A fault reason must be active in at least this share of the samples (when sampled) to count:
#: one transient HW slowdown blip is not a throttled GPU (gpud counts slowdown events per minute
#: for the same reason).
FAULT_MIN_SHARE = 0.25
#: Degrees below the slowdown temperature at which a GPU is called hot; without thresholds, the
#: example limit of Meta's gcm health checks (84 C).
HOT_MARGIN_C = 5
HOT_DEFAULT_C = 84
#: More than this many aggregate uncorrectable SRAM/DRAM errors is "usually a reason to RMA"
#: (ml-engineering, compute/accelerator/nvidia/debug.md).
AGGREGATE_UNCORRECTED_RMA = 4
#: "Busy" (a kernel resident) yet drawing little power: NVML utilization counts time with any
#: kernel running, not SM saturation (ml-engineering debug.md). Measured on the H200 here: a
#: one-thread spinning kernel read 100 % at 124 W of 700 W (0.18); bf16 GEMM read 99 % at 693 W.
SPIN_UTIL_PCT = 90
SPIN_POWER_FRAC = 0.35
#: Memory used at or above this share of total: near full (informational; PyTorch's caching
#: allocator keeps freed memory, so a full GPU alone is not an OOM).
MEM_FULL_FRAC = 0.95
#: Xids that mean the GPU, its memory or its links failed (NVIDIA Xid catalog; gcm check-syslogs;
#: NVIDIA Health Validation). 13/31/43 are usually the application's own fault and are kept but
#: not counted as hardware.
HARDWARE_XIDS = frozenset({48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120, 121, 140, 143, 144, 145, 146, 147, 148, 149, 150, 154})

# -- clock event ("throttle") reasons: NVML bit -> canonical name (nvidia-smi's csv names) ---

REASON_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
#: Reasons that mean heat, a power brake or a hardware slowdown: a fault, not a setting.
FAULT_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")
_SMI_REASON_NAMES = {
    "idle": "gpu_idle", "gpu idle": "gpu_idle",
    "applications clocks setting": "applications_clocks_setting",
    "user defined clocks": "applications_clocks_setting",
    "sw power cap": "sw_power_cap",
    "hw slowdown": "hw_slowdown",
    "hw thermal slowdown": "hw_thermal_slowdown",
    "hw power brake slowdown": "hw_power_brake_slowdown",
    "sync boost": "sync_boost",
    "sw thermal slowdown": "sw_thermal_slowdown",
    "display clock setting": "display_clock_setting",
}

# NVML return codes -> short reasons (pynvml's own strings need the library loaded).
_NVML_REASONS = {
    1: "NVML not initialized", 2: "invalid argument", 3: "not supported", 4: "no permission",
    6: "not found", 8: "insufficient external power", 9: "driver not loaded", 10: "timeout",
    12: "NVML library not found", 13: "function not found in this driver's NVML",
    14: "corrupted infoROM", 15: "GPU is lost", 16: "GPU requires reset",
    17: "blocked by the operating system", 18: "NVML/driver version mismatch", 19: "in use",
    20: "out of memory", 21: "no data", 26: "deprecated", 27: "not ready", 28: "GPU not found",
    999: "unknown error",
}
_GPU_LOST = 15
_TIMEOUT = 10


def decode_reasons(mask: int | None) -> list[str]:
    """Names of the active clock event reasons in an NVML bitmask (unknown bits as hex)."""
    if mask is None:
        return []
    out = [name for bit, name in REASON_BITS.items() if mask & bit]
    rest = mask & ~sum(REASON_BITS)
    if rest:
        out.append(f"0x{rest:x}")
    return out


def nvml_reason(exc: BaseException) -> str:
    """A short, stable reason for an NVML failure (the code's meaning, not pynvml's string)."""
    code = getattr(exc, "value", None)
    if isinstance(code, int):
        return _NVML_REASONS.get(code, f"NVML error {code}")
    return type(exc).__name__ + (f": {exc}" if str(exc) else "")


# =============================================================================================
# Live collection through NVML
# =============================================================================================

def load_nvml() -> Any:
    """Import nvidia-ml-py; ProbeSkipped with the reason when it is not installed."""
    try:
        import pynvml  # noqa: PLC0415 - optional dependency, imported only when collecting
    except ImportError as exc:
        raise ProbeSkipped("nvidia-ml-py (import pynvml) is not installed: pip install nvidia-ml-py") from exc
    return pynvml


def init_nvml(nv: Any) -> None:
    """``nvmlInit`` with the failure turned into a precise skip or failure reason."""
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        code = getattr(exc, "value", None)
        if code == 12:
            raise ProbeSkipped("NVML library not found (libnvidia-ml.so.1): no NVIDIA driver on this host") from exc
        if code == 9:
            raise ProbeSkipped("NVIDIA kernel driver is not loaded (NVML: driver not loaded): no usable GPU on this host") from exc
        if code == 4:
            raise ProbeFailed("no permission to open the NVIDIA devices (NVML: insufficient permissions)") from exc
        if code == 18:
            raise ProbeFailed("NVML library and kernel driver versions differ (reload the driver or reboot)") from exc
        raise ProbeFailed(f"nvmlInit failed: {nvml_reason(exc)}") from exc
    except OSError as exc:  # a broken library file
        raise ProbeSkipped(f"NVML library could not be loaded ({exc})") from exc


class NvmlReader:
    """Calls NVML one field at a time, keeping each failure's reason instead of raising.

    ``calls`` and ``failed`` count every NVML call, for the cost report.
    """

    def __init__(self, nv: Any) -> None:
        self.nv = nv
        self.calls = 0
        self.failed = 0

    def get(self, errors: dict[str, str], field: str, fn_name: str, *args: Any) -> Any:
        fn = getattr(self.nv, fn_name, None)
        if fn is None:
            errors[field] = f"{fn_name} not in this nvidia-ml-py"
            return None
        self.calls += 1
        try:
            return fn(*args)
        except self.nv.NVMLError as exc:
            if getattr(exc, "value", None) != _TIMEOUT:  # an event wait that saw no event
                self.failed += 1
            errors[field] = nvml_reason(exc)
            if getattr(exc, "value", None) == _GPU_LOST:
                raise GpuLost(field) from exc
            return None
        except Exception as exc:  # a binding bug must cost one field, never the probe
            self.failed += 1
            errors[field] = f"{type(exc).__name__}: {str(exc)[:120]}"
            return None


class GpuLost(Exception):
    """NVML said the GPU fell off the bus; the device's remaining fields are not read."""


def _text(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


def _mw_to_w(v: Any) -> float | None:
    return round(v / 1000.0, 1) if isinstance(v, (int, float)) else None


def _mib(v: Any) -> int | None:
    return int(v // (1024 * 1024)) if isinstance(v, (int, float)) else None


def empty_device(index: int) -> dict[str, Any]:
    """The normalized device record every source fills (unknown values stay None)."""
    return {
        "index": index, "uuid": None, "name": None, "pci_bus": None, "host": "",
        "clocks": {"sm": None, "mem": None, "graphics": None},
        "max_clocks": {"sm": None, "mem": None, "graphics": None},
        "app_clocks": {"graphics": None, "mem": None},
        "reasons": [], "reasons_mask": None, "pstate": None,
        "temp": {"gpu": None, "memory": None, "slowdown": None, "shutdown": None, "max_operating": None},
        "power": {"draw_w": None, "limit_w": None, "default_limit_w": None},
        "util": {"gpu": None, "memory": None},
        "mem": {"used_mib": None, "total_mib": None},
        "ecc": {"mode": None, "volatile_uncorrected": None, "aggregate_uncorrected": None,
                "volatile_corrected": None, "aggregate_corrected": None, "sram_threshold_exceeded": None},
        "remapped_rows": {"correctable": None, "uncorrectable": None, "pending": None, "failure": None},
        "retired_pages": {"sbe": None, "dbe": None, "pending": None},
        "pcie": {"gen": None, "gen_max": None, "width": None, "width_max": None, "replay": None},
        "nvlink": {"links": None, "active": None, "errors": {}, "error_total": None},
        "processes": [], "mig": {"current": None, "pending": None},
        "violation_ns": {"power": None, "thermal": None},
        "lost": False, "errors": {},
    }


#: Values that never change while the driver is loaded (max clocks, thresholds, default power
#: limit, identity), kept per process: NVML answers some of them slowly (nvmlDeviceGetMaxClockInfo
#: took 1.7 ms a call on the H200), and follow-up snapshots should not pay twice.
_STATIC: dict[tuple[int, str], dict[str, Any]] = {}

# One nvmlDeviceGetFieldValues call for the counters, each with its own return code. The ECC
# totals are NVML's single-bit (corrected) / double-bit (uncorrected) totals.
_FIELD_IDS: dict[str, int] = {
    "temp.memory": 82, "ecc.mode": 1,
    "ecc.volatile_corrected": 3, "ecc.volatile_uncorrected": 4,
    "ecc.aggregate_corrected": 5, "ecc.aggregate_uncorrected": 6,
    "pcie.replay": 94, "remapped_rows.correctable": 142, "remapped_rows.uncorrectable": 143,
    "remapped_rows.pending": 144, "remapped_rows.failure": 145,
    "nvlink.links": 91, "nvlink.crc_flit": 38, "nvlink.crc_data": 45, "nvlink.replay": 52,
    "nvlink.recovery": 59,
}
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def read_device(rd: NvmlReader, index: int, rank_of_pid: dict[int, int] | None = None,
                nvlink: bool = True, fields: bool = True, violation: bool = False) -> tuple[dict[str, Any], Any]:
    """One GPU's snapshot; returns (record, handle or None).

    ``fields`` reads the counters in one batched call (falling back to one call each when the
    batch is refused); ``violation`` adds the cumulative power/thermal violation time, which
    only means something as a difference over a sampling window.
    """
    d = empty_device(index)
    err: dict[str, str] = d["errors"]
    try:
        h = rd.get(err, "handle", "nvmlDeviceGetHandleByIndex", index)
    except GpuLost:
        d["lost"] = True
        return d, None
    if h is None:
        return d, None
    try:
        _read_fields(rd, rd.nv, h, d, err, rank_of_pid or {}, nvlink, fields, violation)
    except GpuLost as lost:
        d["lost"] = True
        err.setdefault("lost_at", str(lost))
    return d, h


def _read_static(rd: NvmlReader, nv: Any, h: Any, d: dict[str, Any], err: dict[str, str]) -> None:
    g = rd.get
    d["uuid"] = _text(g(err, "uuid", "nvmlDeviceGetUUID", h))
    key = (d["index"], d["uuid"] or "")
    cached = _STATIC.get(key) if d["uuid"] else None
    if cached is not None:
        for k, v in cached.items():
            if isinstance(v, dict):
                d[k].update(v)
            else:
                d[k] = v
        return
    st_err: dict[str, str] = {}
    d["name"] = _text(g(st_err, "name", "nvmlDeviceGetName", h))
    pci = g(st_err, "pci_bus", "nvmlDeviceGetPciInfo", h)
    if pci is not None:
        d["pci_bus"] = _text(getattr(pci, "busId", None) or getattr(pci, "busIdLegacy", None))
    for k, ctype in (("sm", nv.NVML_CLOCK_SM), ("mem", nv.NVML_CLOCK_MEM)):
        d["max_clocks"][k] = g(st_err, f"max_clocks.{k}", "nvmlDeviceGetMaxClockInfo", h, ctype)
    d["temp"]["slowdown"] = g(st_err, "temp.slowdown", "nvmlDeviceGetTemperatureThreshold", h,
                              nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
    d["temp"]["max_operating"] = g(st_err, "temp.max_operating", "nvmlDeviceGetTemperatureThreshold", h,
                                   nv.NVML_TEMPERATURE_THRESHOLD_GPU_MAX)
    d["power"]["default_limit_w"] = _mw_to_w(g(st_err, "power.default_limit_w",
                                               "nvmlDeviceGetPowerManagementDefaultLimit", h))
    err.update(st_err)
    if d["uuid"] and not st_err:
        _STATIC[key] = {"name": d["name"], "pci_bus": d["pci_bus"], "max_clocks": dict(d["max_clocks"]),
                        "temp": {k: d["temp"][k] for k in ("slowdown", "max_operating")},
                        "power": {"default_limit_w": d["power"]["default_limit_w"]}}


def _field_value(v: Any) -> Any:
    member = _VALUE_MEMBER.get(int(getattr(v, "valueType", 1)), "uiVal")
    return getattr(v.value, member)


def _read_batch(rd: NvmlReader, h: Any, d: dict[str, Any], err: dict[str, str]) -> bool:
    """The counters through one nvmlDeviceGetFieldValues call; False when the call is refused."""
    names = list(_FIELD_IDS)
    e: dict[str, str] = {}
    vals = rd.get(e, "fields", "nvmlDeviceGetFieldValues", h, [_FIELD_IDS[n] for n in names])
    if vals is None:
        return False
    got: dict[str, Any] = {}
    for name, v in zip(names, vals, strict=False):
        code = int(getattr(v, "nvmlReturn", 0))
        if code:
            got[name] = None
            if not name.startswith("nvlink."):
                err[name] = _NVML_REASONS.get(code, f"NVML error {code}")
            continue
        try:
            got[name] = _field_value(v)
        except (AttributeError, TypeError):
            got[name] = None
            err[name] = "unreadable field value"
    d["temp"]["memory"] = int(got["temp.memory"]) if got.get("temp.memory") is not None else None
    if got.get("ecc.mode") is not None:
        d["ecc"]["mode"] = "enabled" if got["ecc.mode"] else "disabled"
    for k in ("volatile_corrected", "volatile_uncorrected", "aggregate_corrected", "aggregate_uncorrected"):
        v = got.get(f"ecc.{k}")
        d["ecc"][k] = int(v) if v is not None and d["ecc"]["mode"] != "disabled" else None
    d["pcie"]["replay"] = int(got["pcie.replay"]) if got.get("pcie.replay") is not None else None
    rr = {k: got.get(f"remapped_rows.{k}") for k in ("correctable", "uncorrectable", "pending", "failure")}
    d["remapped_rows"] = {"correctable": _opt_int(rr["correctable"]), "uncorrectable": _opt_int(rr["uncorrectable"]),
                          "pending": None if rr["pending"] is None else bool(rr["pending"]),
                          "failure": None if rr["failure"] is None else bool(rr["failure"])}
    links = got.get("nvlink.links")
    if links:
        totals = {k: int(got[f"nvlink.{k}"]) for k in ("replay", "recovery", "crc_flit", "crc_data")
                  if got.get(f"nvlink.{k}") is not None}
        d["nvlink"] = {"links": int(links), "active": None, "errors": totals,
                       "error_total": sum(totals.values()) if totals else None}
    else:
        err["nvlink"] = "no NVLink links reported"
    return True


def _opt_int(v: Any) -> int | None:
    return int(v) if v is not None else None


def _read_fields(rd: NvmlReader, nv: Any, h: Any, d: dict[str, Any], err: dict[str, str],
                 rank_of_pid: dict[int, int], nvlink: bool, fields: bool, violation: bool) -> None:
    g = rd.get
    _read_static(rd, nv, h, d, err)
    for key, ctype in (("sm", nv.NVML_CLOCK_SM), ("mem", nv.NVML_CLOCK_MEM), ("graphics", nv.NVML_CLOCK_GRAPHICS)):
        d["clocks"][key] = g(err, f"clocks.{key}", "nvmlDeviceGetClockInfo", h, ctype)
    reasons_fn = ("nvmlDeviceGetCurrentClocksEventReasons" if hasattr(nv, "nvmlDeviceGetCurrentClocksEventReasons")
                  else "nvmlDeviceGetCurrentClocksThrottleReasons")
    mask = g(err, "reasons", reasons_fn, h)
    if isinstance(mask, int):
        d["reasons_mask"] = mask
        d["reasons"] = decode_reasons(mask)
    ps = g(err, "pstate", "nvmlDeviceGetPerformanceState", h)
    d["pstate"] = f"P{ps}" if isinstance(ps, int) and ps < 32 else None
    d["temp"]["gpu"] = g(err, "temp.gpu", "nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU)
    d["power"]["draw_w"] = _mw_to_w(g(err, "power.draw_w", "nvmlDeviceGetPowerUsage", h))
    d["power"]["limit_w"] = _mw_to_w(g(err, "power.limit_w", "nvmlDeviceGetEnforcedPowerLimit", h))
    util = g(err, "util", "nvmlDeviceGetUtilizationRates", h)
    if util is not None:
        d["util"] = {"gpu": int(util.gpu), "memory": int(util.memory)}
    mem = g(err, "mem", "nvmlDeviceGetMemoryInfo", h)
    if mem is not None:
        d["mem"] = {"used_mib": _mib(mem.used), "total_mib": _mib(mem.total)}
    batched = fields and _read_batch(rd, h, d, err)
    if not batched:
        _read_counters_one_by_one(rd, nv, h, d, err, nvlink)
    if d["remapped_rows"]["pending"] is None and d["remapped_rows"]["failure"] is None:
        # Pre-Ampere parts retire pages instead of remapping rows (NOT_SUPPORTED on A100+).
        sbe = g(err, "retired_pages.sbe", "nvmlDeviceGetRetiredPages", h,
                nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        dbe = g(err, "retired_pages.dbe", "nvmlDeviceGetRetiredPages", h,
                nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        pend = g(err, "retired_pages.pending", "nvmlDeviceGetRetiredPagesPendingStatus", h)
        d["retired_pages"] = {"sbe": len(sbe) if sbe is not None else None,
                              "dbe": len(dbe) if dbe is not None else None,
                              "pending": bool(pend) if pend is not None else None}
    pc = d["pcie"]
    pc["gen"] = g(err, "pcie.gen", "nvmlDeviceGetCurrPcieLinkGeneration", h)
    pc["gen_max"] = g(err, "pcie.gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", h)
    pc["width"] = g(err, "pcie.width", "nvmlDeviceGetCurrPcieLinkWidth", h)
    pc["width_max"] = g(err, "pcie.width_max", "nvmlDeviceGetMaxPcieLinkWidth", h)
    mig = g(err, "mig", "nvmlDeviceGetMigMode", h)
    if mig is not None:
        d["mig"] = {"current": bool(mig[0]), "pending": bool(mig[1])}
    if violation:
        read_violation(rd, h, d["violation_ns"], err)
    procs = g(err, "processes", "nvmlDeviceGetComputeRunningProcesses", h)
    for p in procs or []:
        pid = int(p.pid)
        used = getattr(p, "usedGpuMemory", None)
        rec: dict[str, Any] = {"pid": pid, "used_mib": _mib(used) if isinstance(used, int) else None}
        if pid in rank_of_pid:
            rec["rank"] = rank_of_pid[pid]
        d["processes"].append(rec)
    if nvlink and batched and d["nvlink"]["links"]:
        _read_nvlink(rd, nv, h, d, err, states_only=True)


def read_violation(rd: NvmlReader, h: Any, out: dict[str, Any], err: dict[str, str]) -> None:
    """Cumulative ns the power / thermal policy held clocks down (nvmlDeviceGetViolationStatus)."""
    nv = rd.nv
    for key, pol in (("power", nv.NVML_PERF_POLICY_POWER), ("thermal", nv.NVML_PERF_POLICY_THERMAL)):
        vt = rd.get(err, f"violation_ns.{key}", "nvmlDeviceGetViolationStatus", h, pol)
        if vt is not None:
            out[key] = int(getattr(vt, "violationTime", 0))


def _read_counters_one_by_one(rd: NvmlReader, nv: Any, h: Any, d: dict[str, Any], err: dict[str, str],
                              nvlink: bool) -> None:
    """The per-call path, for drivers or bindings that refuse the batched field read."""
    g = rd.get
    fv = g(err, "temp.memory", "nvmlDeviceGetFieldValues", h, [nv.NVML_FI_DEV_MEMORY_TEMP])
    if fv is not None:
        try:
            v = fv[0]
            if getattr(v, "nvmlReturn", 0) == 0:
                d["temp"]["memory"] = int(v.value.uiVal)
            else:
                err["temp.memory"] = _NVML_REASONS.get(v.nvmlReturn, f"NVML error {v.nvmlReturn}")
        except (AttributeError, IndexError, TypeError):
            err["temp.memory"] = "unreadable field value"
    ecc = g(err, "ecc.mode", "nvmlDeviceGetEccMode", h)
    if ecc is not None:
        d["ecc"]["mode"] = "enabled" if ecc[0] else "disabled"
        if ecc[0]:
            U, C = nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED
            V, A = nv.NVML_VOLATILE_ECC, nv.NVML_AGGREGATE_ECC
            for key, et, ct in (("volatile_uncorrected", U, V), ("aggregate_uncorrected", U, A),
                                ("volatile_corrected", C, V), ("aggregate_corrected", C, A)):
                d["ecc"][key] = g(err, f"ecc.{key}", "nvmlDeviceGetTotalEccErrors", h, et, ct)
    rr = g(err, "remapped_rows", "nvmlDeviceGetRemappedRows", h)
    if rr is not None:
        d["remapped_rows"] = {"correctable": rr[0], "uncorrectable": rr[1], "pending": bool(rr[2]), "failure": bool(rr[3])}
    d["pcie"]["replay"] = g(err, "pcie.replay", "nvmlDeviceGetPcieReplayCounter", h)
    if nvlink:
        _read_nvlink(rd, nv, h, d, err)


_NVLINK_COUNTERS = (("replay", 0), ("recovery", 1), ("crc_flit", 2), ("crc_data", 3))


def _read_nvlink(rd: NvmlReader, nv: Any, h: Any, d: dict[str, Any], err: dict[str, str],
                 states_only: bool = False) -> None:
    """Link states (and, without the batch, DL error counters); stops at the first missing link."""
    links = active = 0
    totals: dict[str, int] = {}
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        probe_err: dict[str, str] = {}
        state = rd.get(probe_err, "nvlink", "nvmlDeviceGetNvLinkState", h, link)
        if state is None:
            if link == 0:
                err["nvlink"] = probe_err.get("nvlink", "unavailable")
            break
        links += 1
        if not state:
            continue
        active += 1
        if states_only:
            continue
        for name, counter in _NVLINK_COUNTERS:
            v = rd.get(err, f"nvlink.{name}", "nvmlDeviceGetNvLinkErrorCounter", h, link, counter)
            if isinstance(v, int):
                totals[name] = totals.get(name, 0) + v
    if states_only:
        if links:
            d["nvlink"]["links"] = links
            d["nvlink"]["active"] = active
        return
    if links:
        d["nvlink"] = {"links": links, "active": active, "errors": totals,
                       "error_total": sum(totals.values()) if totals else None}


def read_sample(rd: NvmlReader, h: Any, index: int, t: float) -> dict[str, Any]:
    """The few fast-moving readings repeated while sampling."""
    nv = rd.nv
    err: dict[str, str] = {}
    s: dict[str, Any] = {"t": round(t, 3), "index": index}
    try:
        s["sm"] = rd.get(err, "sm", "nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_SM)
        u = rd.get(err, "util", "nvmlDeviceGetUtilizationRates", h)
        s["util"] = int(u.gpu) if u is not None else None
        s["power_w"] = _mw_to_w(rd.get(err, "power", "nvmlDeviceGetPowerUsage", h))
        fn = ("nvmlDeviceGetCurrentClocksEventReasons" if hasattr(nv, "nvmlDeviceGetCurrentClocksEventReasons")
              else "nvmlDeviceGetCurrentClocksThrottleReasons")
        s["reasons_mask"] = rd.get(err, "reasons", fn, h)
        s["temp"] = rd.get(err, "temp", "nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU)
    except GpuLost:
        s["lost"] = True
    if err:
        s["errors"] = err
    return s


class _XidWatch:
    """Registers for Xid critical-error events; NVML delivers only those after registration."""

    def __init__(self, rd: NvmlReader, handles: dict[int, Any]) -> None:
        self.rd = rd
        self.events: list[dict[str, Any]] = []
        self.error = ""
        self.registered: list[int] = []
        self.set = None
        nv = rd.nv
        e: dict[str, str] = {}
        self.set = rd.get(e, "xid", "nvmlEventSetCreate")
        if self.set is None:
            self.error = e.get("xid", "event set not available")
            return
        for idx, h in handles.items():
            e = {}
            try:
                rd.get(e, "xid", "nvmlDeviceRegisterEvents", h, nv.nvmlEventTypeXidCriticalError, self.set)
            except GpuLost:
                e["xid"] = "GPU is lost"
            if "xid" in e:
                self.error = f"GPU {idx}: {e['xid']}"
            else:
                self.registered.append(idx)

    def wait(self, seconds: float) -> None:
        """Wait up to ``seconds`` for Xid events (the sampling interval doubles as this wait)."""
        if self.set is None or not self.registered:
            if seconds > 0:
                time.sleep(seconds)
            return
        deadline = time.monotonic() + seconds
        while True:
            left_ms = int(max(0.0, deadline - time.monotonic()) * 1000)
            e: dict[str, str] = {}
            try:
                data = self.rd.get(e, "xid", "nvmlEventSetWait", self.set, left_ms)
            except GpuLost:
                data = None
            if data is None:
                if e.get("xid") not in (None, "timeout"):
                    self.error = e["xid"]
                    rest = deadline - time.monotonic()
                    if rest > 0:
                        time.sleep(rest)
                return
            ie: dict[str, str] = {}
            try:
                idx = self.rd.get(ie, "index", "nvmlDeviceGetIndex", data.device)
            except GpuLost:
                idx = None
            self.events.append({"gpu": idx, "xid": int(data.eventData), "t": round(time.time(), 3)})
            if time.monotonic() >= deadline:
                return

    def close(self) -> None:
        if self.set is not None:
            self.rd.get({}, "xid", "nvmlEventSetFree", self.set)


def collect_document(nv: Any, *, host: str | None = None, samples: int = 0, interval: float = 0.5,
                     rank_of_pid: dict[int, int] | None = None, deadline_s: float = 30.0,
                     nvlink: bool = True, xid: bool = True, fields: bool = True) -> dict[str, Any]:
    """Read every GPU once (and ``samples`` more times for the fast-moving fields) into the
    probe's JSON document. ``nv`` is an initialized pynvml-like module."""
    t_start = time.perf_counter()
    rd = NvmlReader(nv)
    glob: dict[str, str] = {}
    doc: dict[str, Any] = {
        "schema": SCHEMA_ID, "source": "nvml", "host": host or socket.gethostname(),
        "time": round(time.time(), 3),
        "driver_version": _text(rd.get(glob, "driver_version", "nvmlSystemGetDriverVersion")),
        "nvml_version": _text(rd.get(glob, "nvml_version", "nvmlSystemGetNVMLVersion")),
        "cuda_driver_version": rd.get(glob, "cuda_driver_version", "nvmlSystemGetCudaDriverVersion"),
        "ranks": {str(pid): r for pid, r in (rank_of_pid or {}).items()},
    }
    count = rd.get(glob, "device_count", "nvmlDeviceGetCount")
    doc["device_count"] = count
    devices: list[dict[str, Any]] = []
    handles: dict[int, Any] = {}
    for i in range(count or 0):
        d, h = read_device(rd, i, rank_of_pid, nvlink=nvlink, fields=fields, violation=samples > 0)
        devices.append(d)
        if h is not None and not d["lost"]:
            handles[i] = h
    doc["devices"] = devices
    t_snap = time.perf_counter() - t_start
    calls_snapshot = rd.calls
    rows: list[dict[str, Any]] = []
    watch = _XidWatch(rd, handles) if xid and handles else None
    t_samp0 = time.perf_counter()
    if samples > 0 and handles:
        t0 = time.monotonic()
        first_viol = {i: dict(devices[i]["violation_ns"]) for i in handles}
        for k in range(samples):
            now = time.monotonic() - t0
            for i, h in list(handles.items()):
                s = read_sample(rd, h, i, now)
                rows.append(s)
                if s.get("lost"):
                    handles.pop(i)
                    devices[i]["lost"] = True
            if k + 1 < samples:
                if time.perf_counter() - t_start + interval > deadline_s:
                    glob["samples"] = f"stopped after {k + 1} of {samples} samples: time budget"
                    break
                if watch:
                    watch.wait(interval)
                elif interval > 0:
                    time.sleep(interval)
        window = time.monotonic() - t0
        for i, h in handles.items():
            end: dict[str, Any] = {}
            try:
                read_violation(rd, h, end, {})
            except GpuLost:
                continue
            share = {}
            for key, v in end.items():
                start = first_viol[i].get(key)
                if start is not None and window > 0:
                    share[key] = round(min(1.0, max(0.0, (v - start) / (window * 1e9))), 3)
            devices[i]["violation_share"] = share
        doc["samples"] = {"n": samples, "interval_s": interval, "window_s": round(window, 3), "rows": rows}
    elif watch:
        watch.wait(0.0)
    if watch is not None:
        watch.close()
        doc["xid"] = {"registered": watch.registered, "error": watch.error, "events": watch.events,
                      "window_s": doc.get("samples", {}).get("window_s", 0.0)}
    else:
        doc["xid"] = {"registered": [], "error": "not requested" if not xid else "no usable GPU", "events": [],
                      "window_s": 0.0}
    doc["errors"] = glob
    doc["cost"] = {
        "calls": rd.calls, "failed_calls": rd.failed, "calls_snapshot": calls_snapshot,
        "snapshot_s": round(t_snap, 5), "sampling_s": round(time.perf_counter() - t_samp0, 5),
        "total_s": round(time.perf_counter() - t_start, 5),
    }
    return doc


# =============================================================================================
# nvidia-smi parsers
# =============================================================================================

_NUM = re.compile(r"[-+]?\d+(?:\.\d+)?")
_NA = {"n/a", "[n/a]", "na", "", "not supported", "[not supported]", "unknown error", "[unknown error]",
       "requested functionality has been deprecated", "[requested functionality has been deprecated]",
       "insufficient permissions", "[insufficient permissions]", "err!", "[gpu is lost]", "gpu is lost",
       "no data", "[no data]"}


def _num(value: str | None) -> float | None:
    if value is None:
        return None
    v = value.strip()
    if v.lower() in _NA:
        return None
    m = _NUM.search(v.replace(",", ""))
    return float(m.group(0)) if m else None


def _int(value: str | None) -> int | None:
    n = _num(value)
    return int(n) if n is not None else None


def _yes(value: str | None) -> bool | None:
    if value is None:
        return None
    v = value.strip().lower()
    if v in ("yes", "active", "enabled", "true", "1"):
        return True
    if v in ("no", "not active", "disabled", "false", "0", "none"):
        return False
    return None


def _na_reason(value: str | None) -> str | None:
    """Why an nvidia-smi value is missing, when it says so."""
    if value is None:
        return None
    v = value.strip().strip("[]").lower()
    if v in ("n/a", "na"):
        return "not available"
    if v in ("not supported", "unknown error", "insufficient permissions", "gpu is lost", "no data", "err!"):
        return {"err!": "error reading the value"}.get(v, v)
    return None


# -- nvidia-smi -q ---------------------------------------------------------------------------

_Q_LINE = re.compile(r"^(\s*)(\S.*?)\s+:\s?(.*)$")
_Q_GPU = re.compile(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_Q_PADDED = re.compile(r"^\s*[A-Za-z][\w .()/+-]*?\S\s{2,}: ", re.M)
_Q_KEYS = re.compile(r"^\s*(Product Name|GPU UUID|Clocks (?:Throttle|Event) Reasons|Remapped Rows|FB Memory Usage|"
                     r"Retired Pages|ECC Errors|GPU Power Readings|Power Readings|Max Clocks|Attached GPUs|"
                     r"Performance State)\b", re.M)


class Node:
    """One line of ``nvidia-smi -q``: a key, its value (None for a section) and its children."""

    __slots__ = ("key", "value", "children", "indent")

    def __init__(self, key: str, value: str | None, indent: int) -> None:
        self.key = key
        self.value = value
        self.indent = indent
        self.children: list[Node] = []

    def find(self, *names: str) -> Node | None:
        low = [n.lower() for n in names]
        for c in self.children:
            if c.key.lower() in low:
                return c
        return None

    def path(self, *parts: str | tuple[str, ...]) -> Node | None:
        cur: Node | None = self
        for p in parts:
            if cur is None:
                return None
            cur = cur.find(*(p if isinstance(p, tuple) else (p,)))
        return cur

    def val(self, *parts: str | tuple[str, ...]) -> str | None:
        n = self.path(*parts)
        return n.value if n is not None else None


def parse_tree(text: str) -> Node:
    """Indentation tree of ``Key : Value`` lines; lines with no ``:`` are section headers."""
    root = Node("", None, -1)
    stack = [root]
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or line.strip().startswith("=====") or line.lstrip().startswith(("```", "...")):
            continue
        m = _Q_LINE.match(line)
        if m:
            indent, key, value = len(m.group(1)), m.group(2).strip(), m.group(3).strip()
        else:
            indent, key, value = len(line) - len(line.lstrip()), line.strip(), None
        while stack[-1].indent >= indent:
            stack.pop()
        node = Node(key, value, indent)
        stack[-1].children.append(node)
        stack.append(node)
    return root


def parse_smi_q(text: str) -> dict[str, Any]:
    """Devices from ``nvidia-smi -q`` text (the whole report, or pasted sections of one GPU)."""
    root = parse_tree(text)
    gpu_nodes = [c for c in root.children if _Q_GPU.match(c.key)]
    if not gpu_nodes:
        # Pasted sections with no "GPU 0000:..." header: one device, its sections at the top.
        if not any(_Q_KEYS.match(c.key) for c in root.children):
            raise ValueError("no nvidia-smi -q sections found")
        gpu_nodes = [root]
    devices = []
    for i, g in enumerate(gpu_nodes):
        d = empty_device(i)
        m = _Q_GPU.match(g.key)
        if m:
            d["pci_bus"] = m.group(1)
        _fill_from_q(d, g)
        devices.append(d)
    return {"driver_version": root.val("Driver Version"), "cuda_version": root.val("CUDA Version"),
            "timestamp": root.val("Timestamp"), "devices": devices}


def _fill_from_q(d: dict[str, Any], g: Node) -> None:
    err = d["errors"]

    def num(field: str, *parts: str | tuple[str, ...]) -> float | None:
        raw = g.val(*parts)
        why = _na_reason(raw)
        if why and why != "not available":
            err[field] = why
        if raw is not None and raw.strip().lower() in ("gpu is lost", "[gpu is lost]"):
            d["lost"] = True
        return _num(raw)

    d["name"] = g.val("Product Name") or d["name"]
    d["uuid"] = g.val("GPU UUID") or d["uuid"]
    bus = g.val("PCI", "Bus Id")
    if bus:
        d["pci_bus"] = bus
    d["mig"]["current"] = _yes(g.val("MIG Mode", "Current"))
    d["mig"]["pending"] = _yes(g.val("MIG Mode", "Pending"))
    link = ("PCI", "GPU Link Info")
    d["pcie"]["gen_max"] = _int(g.val(*link, "PCIe Generation", "Max"))
    d["pcie"]["gen"] = _int(g.val(*link, "PCIe Generation", "Current"))
    d["pcie"]["width_max"] = _int(g.val(*link, "Link Width", "Max"))
    d["pcie"]["width"] = _int(g.val(*link, "Link Width", "Current"))
    d["pcie"]["replay"] = _int(g.val("PCI", "Replays Since Reset") or g.val("PCI", "Replays"))
    d["pstate"] = g.val("Performance State") or None
    reasons = g.find("Clocks Event Reasons", "Clocks Throttle Reasons", "Clocks Throttle Reason")
    if reasons is not None:
        active: list[str] = []
        for n in _walk(reasons):
            name = _SMI_REASON_NAMES.get(n.key.lower())
            if name and _yes(n.value):
                active.append(name)
        d["reasons"] = [r for r in REASON_BITS.values() if r in active]
    counters = g.find("Clocks Event Reasons Counters", "Clocks Throttle Reasons Counters")
    if counters is not None:
        # Cumulative microseconds each policy held the clocks down since the driver loaded.
        power_us = _num(counters.val("SW Power Capping"))
        thermal = [_num(counters.val(k)) for k in ("SW Thermal Slowdown", "HW Thermal Slowdown")]
        d["violation_ns"]["power"] = int(power_us * 1000) if power_us is not None else None
        if any(t is not None for t in thermal):
            d["violation_ns"]["thermal"] = int(sum(t or 0 for t in thermal) * 1000)
    d["mem"]["total_mib"] = _int(g.val("FB Memory Usage", "Total"))
    d["mem"]["used_mib"] = _int(g.val("FB Memory Usage", "Used"))
    d["util"]["gpu"] = _int(g.val("Utilization", "Gpu"))
    d["util"]["memory"] = _int(g.val("Utilization", "Memory"))
    mode = g.val("ECC Mode", "Current")
    d["ecc"]["mode"] = {True: "enabled", False: "disabled"}.get(_yes(mode)) if mode else None
    errs = g.find("ECC Errors")
    if errs is not None:
        for scope in ("Volatile", "Aggregate"):
            node = errs.find(scope)
            if node is None:
                continue
            unc, cor = _ecc_sums(node)
            d["ecc"][f"{scope.lower()}_uncorrected"] = unc
            d["ecc"][f"{scope.lower()}_corrected"] = cor
            thr = node.find("SRAM Threshold Exceeded")
            if thr is not None:
                d["ecc"]["sram_threshold_exceeded"] = _yes(thr.value)
    rp = g.find("Retired Pages")
    if rp is not None:
        d["retired_pages"] = {
            "sbe": _retired_count(rp.find("Single Bit ECC")),
            "dbe": _retired_count(rp.find("Double Bit ECC")),
            "pending": _yes(rp.val(("Pending Page Blacklist", "Pending Page Retirement", "Pending"))),
        }
    rr = g.find("Remapped Rows")
    if rr is not None:
        d["remapped_rows"] = {
            "correctable": _int(rr.val("Correctable Error")),
            "uncorrectable": _int(rr.val("Uncorrectable Error")),
            "pending": _yes(rr.val("Pending")),
            "failure": _yes(rr.val("Remapping Failure Occurred")),
        }
    t = d["temp"]
    t["gpu"] = num("temp.gpu", "Temperature", "GPU Current Temp")
    t["memory"] = num("temp.memory", "Temperature", "Memory Current Temp")
    t["slowdown"] = num("temp.slowdown", "Temperature", "GPU Slowdown Temp")
    t["shutdown"] = num("temp.shutdown", "Temperature", "GPU Shutdown Temp")
    t["max_operating"] = num("temp.max_operating", "Temperature", "GPU Max Operating Temp")
    for k in list(t):
        t[k] = int(t[k]) if t[k] is not None else None
    pw = ("GPU Power Readings", "Power Readings")
    d["power"]["draw_w"] = num("power.draw_w", pw, ("Power Draw", "Average Power Draw", "Instantaneous Power Draw"))
    d["power"]["limit_w"] = num("power.limit_w", pw, ("Current Power Limit", "Enforced Power Limit", "Power Limit"))
    d["power"]["default_limit_w"] = num("power.default_limit_w", pw, ("Default Power Limit",))
    for key, name in (("graphics", "Graphics"), ("sm", "SM"), ("mem", "Memory")):
        v = g.val("Clocks", name)
        d["clocks"][key] = _int(v)
        d["max_clocks"][key] = _int(g.val("Max Clocks", name))
    d["app_clocks"]["graphics"] = _int(g.val("Applications Clocks", "Graphics"))
    d["app_clocks"]["mem"] = _int(g.val("Applications Clocks", "Memory"))
    procs = g.find("Processes")
    if procs is not None:
        d["processes"] = _q_processes(procs)
    if (g.val("GPU Reset Status", "Reset Required") or "").strip().lower() == "yes":
        err["reset_required"] = "nvidia-smi says a GPU reset is required"


def _exe_name(value: str | None) -> str:
    """The executable's base name only: nvidia-smi prints a path, never arguments, but keep less."""
    v = (value or "").strip().split()[0] if (value or "").strip() else ""
    return v.rsplit("/", 1)[-1][:64]


def _walk(node: Node) -> list[Node]:
    out: list[Node] = []
    for c in node.children:
        out.append(c)
        out.extend(_walk(c))
    return out


def _ecc_sums(scope: Node) -> tuple[int | None, int | None]:
    """(uncorrected, corrected) for one ECC scope, old (Single/Double Bit) or new (SRAM/DRAM) layout."""
    unc = cor = None
    old_double = scope.find("Double Bit")
    old_single = scope.find("Single Bit")
    if old_double is not None or old_single is not None:
        if old_double is not None:
            unc = _int(old_double.val("Total"))
        if old_single is not None:
            cor = _int(old_single.val("Total"))
        return unc, cor
    for c in scope.children:
        k = c.key.lower()
        v = _int(c.value)
        if v is None or "threshold" in k or "sources" in k:
            continue
        if "uncorrectable" in k:
            unc = (unc or 0) + v
        elif "correctable" in k:
            cor = (cor or 0) + v
    return unc, cor


def _retired_count(node: Node | None) -> int | None:
    if node is None:
        return None
    if node.value is not None and node.value.strip():
        return _int(node.value)
    return _int(node.val("Count"))


def _q_processes(node: Node) -> list[dict[str, Any]]:
    if node.value and node.value.strip().lower() in ("none", "no running processes found"):
        return []
    out: list[dict[str, Any]] = []
    cur: dict[str, Any] | None = None

    def take(n: Node) -> None:
        nonlocal cur
        k = n.key.lower()
        if k == "process id":
            cur = {"pid": _int(n.value), "used_mib": None}
            out.append(cur)
        elif cur is not None and k == "name":
            cur["name"] = _exe_name(n.value)
        elif cur is not None and k == "type":
            cur["type"] = (n.value or "").strip()
        elif cur is not None and k == "used gpu memory":
            cur["used_mib"] = _int(n.value)
        for c in n.children:
            take(c)

    for c in node.children:
        take(c)
    return [p for p in out if p["pid"] is not None]


# -- nvidia-smi --query-gpu csv ---------------------------------------------------------------

_CSV_FIELDS: dict[str, tuple[str, ...]] = {
    # canonical -> accepted header names (units in brackets are stripped first)
    "index": ("index",), "name": ("name", "gpu_name"), "uuid": ("uuid", "gpu_uuid"),
    "pci_bus": ("pci.bus_id", "gpu_bus_id"), "timestamp": ("timestamp",), "pstate": ("pstate",),
    "clocks.sm": ("clocks.sm", "clocks.current.sm"), "clocks.mem": ("clocks.mem", "clocks.current.memory"),
    "clocks.graphics": ("clocks.gr", "clocks.current.graphics"),
    "max_clocks.sm": ("clocks.max.sm", "clocks.max.streaming_multiprocessor"),
    "max_clocks.mem": ("clocks.max.mem", "clocks.max.memory"),
    "max_clocks.graphics": ("clocks.max.gr", "clocks.max.graphics"),
    "app_clocks.graphics": ("clocks.applications.graphics", "clocks.applications.gr"),
    "app_clocks.mem": ("clocks.applications.memory", "clocks.applications.mem"),
    "reasons_mask": ("clocks_throttle_reasons.active", "clocks_event_reasons.active"),
    "temp.gpu": ("temperature.gpu",), "temp.memory": ("temperature.memory",),
    "power.draw_w": ("power.draw", "power.draw.average", "power.draw.instant"),
    "power.limit_w": ("enforced.power.limit", "power.limit"),
    "power.default_limit_w": ("power.default_limit",),
    "util.gpu": ("utilization.gpu",), "util.memory": ("utilization.memory",),
    "mem.used_mib": ("memory.used",), "mem.total_mib": ("memory.total",),
    "ecc.mode": ("ecc.mode.current",),
    "ecc.volatile_uncorrected": ("ecc.errors.uncorrected.volatile.total",),
    "ecc.aggregate_uncorrected": ("ecc.errors.uncorrected.aggregate.total",),
    "ecc.volatile_corrected": ("ecc.errors.corrected.volatile.total",),
    "ecc.aggregate_corrected": ("ecc.errors.corrected.aggregate.total",),
    "retired_pages.sbe": ("retired_pages.single_bit_ecc.count", "retired_pages.sbe"),
    "retired_pages.dbe": ("retired_pages.double_bit.count", "retired_pages.dbe"),
    "retired_pages.pending": ("retired_pages.pending",),
    "remapped_rows.correctable": ("remapped_rows.correctable",),
    "remapped_rows.uncorrectable": ("remapped_rows.uncorrectable",),
    "remapped_rows.pending": ("remapped_rows.pending",),
    "remapped_rows.failure": ("remapped_rows.failure",),
    "pcie.gen": ("pcie.link.gen.current", "pcie.link.gen.gpucurrent"),
    "pcie.gen_max": ("pcie.link.gen.max", "pcie.link.gen.gpumax"),
    "pcie.width": ("pcie.link.width.current",), "pcie.width_max": ("pcie.link.width.max",),
    "mig.current": ("mig.mode.current",), "mig.pending": ("mig.mode.pending",),
}
_CSV_ALIASES = {alias: canon for canon, aliases in _CSV_FIELDS.items() for alias in aliases}
_CSV_REASON_PREFIX = ("clocks_throttle_reasons.", "clocks_event_reasons.")
_CSV_STR = {"name", "uuid", "pci_bus", "timestamp", "pstate", "ecc.mode"}
_CSV_BOOL = {"retired_pages.pending", "remapped_rows.pending", "remapped_rows.failure", "mig.current", "mig.pending"}


def _csv_header_name(h: str) -> str:
    return re.sub(r"\s*\[[^\]]*\]\s*$", "", h.strip()).strip().lower()


def csv_header_known(line: str) -> int:
    """How many columns of a csv header are nvidia-smi --query-gpu fields with a dot in the name
    (clocks.sm, memory.used, ...): plain ``timestamp,name,index`` is any csv's header."""
    cols = [_csv_header_name(c) for c in line.split(",")]
    return sum(1 for c in cols if "." in c and (c in _CSV_ALIASES or c.startswith(_CSV_REASON_PREFIX)))


def parse_smi_csv(text: str) -> dict[str, Any]:
    """Devices (last row per GPU) and samples (every row) from --query-gpu csv output."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines[:50]) if csv_header_known(ln) >= 2), None)
    if start is None:
        raise ValueError("no nvidia-smi --query-gpu csv header found")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:])), skipinitialspace=True))
    header = [_csv_header_name(h) for h in rows[0]]
    latest: dict[Any, dict[str, Any]] = {}
    order: list[Any] = []
    samples: dict[int, list[dict[str, Any]]] = {}
    t0: float | None = None
    for row_no, row in enumerate(rows[1:]):
        if len(row) != len(header) or row == rows[0]:
            continue  # a repeated header (``-l`` after a restart) or a truncated last line
        rec = dict(zip(header, (c.strip() for c in row), strict=False))
        key = rec.get("index") or rec.get("uuid") or rec.get("pci.bus_id") or str(len(order))
        if key not in latest:
            order.append(key)
        d = empty_device(_int(rec.get("index")) if rec.get("index", "").isdigit() else order.index(key))
        _fill_from_csv(d, rec)
        latest[key] = d
        ts = _csv_time(rec.get("timestamp"))
        if ts is not None and t0 is None:
            t0 = ts
        samples.setdefault(d["index"], []).append({
            "t": round(ts - t0, 3) if ts is not None and t0 is not None else float(row_no),
            "index": d["index"], "sm": d["clocks"]["sm"], "util": d["util"]["gpu"],
            "power_w": d["power"]["draw_w"], "reasons": d["reasons"], "temp": d["temp"]["gpu"],
        })
    if not latest:
        raise ValueError("csv header found but no data rows")
    devices = [latest[k] for k in order]
    multi = {i: s for i, s in samples.items() if len(s) > 1}
    return {"devices": devices, "samples": multi}


def _csv_time(value: str | None) -> float | None:
    """Seconds of an nvidia-smi timestamp (``2024/12/02 10:00:00.123``); None when absent."""
    if not value:
        return None
    for fmt in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S"):
        try:
            return datetime.strptime(value.strip(), fmt).timestamp()
        except ValueError:
            continue
    return None


def _fill_from_csv(d: dict[str, Any], rec: dict[str, str]) -> None:
    err = d["errors"]
    active: list[str] = []
    for col, raw in rec.items():
        if col.startswith(_CSV_REASON_PREFIX):
            name = col.split(".", 1)[1]
            if name != "active" and name != "supported" and _yes(raw):
                active.append(name)
            continue
        canon = _CSV_ALIASES.get(col)
        if canon is None:
            continue
        why = _na_reason(raw)
        if why and why != "not available":
            err[canon] = why
            if why == "gpu is lost":
                d["lost"] = True
        if canon == "index":
            continue
        if canon in _CSV_STR:
            val: Any = raw if raw and raw.strip().lower() not in _NA else None
            if canon == "ecc.mode" and val is not None:
                val = {True: "enabled", False: "disabled"}.get(_yes(val))
        elif canon in _CSV_BOOL:
            val = _yes(raw)
        elif canon == "reasons_mask":
            try:
                val = int(raw, 16) if raw and raw.lower().startswith("0x") else None
            except ValueError:
                val = None
        else:
            n = _num(raw)
            val = None if n is None else (round(n, 1) if canon.startswith("power.") else int(n))
        if "." in canon:
            group, key = canon.split(".", 1)
            d[group][key] = val
        else:
            d[canon] = val
    if d["reasons_mask"] is not None:
        d["reasons"] = decode_reasons(d["reasons_mask"])
    elif active:
        d["reasons"] = [r for r in REASON_BITS.values() if r in active]


# -- nvidia-smi default table -----------------------------------------------------------------

_T_ROW1 = re.compile(r"^\s*(\d+)\s+(.*?)\s+(On|Off)\s*$")
_T_BUS = re.compile(r"([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])")
_T_ROW2 = re.compile(r"^\s*(\S+)\s+(\S+?)C?\s+(P\d+|ERR!|N/A)\s+(\S+?)\s*/\s*(\S+?)\s*$")
_T_MEM = re.compile(r"(\d+)\s*MiB\s*/\s*(\d+)\s*MiB")
_T_PROC = re.compile(r"^\|\s+(\d+)\s+(?:(?:N/A|\d+)\s+(?:N/A|\d+)\s+)?(\d+)\s+([CGM+]+)\s+(.+?)\s+(\d+|N/A)(?:MiB)?\s*\|$")


def parse_smi_table(text: str) -> dict[str, Any]:
    """Devices and processes from the default ``nvidia-smi`` table."""
    lines = text.splitlines()
    driver = re.search(r"Driver Version:\s*([\d.]+)", text)
    devices: list[dict[str, Any]] = []
    in_procs = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if "Processes:" in line:
            in_procs = True
        cells = line.split("|")
        if not in_procs and len(cells) >= 4:
            m = _T_ROW1.match(cells[1])
            bus = _T_BUS.search(cells[2]) if m else None
            if m and bus and i + 1 < len(lines):
                d = empty_device(int(m.group(1)))
                d["name"] = m.group(2).strip()
                d["pci_bus"] = bus.group(1)
                ecc_cell = cells[3].strip()
                if ecc_cell.isdigit():
                    d["ecc"]["volatile_uncorrected"] = int(ecc_cell)
                elif ecc_cell == "ERR!":
                    d["errors"]["ecc.volatile_uncorrected"] = "error reading the value"
                _table_row2(d, lines[i + 1].split("|"))
                if i + 2 < len(lines):
                    mig = lines[i + 2].split("|")
                    if len(mig) >= 4:
                        d["mig"]["current"] = _yes(mig[3].strip()) if mig[3].strip() not in ("", "N/A") else None
                devices.append(d)
                i += 2
        elif in_procs:
            pm = _T_PROC.match(line.rstrip())
            if pm:
                idx = int(pm.group(1))
                for d in devices:
                    if d["index"] == idx:
                        d["processes"].append({"pid": int(pm.group(2)), "used_mib": _int(pm.group(5)),
                                               "type": pm.group(3), "name": _exe_name(pm.group(4))})
        i += 1
    if not devices:
        raise ValueError("no GPU rows found in the nvidia-smi table")
    return {"driver_version": driver.group(1) if driver else None, "devices": devices}


def _table_row2(d: dict[str, Any], cells: list[str]) -> None:
    if len(cells) < 4:
        return
    m = _T_ROW2.match(cells[1])
    if m:
        d["temp"]["gpu"] = _int(m.group(2))
        d["pstate"] = m.group(3) if m.group(3).startswith("P") else None
        d["power"]["draw_w"] = _num(m.group(4))
        d["power"]["limit_w"] = _num(m.group(5))
    if "ERR!" in cells[1] or "ERR!" in cells[2]:
        d["errors"]["table"] = "nvidia-smi printed ERR! for this GPU"
    mm = _T_MEM.search(cells[2])
    if mm:
        d["mem"] = {"used_mib": int(mm.group(1)), "total_mib": int(mm.group(2))}
    um = re.search(r"(\d+)%", cells[3])
    if um:
        d["util"]["gpu"] = int(um.group(1))


# =============================================================================================
# Derived facts
# =============================================================================================

def _label(host: str, index: Any) -> str:
    return f"{host}:gpu{index}" if host else f"gpu{index}"


def summarize_samples(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """min/median/max SM clock, median util and power, and the share of samples per reason."""
    def vals(key: str) -> list[float]:
        return [r[key] for r in rows if isinstance(r.get(key), (int, float))]

    sm, util, power, temp = vals("sm"), vals("util"), vals("power_w"), vals("temp")
    n = len(rows)
    counts: dict[str, int] = {}
    for r in rows:
        names = r.get("reasons")
        if names is None:
            names = decode_reasons(r.get("reasons_mask")) if isinstance(r.get("reasons_mask"), int) else []
        for name in names:
            counts[name] = counts.get(name, 0) + 1
    share = {k: round(v / n, 3) for k, v in sorted(counts.items())} if n else {}
    return {
        "n": n,
        "sm_min": min(sm) if sm else None, "sm_median": statistics.median(sm) if sm else None,
        "sm_max": max(sm) if sm else None,
        "util_median": statistics.median(util) if util else None,
        "util_max": max(util) if util else None,
        "power_median_w": round(statistics.median(power), 1) if power else None,
        "temp_max": max(temp) if temp else None,
        "reason_share": share,
        "fault_share": round(max((share.get(r, 0.0) for r in FAULT_REASONS), default=0.0), 3),
        "lost": any(r.get("lost") for r in rows),
    }


def derive(d: dict[str, Any], summary: dict[str, Any] | None) -> None:
    """Flags the rules read: computed once here so rules stay one readable condition."""
    why: dict[str, list[str]] = {"fault": [], "throttle": [], "pcie": [], "info": []}
    util = summary["util_median"] if summary and summary.get("util_median") is not None else d["util"]["gpu"]
    sm = summary["sm_median"] if summary and summary.get("sm_median") is not None else d["clocks"]["sm"]
    power = summary["power_median_w"] if summary and summary.get("power_median_w") is not None else d["power"]["draw_w"]
    d["util_eff"] = util
    d["sm_eff"] = sm
    d["busy"] = bool(util is not None and util >= BUSY_UTIL_PCT)
    d["idle"] = bool("gpu_idle" in d["reasons"] or (util is not None and util == 0))
    maxsm = d["max_clocks"]["sm"]
    d["sm_frac"] = round(sm / maxsm, 3) if sm and maxsm else None

    # -- hardware health: (reading, severe). Pending remaps / retirements and "reset required"
    # need a GPU reset at a convenient time; the rest means the GPU is failing now (Xid catalog:
    # 63 "reset to activate" vs 48/64/79/94/95).
    ecc = d["ecc"]
    faults: list[tuple[str, bool]] = []
    if d["lost"]:
        faults.append(("NVML reports the GPU is lost (fallen off the bus)", True))
    if (ecc.get("volatile_uncorrected") or 0) > 0:
        faults.append((f"{ecc['volatile_uncorrected']} volatile uncorrectable ECC error(s) since the driver loaded", True))
    if (ecc.get("aggregate_uncorrected") or 0) > AGGREGATE_UNCORRECTED_RMA:
        faults.append((f"{ecc['aggregate_uncorrected']} aggregate uncorrectable ECC errors "
                       f"(> {AGGREGATE_UNCORRECTED_RMA}: RMA level)", True))
    if ecc.get("sram_threshold_exceeded"):
        faults.append(("SRAM uncorrectable error threshold exceeded", True))
    rr = d["remapped_rows"]
    if rr.get("failure"):
        faults.append(("row remapping failed (RMA candidate)", True))
    if rr.get("pending"):
        faults.append((f"row remap pending ({rr.get('uncorrectable') or 0} uncorrectable rows): reset the GPU", False))
    if d["retired_pages"].get("pending"):
        faults.append(("retired pages pending: reset the GPU", False))
    if "reset_required" in d["errors"]:
        faults.append(("nvidia-smi says a GPU reset is required", False))
    for ev in d.get("xids", []):
        if ev.get("xid") in HARDWARE_XIDS:
            faults.append((f"Xid {ev['xid']} seen during the probe", ev.get("xid") != 63))
    why["fault"] = [text for text, _ in faults]
    d["hw_fault"] = bool(faults)
    d["hw_fault_severe"] = any(severe for _, severe in faults)

    # -- clocks and power
    share = (summary or {}).get("reason_share") or {}
    if summary and summary.get("n"):
        faults = [r for r in FAULT_REASONS if share.get(r, 0.0) >= FAULT_MIN_SHARE]
    else:
        faults = [r for r in FAULT_REASONS if r in d["reasons"]]
    thermal_share = (d.get("violation_share") or {}).get("thermal") or 0.0
    if thermal_share >= FAULT_MIN_SHARE and "thermal_policy" not in faults:
        faults.append("thermal_policy")
    d["fault_reasons"] = faults
    if faults:
        why["throttle"].append("active: " + ", ".join(faults))
    if thermal_share >= FAULT_MIN_SHARE:
        why["throttle"].append(f"the thermal policy held clocks down {thermal_share:.0%} of the sampling window")
    t = d["temp"]
    hot_at = (t["slowdown"] - HOT_MARGIN_C) if t.get("slowdown") else HOT_DEFAULT_C
    temp_now = (summary or {}).get("temp_max") if summary and summary.get("temp_max") is not None else t.get("gpu")
    d["hot"] = bool(temp_now is not None and temp_now >= hot_at)
    if d["hot"]:
        why["throttle"].append(f"{temp_now} C, within {HOT_MARGIN_C} C of the slowdown temperature" if t.get("slowdown")
                               else f"{temp_now} C (>= {HOT_DEFAULT_C} C)")
    lim, dflt = d["power"]["limit_w"], d["power"]["default_limit_w"]
    d["power_limit_lowered"] = bool(lim and dflt and lim < dflt * POWER_LIMIT_LOWERED_FRAC)
    if d["power_limit_lowered"]:
        why["throttle"].append(f"power limit {lim:g} W is below the default {dflt:g} W")
    app = d["app_clocks"].get("graphics")
    d["clocks_locked_low"] = bool("applications_clocks_setting" in d["reasons"] and app and maxsm and app < maxsm)
    if d["clocks_locked_low"]:
        why["throttle"].append(f"application clocks {app} MHz below max {maxsm} MHz")
    capped = "sw_power_cap" in d["reasons"] or share.get("sw_power_cap", 0.0) >= FAULT_MIN_SHARE
    at_cap = bool(power is not None and lim and power >= lim * POWER_AT_CAP_FRAC)
    d["at_power_cap"] = at_cap
    d["throttle_fault"] = bool(faults or (d["hot"] and d["busy"]))
    d["power_capped_ok"] = bool(capped and d["busy"] and at_cap and not faults and not d["hot"]
                                and not d["power_limit_lowered"])
    if d["power_capped_ok"]:
        why["info"].append(f"SW power cap at {power:g} of {lim:g} W under load, normal temperature: healthy")

    # -- PCIe: idle GPUs drop link speed to save power (nvidia-smi docs), so judge only busy ones
    pc = d["pcie"]
    low_gen = bool(pc["gen"] and pc["gen_max"] and pc["gen"] < pc["gen_max"])
    low_width = bool(pc["width"] and pc["width_max"] and pc["width"] < pc["width_max"])
    d["pcie_degraded"] = bool(d["busy"] and (low_gen or low_width))
    if d["pcie_degraded"]:
        why["pcie"].append(f"PCIe Gen{pc['gen']} x{pc['width']} under load, capable of Gen{pc['gen_max']} x{pc['width_max']}")
    d["pcie_downtrained_idle"] = bool(not d["busy"] and (low_gen or low_width))

    d["busy_low_power"] = bool(util is not None and util >= SPIN_UTIL_PCT and power is not None and lim
                               and power < lim * SPIN_POWER_FRAC)
    if d["busy_low_power"]:
        why["info"].append(f"{util:g}% busy but drawing {power:g} of {lim:g} W: few SMs working (a spinning or "
                           "tiny kernel, not a full load)")
    mem = d["mem"]
    d["mem_full"] = bool(mem["used_mib"] and mem["total_mib"] and mem["used_mib"] >= mem["total_mib"] * MEM_FULL_FRAC)
    d["why"] = why


def derive_peers(devices: list[dict[str, Any]]) -> None:
    """Mark busy GPUs whose SM clock trails their host peers' median (needs >= 2 busy GPUs)."""
    by_host: dict[str, list[dict[str, Any]]] = {}
    for d in devices:
        by_host.setdefault(d["host"], []).append(d)
    for peers in by_host.values():
        busy = [d for d in peers if d["busy"] and d.get("sm_eff")]
        med = statistics.median(d["sm_eff"] for d in busy) if len(busy) >= 2 else None
        for d in peers:
            d["peer_sm_median"] = med
            lag = (med - d["sm_eff"]) if med and d in busy else 0
            d["slow_vs_peers"] = bool(med and lag > max(PEER_CLOCK_LAG_MHZ, med * PEER_CLOCK_LAG_FRAC))
            if d["slow_vs_peers"]:
                d["why"]["throttle"].append(f"SM clock {d['sm_eff']:g} MHz vs host peers' median {med:g} MHz under load")
                if d["power_capped_ok"]:
                    d["power_capped_ok"] = False


# =============================================================================================
# The probe
# =============================================================================================

_SMI_TABLE = re.compile(r"NVIDIA-SMI\s+[\d.]+|\|\s+GPU\s+Name\s+Persistence-M")


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
    facts_schema: ClassVar[dict[str, str]] = {
        "gpu.source": "string: nvml | nvidia-smi (nvml when any NVML reading is present)",
        "gpu.sources": "list<string>: every format read: nvml-json, smi-q, smi-csv, smi-table",
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
        "gpu.devices[].util_eff": "int: utilization used for the flags (sample median or snapshot)",
        "gpu.devices[].sm_eff": "int: SM clock used for the flags (sample median or snapshot)",
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
        "gpu.samples": "list<map>: per sampled GPU: label, n, sm_min, sm_median, sm_max, util_median, util_max, power_median_w, temp_max, reason_share, fault_share",
        "gpu.samples[].label": "string: host:gpuN",
        "gpu.pid_to_gpu": "map<string,list<string>>: pid -> GPU labels it has a context on",
        "gpu.by_rank": "map<string,map>: rank -> gpus (labels), primary (label with most memory), busy, util, throttle_fault, hw_fault",
        "gpu.faulty": "list<map>: GPUs with a hardware fault: label, host, index, uuid, why",
        "gpu.faulty[].label": "string: host:gpuN",
        "gpu.faulty[].severe": "bool: failing now (lost, uncorrectable ECC, remap failure, hardware Xid), not only a pending remap/retirement awaiting a reset",
        "gpu.faulty[].why": "list<string>: the fault readings",
        "gpu.faulty[].ranks": "list<int>: ranks with a context on it",
        "gpu.throttled": "list<map>: GPUs held down by a fault reason, heat, a lowered limit, locked clocks, or behind peers: label, host, index, why, ranks",
        "gpu.throttled[].label": "string: host:gpuN",
        "gpu.throttled[].why": "list<string>: what holds it down",
        "gpu.throttled[].ranks": "list<int>: ranks with a context on it",
        "gpu.throttled[].sm": "int: SM clock (sample median when sampled)",
        "gpu.throttled[].max_sm": "int: max SM clock",
        "gpu.throttled[].fault_reasons": "list<string>: active fault reasons",
        "gpu.power_capped": "list<map>: busy GPUs at their software power cap and otherwise healthy: label, why",
        "gpu.power_capped[].label": "string: host:gpuN",
        "gpu.power_capped[].why": "list<string>: the readings that make it healthy",
        "gpu.power_capped[].power_w": "float: power draw",
        "gpu.power_capped[].limit_w": "float: enforced power limit",
        "gpu.power_capped[].ranks": "list<int>: ranks with a context on it",
        "gpu.pcie_degraded": "list<map>: busy GPUs below their PCIe gen/width: label, why, replay",
        "gpu.pcie_degraded[].label": "string: host:gpuN",
        "gpu.pcie_degraded[].why": "list<string>: link now vs capable",
        "gpu.pcie_degraded[].ranks": "list<int>: ranks with a context on it",
        "gpu.pcie_degraded[].replay": "int: PCIe replay counter",
        "gpu.shared": "list<map>: GPUs that two or more job ranks use as their main GPU: label, ranks, pids",
        "gpu.shared[].label": "string: host:gpuN",
        "gpu.shared[].ranks": "list<int>: the ranks sharing it",
        "gpu.shared[].pids": "list<int>: their processes",
        "gpu.shared[].host": "string: host",
        "gpu.shared[].why": "list<string>: which ranks and processes",
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
        head = text.lstrip()[:400]
        if head.startswith("{"):
            # json.dumps(sort_keys=True) puts "schema" late; the sample holds the first 64 KiB.
            return f'"{SCHEMA_ID}"' in text
        if "NVSMI LOG" in text[:2000]:
            return True
        first = next((ln for ln in text.splitlines()[:50] if ln.strip()), "")
        if csv_header_known(first) >= 2 and "," in first:
            return True
        if _SMI_TABLE.search(text[:8000]) and "MiB" in text:
            return True
        # nvidia-smi -q pads its keys into a column ("Pending                           : Yes");
        # pasted sections of it are evidence too, so one known section header is enough.
        body = text[:20000]
        lines = [ln for ln in body.splitlines() if ln.strip() and not ln.strip().startswith("```")]
        padded = len(_Q_PADDED.findall(body))
        return bool(_Q_KEYS.search(body)) and padded >= 3 and padded >= 0.6 * (len(lines) - len(_Q_KEYS.findall(body)))

    def parse(self, path: Path, rel: str, hints: Hints) -> Parsed:
        text = path.read_text(encoding="utf-8", errors="replace")
        stripped = text.lstrip()
        try:
            if stripped.startswith("{"):
                return self._parse_json(text, rel, hints)
            first = next((ln for ln in text.splitlines()[:50] if ln.strip()), "")
            if "NVSMI LOG" in text[:2000] or (not _SMI_TABLE.search(text[:8000]) and csv_header_known(first) < 2):
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
        pref = {"nvml-json": 0, "smi-q": 1, "smi-csv": 2, "smi-table": 3}
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
                cur["label"] = _label(cur["host"], cur["index"])
            if data["format"] == "nvml-json":
                x = data.get("xid") or {}
                xid_info["registered"] += [_label(host, i) for i in (x.get("registered") or [])]
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
            "busy_ranks": sorted(int(r) for r, e in by_rank.items() if e.get("busy")),
            "xid_events": xid_events, "xid": xid_info, "cost": cost,
        }

    # -- live -----------------------------------------------------------------------------------

    def collect(self, ctx: Any) -> None:
        nv = load_nvml()
        init_nvml(nv)
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as exc:
            _shutdown(nv)
            raise ProbeFailed(f"NVML could not count the GPUs: {nvml_reason(exc)}") from exc
        if not count:
            _shutdown(nv)
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
            _shutdown(nv)
        name = "gpu.json" if not getattr(ctx, "round", 0) else f"gpu-round{ctx.round}.json"
        ctx.add(name, json.dumps(doc, indent=1), meta={
            "devices": len(doc["devices"]), "calls": doc["cost"]["calls"], "snapshot_s": doc["cost"]["snapshot_s"]})


def _shutdown(nv: Any) -> None:
    try:
        nv.nvmlShutdown()
    except Exception:  # shutting down is best effort; the readings are already taken
        pass


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


PROBE = GpuProbe()


def main(argv: list[str] | None = None) -> int:
    """``python -m doctor.probes.gpu [--samples N] [--interval S]``: print the probe's JSON."""
    import argparse  # noqa: PLC0415

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--samples", type=int, default=0)
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--pid-rank", action="append", default=[], help="PID=RANK, repeatable")
    ap.add_argument("--no-nvlink", action="store_true")
    args = ap.parse_args(argv)
    try:
        nv = load_nvml()
        init_nvml(nv)
    except (ProbeSkipped, ProbeFailed) as exc:
        print(json.dumps({"status": type(exc).__name__, "reason": str(exc)}))
        return 3
    ranks = {int(a.split("=")[0]): int(a.split("=")[1]) for a in args.pid_rank}
    try:
        doc = collect_document(nv, samples=args.samples, interval=args.interval, rank_of_pid=ranks,
                               nvlink=not args.no_nvlink, deadline_s=600)
    finally:
        _shutdown(nv)
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
