"""The one device record all four sources fill, so every rule reads the same shape.

NVML, ``nvidia-smi -q``, the ``--query-gpu`` csv and the table each know a different subset of
a GPU; they all start from :func:`empty_device` so a value a source cannot give stays ``None``
instead of a missing key, and merging sources is filling ``None`` holes.
"""

from __future__ import annotations

from typing import Any

SCHEMA_ID = "mldoctor.gpu/1"

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


def decode_reasons(mask: int | None) -> list[str]:
    """Names of the active clock event reasons in an NVML bitmask (unknown bits as hex)."""
    if mask is None:
        return []
    out = [name for bit, name in REASON_BITS.items() if mask & bit]
    rest = mask & ~sum(REASON_BITS)
    if rest:
        out.append(f"0x{rest:x}")
    return out


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




def device_label(host: str, index: Any) -> str:
    """``host:gpuN``, the name findings use; a bare ``gpuN`` when the source carried no host."""
    return f"{host}:gpu{index}" if host else f"gpu{index}"
