"""GPU checks: NVML health now (ECC, remapped rows, retired pages, Xid events during the check,
clock-event reasons at idle, PCIe link, NVLink errors), then matmul TFLOPS per dtype and device
memory bandwidth per GPU, against the model's spec sheet and against the node's other GPUs.

NVML is read with the gpu kind's own reader (``doctor.probes.gpu.nvml``), so a check and a
diagnosis see a GPU through the same code and field names. The measurements run in one
``gpu_worker.py`` process per GPU (all at once: peers under the same power and heat), and NVML
is sampled meanwhile for Xid events and the PCIe generation under load (links downshift at idle).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from doctor.probes.check import spec as specs
from doctor.probes.check.result import FAILED, PASSED, result, skipped
from doctor.probes.gpu.record import FAULT_REASONS, device_label

from doctor.evidence.contract import ProbeFailed, ProbeSkipped

WORKER = Path(__file__).with_name("gpu_worker.py")
GPU_CHECKS = (("gpu.health", "NVML health (ECC, remapped rows, retired pages)"), ("gpu.xid", "Xid events"),
              ("gpu.throttle", "clock-event reasons at idle"), ("gpu.pcie", "PCIe link"),
              ("gpu.nvlink", "NVLink errors"), ("gpu.matmul", "matmul TFLOPS"), ("gpu.membw", "memory bandwidth"))


def open_nvml() -> tuple[Any, str]:
    """An initialized pynvml, or None and why not (no library, no driver, no GPU)."""
    from doctor.probes.gpu.nvml import init_nvml, load_nvml

    try:
        nv = load_nvml()
        init_nvml(nv)
    except (ProbeSkipped, ProbeFailed) as exc:
        return None, str(exc)
    return nv, ""


def snapshot(nv: Any, host: str, **kw: Any) -> dict[str, Any]:
    from doctor.probes.gpu.nvml import collect_document

    return collect_document(nv, host=host, **kw)


def all_skipped(reason: str) -> list[dict[str, Any]]:
    return [skipped(cid, "gpu", title, reason) for cid, title in GPU_CHECKS]


def health(devices: list[dict[str, Any]], host: str) -> list[dict[str, Any]]:
    """Judge the idle snapshot: one record per concern, naming the GPUs that fail it."""
    bad_hw, notes_hw, bad_thr, notes_thr, bad_pcie_w, bad_nvl, notes_nvl = [], [], [], [], [], [], []
    for d in devices:
        label = device_label(host, d["index"])
        if d.get("lost"):
            bad_hw.append(label)
            notes_hw.append(f"{label} fell off the bus (NVML cannot reach it)")
            continue
        ecc, rr, rp = d.get("ecc") or {}, d.get("remapped_rows") or {}, d.get("retired_pages") or {}
        why = []
        if (ecc.get("volatile_uncorrected") or 0) > 0:
            why.append(f"{ecc['volatile_uncorrected']} volatile uncorrectable ECC")
        if (ecc.get("aggregate_uncorrected") or 0) > 0:
            why.append(f"{ecc['aggregate_uncorrected']} aggregate uncorrectable ECC")
        if rr.get("pending"):
            why.append("row remap pending (reset the GPU)")
        if rr.get("failure"):
            why.append("row remap failed")
        if rp.get("pending"):
            why.append("page retirement pending")
        if why:
            bad_hw.append(label)
            notes_hw.append(f"{label}: {', '.join(why)}")
        faults = [r for r in d.get("reasons") or [] if r in FAULT_REASONS]
        if faults:
            bad_thr.append(label)
            notes_thr.append(f"{label}: {', '.join(faults)}")
        pc = d.get("pcie") or {}
        if pc.get("width") and pc.get("width_max") and pc["width"] < pc["width_max"]:
            bad_pcie_w.append(label)
        nvl = d.get("nvlink") or {}
        if (nvl.get("error_total") or 0) > 0:
            bad_nvl.append(label)
            notes_nvl.append(f"{label}: {nvl['error_total']} NVLink error counts")
    n = len(devices)
    value = {"devices": [_brief(d) for d in devices]}
    out = []
    if bad_hw:
        out.append(result("gpu.health", "gpu", GPU_CHECKS[0][1], FAILED, "; ".join(notes_hw),
                          cause="gpu_hardware_fault", gpus=bad_hw, value=value))
    else:
        out.append(result("gpu.health", "gpu", GPU_CHECKS[0][1], PASSED,
                          f"{n} GPU(s): no uncorrectable ECC, no pending or failed row remap, no pending retirement",
                          value=value))
    if bad_thr:
        out.append(result("gpu.throttle", "gpu", GPU_CHECKS[2][1], FAILED,
                          "slowed down while idle: " + "; ".join(notes_thr), cause="gpu_throttling", gpus=bad_thr))
    else:
        out.append(result("gpu.throttle", "gpu", GPU_CHECKS[2][1], PASSED,
                          f"{n} GPU(s): no thermal, power-brake or hardware slowdown at idle"))
    if any((d.get("nvlink") or {}).get("links") for d in devices):
        if bad_nvl:
            out.append(result("gpu.nvlink", "gpu", GPU_CHECKS[4][1], FAILED, "; ".join(notes_nvl),
                              cause="gpu_hardware_fault", gpus=bad_nvl))
        else:
            out.append(result("gpu.nvlink", "gpu", GPU_CHECKS[4][1], PASSED, "no NVLink error counts"))
    else:
        out.append(skipped("gpu.nvlink", "gpu", GPU_CHECKS[4][1], "no NVLink reported by NVML"))
    out.append({"_pcie_width_bad": bad_pcie_w})
    return out


def _brief(d: dict[str, Any]) -> dict[str, Any]:
    out = {k: d.get(k) for k in ("index", "name", "pci_bus", "ecc", "remapped_rows", "retired_pages", "reasons",
                                 "pcie", "nvlink", "clocks", "max_clocks", "power", "temp", "util")}
    out["processes"] = len(d.get("processes") or [])
    return out


def busy_note(devices: list[dict[str, Any]], host: str) -> str:
    """Say so when a GPU was not idle before the measurements: its figures then include someone
    else's load (and the check slowed that work down), so they judge the sharing, not the GPU."""
    busy = [f"{device_label(host, d['index'])} ({len(d.get('processes') or [])} process(es), "
            f"{(d.get('util') or {}).get('gpu')} % busy)" for d in devices
            if d.get("processes") or ((d.get("util") or {}).get("gpu") or 0) > 5]
    return f"; not idle before the check: {', '.join(busy)}" if busy else ""


