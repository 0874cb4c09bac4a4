"""The flags GPU rules read, derived once from the normalized device records.

Every threshold is named here (the rules' docs quote them) so a rule stays one readable
condition and the reasoning behind a flag lives next to the number it depends on. Each flag
also leaves a human sentence in the device's ``why`` map, which findings show as evidence.
"""

from __future__ import annotations

import statistics
from typing import Any

from .record import FAULT_REASONS, decode_reasons

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
#: A sample at or below this utilization is an idle interval: no kernel ran for 90 % of it.
IDLE_UTIL_PCT = 10
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
        "util_low_share": round(sum(1 for u in util if u <= IDLE_UTIL_PCT) / len(util), 3) if util else None,
        "fault_share": round(max((share.get(r, 0.0) for r in FAULT_REASONS), default=0.0), 3),
        "lost": any(r.get("lost") for r in rows),
    }


def derive(d: dict[str, Any], summary: dict[str, Any] | None) -> None:
    """Flags the rules read: computed once here so rules stay one readable condition."""
    why: dict[str, list[str]] = {"fault": [], "throttle": [], "pcie": [], "info": []}
    util, power = _effective_load(d, summary)
    why["fault"] = _hardware_health(d)
    share = (summary or {}).get("reason_share") or {}
    faults = _fault_reasons(d, summary, share, why["throttle"])
    _heat(d, summary, why["throttle"])
    _lowered_limits(d, why["throttle"])
    _power_cap(d, share, faults, power, why["info"])
    _pcie(d, why["pcie"])
    _load_shape(d, util, power, why["info"])
    d["why"] = why


def _effective_load(d: dict[str, Any], summary: dict[str, Any] | None) -> tuple[Any, Any]:
    """Utilization, SM clock and power to judge by: the sample medians when sampled, since one
    snapshot can land between two kernels. Returns (util, power)."""
    util = summary["util_median"] if summary and summary.get("util_median") is not None else d["util"]["gpu"]
    sm = summary["sm_median"] if summary and summary.get("sm_median") is not None else d["clocks"]["sm"]
    power = summary["power_median_w"] if summary and summary.get("power_median_w") is not None else d["power"]["draw_w"]
    d["util_eff"] = util
    d["sm_eff"] = sm
    d["busy"] = bool(util is not None and util >= BUSY_UTIL_PCT)
    d["idle"] = bool("gpu_idle" in d["reasons"] or (util is not None and util == 0))
    maxsm = d["max_clocks"]["sm"]
    d["sm_frac"] = round(sm / maxsm, 3) if sm and maxsm else None
    return util, power


def _hardware_health(d: dict[str, Any]) -> list[str]:
    """Sets ``hw_fault`` / ``hw_fault_severe``; returns the fault sentences.

    Pending remaps / retirements and "reset required" need a GPU reset at a convenient time, so
    they are not severe; the rest means the GPU is failing now (Xid catalog: 63 "reset to
    activate" vs 48/64/79/94/95).
    """
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
    if "table" in d["errors"]:
        # nvidia-smi prints ERR! where NVML returned an error for the field. A whole row of them
        # (the name, or the ECC cell as well) means the driver cannot talk to the GPU any more
        # (fallen off the bus, firmware hung); a lone fan or power ERR! is a sensor that failed.
        whole = d.get("name") == "ERR!" or "ecc.volatile_uncorrected" in d["errors"]
        faults.append(("nvidia-smi prints ERR! for this GPU's fields (NVML cannot read them)", whole))
    for ev in d.get("xids", []):
        if ev.get("xid") in HARDWARE_XIDS:
            faults.append((f"Xid {ev['xid']} seen during the probe", ev.get("xid") != 63))
    d["hw_fault"] = bool(faults)
    d["hw_fault_severe"] = any(severe for _, severe in faults)
    return [text for text, _ in faults]


def _fault_reasons(d: dict[str, Any], summary: dict[str, Any] | None, share: dict[str, float],
                   why: list[str]) -> list[str]:
    """Sets ``fault_reasons``: by sample share when sampled, so one transient blip is no fault;
    a thermal violation counter that grew over the window counts as ``thermal_policy``."""
    if summary and summary.get("n"):
        faults = [r for r in FAULT_REASONS if share.get(r, 0.0) >= FAULT_MIN_SHARE]
    else:
        faults = [r for r in FAULT_REASONS if r in d["reasons"]]
    thermal_share = (d.get("violation_share") or {}).get("thermal") or 0.0
    if thermal_share >= FAULT_MIN_SHARE and "thermal_policy" not in faults:
        faults.append("thermal_policy")
    d["fault_reasons"] = faults
    if faults:
        why.append("active: " + ", ".join(faults))
    if thermal_share >= FAULT_MIN_SHARE:
        why.append(f"the thermal policy held clocks down {thermal_share:.0%} of the sampling window")
    return faults


