"""torch.profiler tables as evidence: where the profiled steps spent their time.

People asked why a job is slow paste ``prof.key_averages().table(...)`` (format in
:mod:`.table`). Its rows name the cause directly when one dominates: time in
``enumerate(DataLoader)#...`` is the step waiting for its batch, ``aten::item`` /
``aten::_local_scalar_dense`` / ``cudaStreamSynchronize`` called every step is the host
reading tensors back, ``dynamo`` / ``(dynamo_timed)`` rows inside the profiled steps are
torch.compile compiling again, NCCL kernels are communication. This probe turns one or more
tables into shares of the profiled step time (the ``ProfilerStep*`` row's CPU total, the wall
time of the steps on the main thread; without it the table's own percentages, which are
relative to the summed self CPU time) and leaves the judgement to the rules.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar

from doctor.evidence.contract import Hints, Parsed, Probe, Sample, read_whole
from doctor.evidence.errors import EvidenceError
from doctor.evidence.sections import Section, SectionContext

from . import report
from .lightning import is_report, parse_report
from .table import header_line, parse_tables

#: CUDA runtime calls that block the host until the device has finished (NVIDIA CUDA runtime
#: API: cudaStreamSynchronize / cudaDeviceSynchronize / cudaEventSynchronize "blocks until ...").
_SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
#: the aten ops behind Tensor.item() / .tolist() / bool(tensor): a device->host read that syncs
_ITEM_OPS = ("aten::item", "aten::_local_scalar_dense")
#: record_function names of compilation inside the profiled steps: torch._dynamo's
#: ``dynamo_timed`` spans (``_compile.compile_inner (dynamo_timed)``, ``compile_attempt_N``) and
#: the top-level ``dynamo`` span; what they hold is compile work, not running compiled code
#: (that is ``Torch-Compiled Region`` / ``CompiledFunction``, deliberately not counted).
_COMPILE_RX = re.compile(r"\(dynamo_timed\)$|^dynamo$|^compile_attempt_\d+|^entire_frame_compile|^inductor_compile")
#: the spans whose call count is the number of frames compiled
_COMPILE_ENTRY_RX = re.compile(r"^_compile\.compile_inner|^dynamo$|^entire_frame_compile")
_DATALOADER_RX = re.compile(r"^enumerate\(DataLoader\)#")
_NCCL_KERNEL_RX = re.compile(r"^(?:void )?nccl(?:Dev)?Kernel|^ncclKernel|^ncclDevKernel", re.I)
_COMM_CPU_RX = re.compile(r"^(?:nccl|gloo|c10d):|^c10d::", re.I)
_PIN_RX = re.compile(r"^aten::_?pin_memory$")
#: Seconds of batch fetching credited to start-up: the first fetch starts the DataLoader's worker
#: processes (and a Lightning report covers the whole fit from its first batch), which costs
#: 0.1 s (fork, measured: 4 workers on the H200 host) to seconds (spawn, large datasets pickled to
#: each worker). A short window of a healthy job would otherwise read as starved: a 40-step fit
#: with 4 prefetching workers spent 16% of its loop in train_dataloader_next, nearly all of it
#: in the first call. mldoctor proposal; the raw share stays in ``dataloader_raw``.
STARTUP_ALLOWANCE_US = 1.0e6


class ProfilerProbe(Probe):
    name: ClassVar[str] = "profiler"
    title: ClassVar[str] = "torch.profiler tables and Lightning profiler reports"
    collects: ClassVar[str] = (
        "Tables printed by torch.profiler / torch.autograd.profiler (key_averages().table()) and "
        "Lightning's SimpleProfiler report: the "
        "ops with the most self time, and the share of the profiled steps spent waiting for "
        "batches, reading tensors back to the host, compiling, communicating and copying."
    )
    priority: ClassVar[int] = 72  # a table is not a log: ahead of the generic text readers
    build_order: ClassVar[int] = 60
    max_bytes: ClassVar[int] = 16 * 1024 * 1024
    fixtures: ClassVar[tuple[str, ...]] = (
        "tests/fixtures/profiler/cpu/cpu-*.txt",
        "tests/fixtures/profiler/h200/cuda-*.txt",
        "tests/fixtures/profiler/h200/lightning-*.txt",
    )
    facts_schema: ClassVar[dict[str, str]] = {
        "profiler.tables": "int: profiler tables and reports read",
        "profiler.device": "string: device of the device-time columns (cuda, xpu, ...); '' for CPU-only tables",
        "profiler.steps": "int: profiled steps (calls of ProfilerStep*), 0 when the table has no step rows",
        "profiler.step_us": "float: CPU total of ProfilerStep* in us (wall time of the profiled steps); 0 without step rows",
        "profiler.self_cpu_us": "float: the table's 'Self CPU time total'",
        "profiler.self_device_us": "float: the table's 'Self CUDA time total' (0 for CPU-only tables)",
        "profiler.top": "list<map>: up to 5 rows with the most self time (device time when the table has it): name, share, calls",
        "profiler.top[].name": "string: op, kernel or record_function name as printed",
        "profiler.top[].share": "float: its share of the self time total, 0-1",
        "profiler.top[].calls": "int: # of Calls",
        "profiler.shares": "map<string,float>: share of the profiled step time, 0-1: dataloader (batch fetching less a 1 s start-up allowance), dataloader_raw, host_sync, compile, comm_cpu, copy, pin_memory; comm_device and dtoh_device as shares of device time",
        "profiler.host_sync_per_step": "float: blocking device->host reads (aten::item or CUDA synchronize calls, whichever is more) per profiled step",
        "profiler.host_sync_rows": "list<string>: the sync rows counted",
        "profiler.compiles": "int: frames compiled inside the profiled window (calls of _compile.compile_inner / dynamo)",
        "profiler.gpu_busy": "float: device time / step wall time (Self CUDA time total over ProfilerStep* CPU total); null without both",
        "profiler.by_table": "list<map>: per table: rel, steps, shares, gpu_busy",
        "profiler.by_table[].rel": "string: where the table came from",
        "profiler.by_table[].steps": "int: ProfilerStep* calls",
        "profiler.by_table[].shares": "map<string,float>: the table's shares",
        "profiler.by_table[].gpu_busy": "float: the table's device busy share, or null",
    }

    #: A training log that printed a table among its lines stays the logs kind's (its errors
    #: matter more); the table in it is read here too.
    also_reads: ClassVar[frozenset[str] | None] = frozenset({"logs"})

    def sniff(self, sample: Sample) -> bool:
        # the file IS a table: its separator or header within the first few lines (a title line
        # or a shell prompt may come first); both markers are exact strings of _build_table
        t = sample.text
        if t.find("Mean duration (s)", 0, 4000) != -1:  # Lightning's SimpleProfiler report
            head = "\n".join([ln for ln in t[:4000].splitlines() if ln.strip()][:6])
            return is_report(head)
        if t.find("Self CPU", 0, 4000) == -1 or not _has_markers(t, 4000):
            return False
        head_lines = [ln for ln in t[:4000].splitlines() if ln.strip()][:6]
        return any(header_line(ln) for ln in head_lines)

    def also_sniff(self, sample: Sample) -> bool:
        t = sample.text
        if sample.is_binary:
            return False
        if t.find("Mean duration (s)", 0, 65536) != -1 and is_report(t):
            return True
        return t.find("Self CPU", 0, 65536) != -1 and _has_markers(t, 65536) \
            and any(header_line(ln) for ln in t.splitlines() if "Self CPU" in ln)

    def parse(self, path: Path, rel: str, hints: Hints) -> Parsed:
        text = read_whole(path).decode("utf-8", errors="replace")
        summaries = [summarize(t) for t in parse_tables(text)]
        report = parse_report(text) if is_report(text) else None
        if report is not None:
            summaries.append(report)
        if not summaries:
            raise EvidenceError(rel, "a profiler table header without rows that read")
        return Parsed(self.name, rel, {"tables": summaries}, hints.rank, hints.host)

    def build(self, parsed: list[Parsed], facts: dict[str, Any]) -> None:
        per: list[dict[str, Any]] = []
        for p in parsed:
            for t in p.data["tables"]:
                per.append({**t, "rel": p.path})
        if not per:
            return
        shares: dict[str, float] = {}
        for t in per:
            for k, v in t["shares"].items():
                shares[k] = max(shares.get(k, 0.0), v)
        busy = [t["gpu_busy"] for t in per if t["gpu_busy"] is not None]
        lead = max(per, key=lambda t: (t["steps"] > 0, t["self_device_us"], t["self_cpu_us"]))
        facts[self.name] = {
            "tables": len(per),
            "device": next((t["device"] for t in per if t["device"]), ""),
            "steps": max(t["steps"] for t in per),
            "step_us": lead["step_us"],
            "self_cpu_us": lead["self_cpu_us"],
            "self_device_us": lead["self_device_us"],
            "top": lead["top"],
            "shares": shares,
            "host_sync_per_step": max(t["host_sync_per_step"] for t in per),
            "host_sync_rows": sorted({r for t in per for r in t["host_sync_rows"]}),
            "compiles": max(t["compiles"] for t in per),
            "gpu_busy": min(busy) if busy else None,
            "by_table": [{"rel": t["rel"], "steps": t["steps"], "shares": t["shares"], "gpu_busy": t["gpu_busy"]}
                         for t in per],
        }

    def report_sections(self, facts: dict[str, Any], context: SectionContext) -> list[Section]:
        return report.sections(facts)


def _has_markers(t: str, end: int) -> bool:
    """The calls column (new or old name), a CPU total column and a dashed separator."""
    return (t.find("# of Calls", 0, end) != -1 or t.find("Number of Calls", 0, end) != -1) \
        and t.find("CPU total", 0, end) != -1 and t.find("-----", 0, end) != -1


def _share(part: float, whole: float) -> float:
    return round(min(1.0, part / whole), 4) if whole > 0 else 0.0


def summarize(tab: dict[str, Any]) -> dict[str, Any]:
    """One table's facts: shares of the profiled step time by what the rows name."""
    rows = tab["rows"]
    has_dev = any("self_dev" in r for r in rows)
    self_cpu = tab.get("self_cpu_us") or sum(r["self_cpu"] for r in rows)
    self_dev = tab.get("self_dev_us") or sum(r.get("self_dev", 0.0) for r in rows)
    # ProfilerStep* comes twice with device time: the CPU span (its CPU total is the steps' wall
    # time) and its copy on the GPU track; either one counts the steps
    step_rows = [r for r in rows if r["name"] == "ProfilerStep*"]
    steps = max((r["calls"] for r in step_rows), default=0)
    step_us = max((r.get("cpu_total", 0.0) for r in step_rows), default=0.0)
    # the reference for CPU-side shares: the steps' wall time, else the summed self CPU time
    # (the table's own percentages are relative to it)
    ref = step_us or self_cpu

    def total_of(rx: re.Pattern[str] | tuple[str, ...], key: str = "cpu_total") -> tuple[float, list[dict[str, Any]]]:
        hit = [r for r in rows if (r["name"] in rx if isinstance(rx, tuple) else rx.search(r["name"]))]
        return sum(r.get(key, 0.0) for r in hit), hit

    dl, dl_rows = total_of(_DATALOADER_RX)
    item_t, item_rows = total_of(("aten::item",))
    if not item_rows:
        item_t, item_rows = total_of(("aten::_local_scalar_dense",))
    sync_t, sync_rows = total_of(_SYNC_CALLS, "self_cpu")
    # a synchronize called once in the window (the profiler's own flush at the end) is no habit
    # of the loop: only calls made at least once per profiled step count
    per_step = steps or 2
    sync_rows = [r for r in sync_rows if r["calls"] >= per_step]
    sync_t = sum(r["self_cpu"] for r in sync_rows)
    item_rows = [r for r in item_rows if r["calls"] >= per_step]
    item_t = sum(r["cpu_total"] for r in item_rows)
    reads = max([r["calls"] for r in item_rows + sync_rows], default=0)
    comp_rows = [r for r in rows if _COMPILE_RX.search(r["name"])]
    comp_t = max((r["cpu_total"] for r in comp_rows), default=0.0)
    compiles = max((r["calls"] for r in rows if _COMPILE_ENTRY_RX.search(r["name"])), default=0)
    comm_cpu = max((r["cpu_total"] for r in rows if _COMM_CPU_RX.search(r["name"])), default=0.0)
    nccl_dev, _ = total_of(_NCCL_KERNEL_RX, "self_dev")
    dtoh, _ = total_of(re.compile(r"^Memcpy DtoH"), "self_dev")
    copy_t, _ = total_of(("aten::copy_",), "self_cpu")
    pin_t, _ = total_of(_PIN_RX)
    shares = {
        "dataloader": _share(max(0.0, dl - STARTUP_ALLOWANCE_US), ref) if dl_rows else 0.0,
        "dataloader_raw": _share(dl, ref), "host_sync": _share(max(item_t, sync_t), ref),
        "compile": _share(comp_t, ref), "comm_cpu": _share(comm_cpu, ref),
        "copy": _share(copy_t, ref), "pin_memory": _share(pin_t, ref),
    }
    if has_dev:
        shares["comm_device"] = _share(nccl_dev, self_dev)
        shares["dtoh_device"] = _share(dtoh, self_dev)
    sort_key = "self_dev" if has_dev else "self_cpu"
    total = self_dev if has_dev else self_cpu
    # the device-annotation copy of ProfilerStep* spans the steps on the GPU track: not an op
    ops = [r for r in rows if r["name"] != "ProfilerStep*"]
    top = sorted(ops, key=lambda r: r.get(sort_key, 0.0), reverse=True)[:5]
    return {
        "device": tab.get("device") or "",
        "steps": steps, "step_us": step_us, "self_cpu_us": self_cpu, "self_device_us": self_dev,
        "shares": shares,
        "host_sync_per_step": round(reads / steps, 2) if steps else float(reads),
        "host_sync_rows": [r["name"] for r in item_rows + sync_rows],
        "compiles": compiles,
        # the device queue can run past the CPU's step ends: capped at 1 (fully busy)
        "gpu_busy": round(min(1.0, self_dev / step_us), 3) if has_dev and step_us > 0 else None,
        "top": [{"name": r["name"], "share": _share(r.get(sort_key, 0.0), total), "calls": r["calls"]} for r in top],
    }


PROBE = ProfilerProbe()
