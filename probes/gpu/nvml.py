"""Live GPU readings through NVML (nvidia-ml-py), written as the probe's own JSON document.

Every NVML call can fail on its own (not supported, no permission, GPU lost): the reason is kept
per field in the device's ``errors`` map and the reading goes on, because one missing counter
must never cost the GPU's other facts. The reading stays cheap (about 40 calls a GPU) because it
may run on every host of a large job while the job is stuck.

Failures are told apart by nvidia-ml-py's error classes (``NVMLError_GpuIsLost``, ...), looked
up on the module handed in: the binding is optional and imported only when collecting, and a
test's stand-in module carries the same classes.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from doctor.evidence.contract import ProbeFailed, ProbeSkipped

from .record import SCHEMA_ID, decode_reasons, empty_device

#: Short, stable reasons by nvidia-ml-py error class: pynvml's own strings need the library
#: loaded, and these end up in facts that rules and reports compare.
_NVML_REASONS: dict[str, str] = {
    "NVMLError_Uninitialized": "NVML not initialized",
    "NVMLError_InvalidArgument": "invalid argument",
    "NVMLError_NotSupported": "not supported",
    "NVMLError_NoPermission": "no permission",
    "NVMLError_NotFound": "not found",
    "NVMLError_InsufficientPower": "insufficient external power",
    "NVMLError_DriverNotLoaded": "driver not loaded",
    "NVMLError_Timeout": "timeout",
    "NVMLError_LibraryNotFound": "NVML library not found",
    "NVMLError_FunctionNotFound": "function not found in this driver's NVML",
    "NVMLError_CorruptedInforom": "corrupted infoROM",
    "NVMLError_GpuIsLost": "GPU is lost",
    "NVMLError_ResetRequired": "GPU requires reset",
    "NVMLError_OperatingSystem": "blocked by the operating system",
    "NVMLError_LibRmVersionMismatch": "NVML/driver version mismatch",
    "NVMLError_InUse": "in use",
    "NVMLError_Memory": "out of memory",
    "NVMLError_NoData": "no data",
    "NVMLError_Deprecated": "deprecated",
    "NVMLError_NotReady": "not ready",
    "NVMLError_GpuNotFound": "GPU not found",
    "NVMLError_Unknown": "unknown error",
}


def nvml_error(nv: Any, name: str) -> type[BaseException] | tuple[()]:
    """nvidia-ml-py's error class ``name``; an empty tuple (matches nothing) when this binding
    lacks it, so an older binding degrades to the generic reason instead of crashing."""
    cls = getattr(nv, name, None)
    return cls if isinstance(cls, type) else ()


def _known_reason(nv: Any, exc: BaseException) -> str | None:
    for name, reason in _NVML_REASONS.items():
        if isinstance(exc, nvml_error(nv, name)):
            return reason
    return None


def nvml_reason(nv: Any, exc: BaseException) -> str:
    """A short, stable reason for an NVML failure (the error's meaning, not pynvml's string)."""
    reason = _known_reason(nv, exc)
    if reason is not None:
        return reason
    code = getattr(exc, "value", None)
    if isinstance(code, int):
        return f"NVML error {code}"
    return type(exc).__name__ + (f": {exc}" if str(exc) else "")


def field_reason(nv: Any, code: Any) -> str:
    """The reason for a failed entry of a batched field read, which returns a code, not an error:
    nvidia-ml-py's ``NVMLError(code)`` builds the same named class a failed call raises."""
    return _known_reason(nv, nv.NVMLError(code)) or f"NVML error {code}"


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
        if isinstance(exc, nvml_error(nv, "NVMLError_LibraryNotFound")):
            raise ProbeSkipped("NVML library not found (libnvidia-ml.so.1): no NVIDIA driver on this host") from exc
        if isinstance(exc, nvml_error(nv, "NVMLError_DriverNotLoaded")):
            raise ProbeSkipped("NVIDIA kernel driver is not loaded (NVML: driver not loaded): no usable GPU on this host") from exc
        if isinstance(exc, nvml_error(nv, "NVMLError_NoPermission")):
            raise ProbeFailed("no permission to open the NVIDIA devices (NVML: insufficient permissions)") from exc
        if isinstance(exc, nvml_error(nv, "NVMLError_LibRmVersionMismatch")):
            raise ProbeFailed("NVML library and kernel driver versions differ (reload the driver or reboot)") from exc
        raise ProbeFailed(f"nvmlInit failed: {nvml_reason(nv, exc)}") from exc
    except OSError as exc:  # a broken library file
        raise ProbeSkipped(f"NVML library could not be loaded ({exc})") from exc


def shutdown_nvml(nv: Any) -> None:
    """``nvmlShutdown``, best effort: the readings are already taken."""
    try:
        nv.nvmlShutdown()
    except Exception:  # shutting down is best effort; the readings are already taken
        pass


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
            if not isinstance(exc, nvml_error(self.nv, "NVMLError_Timeout")):  # an event wait that saw no event
                self.failed += 1
            errors[field] = nvml_reason(self.nv, exc)
            if isinstance(exc, nvml_error(self.nv, "NVMLError_GpuIsLost")):
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
                err[name] = field_reason(rd.nv, code)
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
                err["temp.memory"] = field_reason(nv, v.nvmlReturn)
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