def _heat(d: dict[str, Any], summary: dict[str, Any] | None, why: list[str]) -> None:
    """Sets ``hot``: near the GPU's own slowdown temperature when it reports one, since the
    limits differ between parts; the hottest sample counts when sampled."""
    t = d["temp"]
    hot_at = (t["slowdown"] - HOT_MARGIN_C) if t.get("slowdown") else HOT_DEFAULT_C
    temp_now = (summary or {}).get("temp_max") if summary and summary.get("temp_max") is not None else t.get("gpu")
    d["hot"] = bool(temp_now is not None and temp_now >= hot_at)
    if d["hot"]:
        why.append(f"{temp_now} C, within {HOT_MARGIN_C} C of the slowdown temperature" if t.get("slowdown")
                   else f"{temp_now} C (>= {HOT_DEFAULT_C} C)")


def _lowered_limits(d: dict[str, Any], why: list[str]) -> None:
    """Sets ``power_limit_lowered`` and ``clocks_locked_low``: settings someone changed, which
    hold a healthy GPU below its speed without any fault reason."""
    lim, dflt = d["power"]["limit_w"], d["power"]["default_limit_w"]
    d["power_limit_lowered"] = bool(lim and dflt and lim < dflt * POWER_LIMIT_LOWERED_FRAC)
    if d["power_limit_lowered"]:
        why.append(f"power limit {lim:g} W is below the default {dflt:g} W")
    app = d["app_clocks"].get("graphics")
    maxsm = d["max_clocks"]["sm"]
    d["clocks_locked_low"] = bool("applications_clocks_setting" in d["reasons"] and app and maxsm and app < maxsm)
    if d["clocks_locked_low"]:
        why.append(f"application clocks {app} MHz below max {maxsm} MHz")


def _power_cap(d: dict[str, Any], share: dict[str, float], faults: list[str], power: Any,
               why: list[str]) -> None:
    """Sets ``at_power_cap``, ``throttle_fault`` and ``power_capped_ok``: a busy GPU at its
    software power cap is the normal state under heavy load, healthy only without a fault
    reason, heat or a lowered limit."""
    lim = d["power"]["limit_w"]
    capped = "sw_power_cap" in d["reasons"] or share.get("sw_power_cap", 0.0) >= FAULT_MIN_SHARE
    at_cap = bool(power is not None and lim and power >= lim * POWER_AT_CAP_FRAC)
    d["at_power_cap"] = at_cap
    d["throttle_fault"] = bool(faults or (d["hot"] and d["busy"]))
    d["power_capped_ok"] = bool(capped and d["busy"] and at_cap and not faults and not d["hot"]
                                and not d["power_limit_lowered"])
    if d["power_capped_ok"]:
        why.append(f"SW power cap at {power:g} of {lim:g} W under load, normal temperature: healthy")


def _pcie(d: dict[str, Any], why: list[str]) -> None:
    """Sets ``pcie_degraded`` / ``pcie_downtrained_idle``: idle GPUs drop link speed to save
    power (nvidia-smi docs), so only a busy GPU below its link maximum is degraded."""
    pc = d["pcie"]
    low_gen = bool(pc["gen"] and pc["gen_max"] and pc["gen"] < pc["gen_max"])
    low_width = bool(pc["width"] and pc["width_max"] and pc["width"] < pc["width_max"])
    d["pcie_degraded"] = bool(d["busy"] and (low_gen or low_width))
    if d["pcie_degraded"]:
        why.append(f"PCIe Gen{pc['gen']} x{pc['width']} under load, capable of Gen{pc['gen_max']} x{pc['width_max']}")
    d["pcie_downtrained_idle"] = bool(not d["busy"] and (low_gen or low_width))


def _load_shape(d: dict[str, Any], util: Any, power: Any, why: list[str]) -> None:
    """Sets ``busy_low_power`` and ``mem_full``: utilization counts any resident kernel, so
    "busy" at low power is a spinning or tiny kernel, and a full GPU alone is not an OOM."""
    lim = d["power"]["limit_w"]
    d["busy_low_power"] = bool(util is not None and util >= SPIN_UTIL_PCT and power is not None and lim
                               and power < lim * SPIN_POWER_FRAC)
    if d["busy_low_power"]:
        why.append(f"{util:g}% busy but drawing {power:g} of {lim:g} W: few SMs working (a spinning or "
                   "tiny kernel, not a full load)")
    mem = d["mem"]
    d["mem_full"] = bool(mem["used_mib"] and mem["total_mib"] and mem["used_mib"] >= mem["total_mib"] * MEM_FULL_FRAC)


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

