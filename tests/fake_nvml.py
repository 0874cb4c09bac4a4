"""A stand-in for ``pynvml`` that fails per call and per device (gpustat's testing approach).

It keeps the real binding's ``NVMLError`` classes and constants (nvidia-ml-py is a dependency), so
the probe sees exactly the exceptions a real driver raises: ``NVMLError_NotSupported`` for a field
a GPU lacks, ``NVMLError_NoPermission`` in a locked-down container, ``NVMLError_GpuIsLost`` for a
GPU that fell off the bus. Each device is a dict of NVML-shaped values (mW, bytes, bitmasks);
a list value is consumed one element per call (the last repeats), which is how sampling tests see
clocks move.
"""

from __future__ import annotations

import types
from typing import Any

import pynvml

# An idle H200 as NVML reported it on the device machine (see tests/fixtures/gpu/README.md).
H200_IDLE: dict[str, Any] = {
    "name": "NVIDIA H200", "uuid": "GPU-8a3c0f61-0000-0000-0000-000000000000",
    "bus": "00000000:1B:00.0", "sm": 345, "mem": 3201, "graphics": 345,
    "max_sm": 1980, "max_mem": 3201, "reasons": 0x1, "pstate": 0, "temp": 28, "mem_temp": 33,
    "slowdown": 87, "gpu_max": 85, "power_mw": 76_000, "limit_mw": 700_000, "default_limit_mw": 700_000,
    "util": (0, 0), "mem_total": 143_771 * 2**20, "mem_used": 585 * 2**20, "ecc": (1, 1),
    "ecc_counts": {(1, 0): 0, (1, 1): 0, (0, 0): 0, (0, 1): 0}, "remapped": (0, 0, 0, 0),
    "pcie": (5, 5, 16, 16), "replay": 0, "mig": (0, 0), "viol_ns": {0: 0, 1: 0}, "procs": [],
    "nvlink_links": 0, "nvlink_errors": {}, "xids": [],
}


def device(**over: Any) -> dict[str, Any]:
    d = dict(H200_IDLE)
    d["ecc_counts"] = dict(H200_IDLE["ecc_counts"])
    d.update(over)
    return d


def _error(code: int) -> pynvml.NVMLError:
    """The error a real call failing with ``code`` raises: pynvml's ``_nvmlCheckReturn`` raises
    ``NVMLError(code)``, whose constructor returns the named subclass (``NVMLError_NotSupported``
    for NOT_SUPPORTED, ...), and the plain ``NVMLError`` for a code without one."""
    return pynvml.NVMLError(code)


class _Obj:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