def _spawn(indices: list[int], quick: bool) -> list[subprocess.Popen[str]]:
    env = dict(os.environ)
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    return [subprocess.Popen([sys.executable, str(WORKER), str(i), "quick" if quick else "full"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             start_new_session=True) for i in indices]


def measure(nv: Any, host: str, devices: list[dict[str, Any]], quick: bool,
            timeout: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run the workers while sampling NVML; (per-GPU results, what NVML saw under load)."""
    indices = [d["index"] for d in devices if not d.get("lost")]
    procs = _spawn(indices, quick)
    seen: dict[str, Any] = {"xid": [], "gen_under_load": {}, "xid_errors": []}
    t0 = time.monotonic()
    deadline = t0 + timeout
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        doc = snapshot(nv, host, samples=2, interval=0.5, xid=True, nvlink=False, fields=False)
        seen["xid"].extend(doc.get("xid", {}).get("events") or [])
        if doc.get("xid", {}).get("error"):
            seen["xid_errors"].append(doc["xid"]["error"])
        for d in doc.get("devices") or []:
            gen = (d.get("pcie") or {}).get("gen")
            if gen is not None:
                seen["gen_under_load"][d["index"]] = max(gen, seen["gen_under_load"].get(d["index"], 0))
    seen["window_s"] = round(time.monotonic() - t0, 1)
    results = []
    for i, p in zip(indices, procs, strict=True):
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)  # our own worker, past its limit
            p.wait()
            results.append({"index": i, "error": f"no result within {timeout:.0f} s"})
            continue
        out, err = p.communicate()
        line = next((ln for ln in out.splitlines() if ln.startswith("{")), "")
        if p.returncode or not line:
            last = next((ln for ln in reversed(err.strip().splitlines()) if ln.strip()), "no output")
            results.append({"index": i, "error": f"exit {p.returncode}: {last[:300]}"})
            continue
        results.append(json.loads(line))
    return results, seen


def judge_load(devices: list[dict[str, Any]], host: str, results: list[dict[str, Any]], seen: dict[str, Any],
               pcie_width_bad: list[str]) -> list[dict[str, Any]]:
    """Xid, PCIe, matmul and bandwidth records from what the workers and NVML reported."""
    out = []
    xids = seen.get("xid") or []
    if xids:
        gpus = sorted({device_label(host, e.get("gpu")) for e in xids})
        codes = sorted({e.get("xid") for e in xids})
        out.append(result("gpu.xid", "gpu", GPU_CHECKS[1][1], FAILED, f"Xid {codes} during the check on {', '.join(gpus)}",
                          cause="gpu_hardware_fault", gpus=gpus, value={"events": xids}))
    elif seen.get("xid_errors") and not seen.get("gen_under_load"):
        out.append(skipped("gpu.xid", "gpu", GPU_CHECKS[1][1], f"NVML Xid events unavailable: {seen['xid_errors'][0]}"))
    else:
        out.append(result("gpu.xid", "gpu", GPU_CHECKS[1][1], PASSED,
                          f"no Xid event in the {seen.get('window_s', 0):g} s NVML watched the measurements"))
    bad_gen = []
    for d in devices:
        gmax, gload = (d.get("pcie") or {}).get("gen_max"), seen.get("gen_under_load", {}).get(d["index"])
        if gmax and gload and gload < gmax:
            bad_gen.append(device_label(host, d["index"]))
    pcie = {device_label(host, d["index"]): {**(d.get("pcie") or {}), "gen_under_load": seen.get("gen_under_load", {}).get(d["index"])}
            for d in devices}
    if bad_gen or pcie_width_bad:
        gpus = sorted(set(bad_gen) | set(pcie_width_bad))
        out.append(result("gpu.pcie", "gpu", GPU_CHECKS[3][1], FAILED,
                          f"link below its maximum generation under load or below its maximum width: {', '.join(gpus)}",
                          cause="gpu_pcie_degraded", gpus=gpus, value={"links": pcie}))
    else:
        out.append(result("gpu.pcie", "gpu", GPU_CHECKS[3][1], PASSED, "every link at its maximum width (and generation under load)",
                          value={"links": pcie}))
    out.extend(judge_matmul(host, results))
    return out


def judge_matmul(host: str, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per dtype: each GPU's best TFLOPS against its spec (``SPEC_MIN_SHARE``) and against the
    median of its peers (``PEER_MAX_GAP``); bandwidth likewise."""
    out = []
    failed_workers = [r for r in results if r.get("error")]
    ok = [r for r in results if not r.get("error")]
    if not ok:
        why = failed_workers[0]["error"] if failed_workers else "no GPU measured"
        return [skipped("gpu.matmul", "gpu", GPU_CHECKS[5][1], why), skipped("gpu.membw", "gpu", GPU_CHECKS[6][1], why)]
    dtypes = sorted({dt for r in ok for dt in r.get("matmul", {})})
    for dt in dtypes:
        rows = {device_label(host, r["index"]): (r["matmul"][dt]["tflops"], specs.lookup(r.get("name")))
                for r in ok if dt in r.get("matmul", {})}
        out.append(_compare(f"gpu.matmul.{dt}", f"matmul TFLOPS ({dt})", rows, dt, "TFLOPS", 1.0,
                            specs.SPEC_MIN_SHARE, {lab: r["matmul"][dt] for lab, r in
                                                   ((device_label(host, r["index"]), r) for r in ok if dt in r.get("matmul", {}))}))
    for r in ok:
        for dt, err in (r.get("errors") or {}).items():
            if dt != "membw" and dt not in dtypes:
                out.append(skipped(f"gpu.matmul.{dt}", "gpu", f"matmul TFLOPS ({dt})", err))
    rows = {device_label(host, r["index"]): (r["membw"]["Bps"] / 1e12, specs.lookup(r.get("name")))
            for r in ok if r.get("membw")}
    if rows:
        out.append(_compare("gpu.membw", GPU_CHECKS[6][1], rows, "mem", "TB/s", 1e-12, specs.MEM_MIN_SHARE, {}))
    else:
        out.append(skipped("gpu.membw", "gpu", GPU_CHECKS[6][1], ok[0].get("errors", {}).get("membw", "not measured")))
    for r in failed_workers:
        out.append(skipped(f"gpu.worker.{r['index']}", "gpu", f"measurement on {device_label(host, r['index'])}", r["error"]))
    return out


def _compare(cid: str, title: str, rows: dict[str, tuple[float, dict[str, Any] | None]], key: str, unit: str,
             scale: float, min_share: float, detail: dict[str, Any]) -> dict[str, Any]:
    """One record: each GPU's figure, its share of the spec, its gap to the peers' median."""
    bad, notes, value = [], [], {"gpus": {}, "unit": unit}
    for label, (got, spec) in rows.items():
        peak = None
        if spec is not None:
            peak = spec["mem_Bps"] * scale if key == "mem" else spec["tflops"].get(key)
        peers = [v for other, (v, _s) in rows.items() if other != label]
        med = statistics.median(peers) if peers else None
        entry: dict[str, Any] = {"value": got, "spec": peak, "share_of_spec": round(got / peak, 3) if peak else None,
                                 "peer_median": med, "model": spec["model"] if spec else None,
                                 "source": spec["source"] if spec else None, **({"best": detail[label]} if label in detail else {})}
        value["gpus"][label] = entry
        if peak and got < min_share * peak:
            bad.append(label)
            notes.append(f"{label} {got:.1f} {unit} is {got / peak:.0%} of the {spec['model']} spec {peak:g}")
        elif med and got < (1 - specs.PEER_MAX_GAP) * med:
            bad.append(label)
            notes.append(f"{label} {got:.1f} {unit} is {1 - got / med:.0%} below its peers' median {med:.1f}")
    figures = ", ".join(f"{lab} {v:.2f}" if unit == "TB/s" else f"{lab} {v:.0f}" for lab, (v, _s) in rows.items())
    if bad:
        return result(cid, "gpu", title, FAILED, "; ".join(notes), cause="gpu_underperforming", gpus=bad, value=value)
    spec0 = next((s for _v, s in rows.values() if s), None)
    ref = ""
    if spec0:
        peak0 = spec0["mem_Bps"] * scale if key == "mem" else spec0["tflops"].get(key)
        if peak0:
            ref = f" (spec {peak0:g} {unit}, {spec0['model']})"
    return result(cid, "gpu", title, PASSED, f"{figures} {unit}{ref}", value=value)


def run(host: str, quick: bool, wanted: list[int] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every GPU check; (records, {"n_gpus", "nvlink", "pci"}) for the communication and NUMA checks."""
    info: dict[str, Any] = {"n_gpus": 0, "nvlink": False, "pci": []}
    nv, why = open_nvml()
    if nv is None:
        return all_skipped(why), info
    try:
        idle = snapshot(nv, host, samples=0, xid=False)
        devices = [d for d in idle.get("devices") or [] if wanted is None or d["index"] in wanted]
        if not devices:
            return all_skipped("NVML sees no GPU" + (f" among {wanted}" if wanted else "")), info
        info = {"n_gpus": len(devices), "nvlink": any((d.get("nvlink") or {}).get("active") for d in devices),
                "pci": [(str(d["index"]), d.get("pci_bus") or "") for d in devices if d.get("pci_bus")]}
        recs = health(devices, host)
        width_bad = recs.pop()["_pcie_width_bad"]
        if importlib.util.find_spec("torch") is None:
            why = "torch is not installed in this Python (matmul and bandwidth run torch on the GPU)"
            recs += [skipped("gpu.xid", "gpu", GPU_CHECKS[1][1], why),
                     result("gpu.pcie", "gpu", GPU_CHECKS[3][1], FAILED if width_bad else PASSED,
                            f"width below maximum: {', '.join(width_bad)}" if width_bad else "every link at its maximum width",
                            cause="gpu_pcie_degraded", gpus=width_bad),
                     skipped("gpu.matmul", "gpu", GPU_CHECKS[5][1], why), skipped("gpu.membw", "gpu", GPU_CHECKS[6][1], why)]
            return recs, info
        results, seen = measure(nv, host, devices, quick, timeout=45.0 if quick else 900.0)
        note = busy_note(devices, host)
        for r in judge_load(devices, host, results, seen, width_bad):
            if note and r["id"].startswith(("gpu.matmul", "gpu.membw")) and r["status"] != "skipped":
                r["summary"] += note
            recs.append(r)
        return recs, info
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: S110 - shutting down a reader that already failed
            pass