class FakeNvml(types.ModuleType):
    """``FakeNvml(devices, fail={"nvmlDeviceGetPowerUsage": {0: pynvml.NVML_ERROR_NOT_SUPPORTED}})``.

    ``fail`` maps a function name to {device index or None (every device / no device): error code};
    the call raises that code's named error class, as the real binding does. ``lost`` lists device
    indexes on which every call raises ``NVMLError_GpuIsLost``. ``init_error`` makes ``nvmlInit``
    fail with that code.
    """

    def __init__(self, devices: list[dict[str, Any]], fail: dict[str, dict[int | None, int]] | None = None,
                 lost: set[int] | None = None, init_error: int | None = None, missing: set[str] | None = None) -> None:
        super().__init__("pynvml")
        for k in dir(pynvml):
            if k.startswith(("NVML_", "nvmlClocks", "nvmlEventType")) or k.startswith("NVMLError"):
                setattr(self, k, getattr(pynvml, k))
        self.devices = devices
        self.fail = fail or {}
        self.lost = lost or set()
        self.init_error = init_error
        self.calls: dict[str, int] = {}
        self.inited = 0
        self._pending_xids: list[tuple[int, int]] = [(i, x) for i, d in enumerate(devices) for x in d.get("xids", [])]
        self._registered: set[int] = set()
        for name in missing or set():
            # Simulate an older nvidia-ml-py without this function.
            object.__setattr__(self, name, None)

    def __getattribute__(self, name: str) -> Any:
        val = super().__getattribute__(name)
        if val is None and name.startswith("nvml"):
            raise AttributeError(name)
        return val

    # -- plumbing ---------------------------------------------------------------------------

    def _check(self, fn: str, idx: int | None) -> dict[str, Any] | None:
        self.calls[fn] = self.calls.get(fn, 0) + 1
        if idx is not None and idx in self.lost:
            raise pynvml.NVMLError_GpuIsLost()
        rules = self.fail.get(fn, {})
        code = rules.get(idx, rules.get(None))
        if code is not None:
            raise _error(code)
        return self.devices[idx] if idx is not None else None

    @staticmethod
    def _next(d: dict[str, Any], key: str) -> Any:
        v = d[key]
        if isinstance(v, list) and key not in ("procs", "xids"):
            if len(v) > 1:
                return v.pop(0)
            return v[0]
        return v

    # -- init -------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] = self.calls.get("nvmlInit", 0) + 1
        if self.init_error is not None:
            raise _error(self.init_error)
        self.inited += 1

    def nvmlShutdown(self) -> None:
        self.inited -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check("nvmlSystemGetDriverVersion", None)
        return "580.159.04"

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._check("nvmlSystemGetNVMLVersion", None)
        return "13.580.159.04"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check("nvmlSystemGetCudaDriverVersion", None)
        return 13000

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount", None)
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        self._check("nvmlDeviceGetHandleByIndex", i)
        return i

    def nvmlDeviceGetIndex(self, h: int) -> int:
        self._check("nvmlDeviceGetIndex", h)
        return h

    # -- identity ---------------------------------------------------------------------------

    def nvmlDeviceGetName(self, h: int) -> str:
        return self._check("nvmlDeviceGetName", h)["name"]

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self._check("nvmlDeviceGetUUID", h)["uuid"]

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return _Obj(busId=self._check("nvmlDeviceGetPciInfo", h)["bus"])

    # -- clocks, power, temperature ----------------------------------------------------------

    def nvmlDeviceGetClockInfo(self, h: int, t: int) -> int:
        d = self._check("nvmlDeviceGetClockInfo", h)
        return self._next(d, {pynvml.NVML_CLOCK_SM: "sm", pynvml.NVML_CLOCK_MEM: "mem"}.get(t, "graphics"))

    def nvmlDeviceGetMaxClockInfo(self, h: int, t: int) -> int:
        d = self._check("nvmlDeviceGetMaxClockInfo", h)
        return d["max_sm"] if t == pynvml.NVML_CLOCK_SM else d["max_mem"]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self._next(self._check("nvmlDeviceGetCurrentClocksEventReasons", h), "reasons")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
        return self._next(self._check("nvmlDeviceGetCurrentClocksThrottleReasons", h), "reasons")

    def nvmlDeviceGetPerformanceState(self, h: int) -> int:
        return self._check("nvmlDeviceGetPerformanceState", h)["pstate"]

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return self._next(self._check("nvmlDeviceGetTemperature", h), "temp")

    def nvmlDeviceGetTemperatureThreshold(self, h: int, which: int) -> int:
        d = self._check("nvmlDeviceGetTemperatureThreshold", h)
        return d["slowdown"] if which == pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN else d["gpu_max"]

    def nvmlDeviceGetFieldValues(self, h: int, ids: list[int]) -> list[Any]:
        """Each field answers on its own, as NVML does: a per-field nvmlReturn, never a raise."""
        d = self._check("nvmlDeviceGetFieldValues", h)
        out = []
        for fid in ids:
            val, vtype = self._field(d, fid)
            code = d.get("field_fail", {}).get(fid)
            if code is None and val is None:
                code = pynvml.NVML_ERROR_NOT_SUPPORTED
            union = _Obj(dVal=0.0, uiVal=0, ulVal=0, ullVal=0, sllVal=0, siVal=0, usVal=0)
            if code is None:
                setattr(union, {1: "uiVal", 3: "ullVal"}[vtype], int(val))
            out.append(_Obj(fieldId=fid, nvmlReturn=code or 0, valueType=vtype, value=union))
        return out

    @staticmethod
    def _field(d: dict[str, Any], fid: int) -> tuple[Any, int]:
        nvl = d["nvlink_errors"]
        by_counter = {c: sum(v for (_, cc), v in nvl.items() if cc == c) for c in range(4)}
        table: dict[int, tuple[Any, int]] = {
            82: (d.get("mem_temp"), 1), 1: (d["ecc"][0], 1),
            3: (d["ecc_counts"][(0, 0)], 3), 4: (d["ecc_counts"][(1, 0)], 3),
            5: (d["ecc_counts"][(0, 1)], 3), 6: (d["ecc_counts"][(1, 1)], 3),
            94: (d["replay"], 1), 142: (d["remapped"][0], 1), 143: (d["remapped"][1], 1),
            144: (d["remapped"][2], 1), 145: (d["remapped"][3], 1),
            91: (d["nvlink_links"] or None, 1),
            52: (by_counter[0] if d["nvlink_links"] else None, 3), 59: (by_counter[1] if d["nvlink_links"] else None, 3),
            38: (by_counter[2] if d["nvlink_links"] else None, 3), 45: (by_counter[3] if d["nvlink_links"] else None, 3),
        }
        return table.get(fid, (None, 1))

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self._next(self._check("nvmlDeviceGetPowerUsage", h), "power_mw")

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return self._check("nvmlDeviceGetEnforcedPowerLimit", h)["limit_mw"]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: int) -> int:
        return self._check("nvmlDeviceGetPowerManagementDefaultLimit", h)["default_limit_mw"]

    def nvmlDeviceGetViolationStatus(self, h: int, policy: int) -> Any:
        d = self._check("nvmlDeviceGetViolationStatus", h)
        v = d["viol_ns"][policy]
        if isinstance(v, list):
            v = v.pop(0) if len(v) > 1 else v[0]
        return _Obj(referenceTime=0, violationTime=v)

    # -- load and memory ---------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        g, m = self._next(self._check("nvmlDeviceGetUtilizationRates", h), "util")
        return _Obj(gpu=g, memory=m)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        d = self._check("nvmlDeviceGetMemoryInfo", h)
        return _Obj(total=d["mem_total"], used=d["mem_used"], free=d["mem_total"] - d["mem_used"])

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        d = self._check("nvmlDeviceGetComputeRunningProcesses", h)
        return [_Obj(pid=pid, usedGpuMemory=mib * 2**20) for pid, mib in d["procs"]]

    # -- health ------------------------------------------------------------------------------

    def nvmlDeviceGetEccMode(self, h: int) -> tuple[int, int]:
        return self._check("nvmlDeviceGetEccMode", h)["ecc"]

    def nvmlDeviceGetTotalEccErrors(self, h: int, err_type: int, counter: int) -> int:
        return self._check("nvmlDeviceGetTotalEccErrors", h)["ecc_counts"][(err_type, counter)]

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        return self._check("nvmlDeviceGetRemappedRows", h)["remapped"]

    def nvmlDeviceGetRetiredPages(self, h: int, cause: int) -> list[int]:
        d = self._check("nvmlDeviceGetRetiredPages", h)
        return d.get("retired", {}).get(cause, [])

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: int) -> int:
        return self._check("nvmlDeviceGetRetiredPagesPendingStatus", h).get("retired_pending", 0)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return self._check("nvmlDeviceGetCurrPcieLinkGeneration", h)["pcie"][0]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return self._check("nvmlDeviceGetMaxPcieLinkGeneration", h)["pcie"][1]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return self._check("nvmlDeviceGetCurrPcieLinkWidth", h)["pcie"][2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return self._check("nvmlDeviceGetMaxPcieLinkWidth", h)["pcie"][3]

    def nvmlDeviceGetPcieReplayCounter(self, h: int) -> int:
        return self._check("nvmlDeviceGetPcieReplayCounter", h)["replay"]

    def nvmlDeviceGetMigMode(self, h: int) -> tuple[int, int]:
        return self._check("nvmlDeviceGetMigMode", h)["mig"]

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        d = self._check("nvmlDeviceGetNvLinkState", h)
        if link >= d["nvlink_links"]:
            raise pynvml.NVMLError_NotSupported() if link == 0 else pynvml.NVMLError_InvalidArgument()
        return 1

    def nvmlDeviceGetNvLinkErrorCounter(self, h: int, link: int, counter: int) -> int:
        d = self._check("nvmlDeviceGetNvLinkErrorCounter", h)
        return d["nvlink_errors"].get((link, counter), 0)

    # -- events ------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> str:
        self._check("nvmlEventSetCreate", None)
        return "set"

    def nvmlDeviceRegisterEvents(self, h: int, types_: int, event_set: str) -> None:
        self._check("nvmlDeviceRegisterEvents", h)
        self._registered.add(h)

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> Any:
        self._check("nvmlEventSetWait", None)
        for n, (idx, xid) in enumerate(self._pending_xids):
            if idx in self._registered:
                self._pending_xids.pop(n)
                return _Obj(device=idx, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid)
        raise pynvml.NVMLError_Timeout()

    def nvmlEventSetFree(self, event_set: str) -> None:
        self._check("nvmlEventSetFree", None)
