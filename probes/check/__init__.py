"""The ``check`` evidence kind: active node checks (``mldoctor check``) as evidence.

Observation tells what a job did; a check measures what the node can do (shared memory, limits,
governor, memory, storage, GPU health and throughput, rank-to-rank communication). Each check's
record says ``passed``, ``failed`` (with the taxonomy cause it points to) or ``skipped`` (with
why it could not run). The records are written as one artifact, so a check report goes through
the same facts, rules, findings, playbooks and report as a diagnosis, and a bundle of several
nodes' checks (SLURM) is merged like any other evidence. Skipped is never counted as passed.
"""

from __future__ import annotations

import json
import socket
import statistics
import time
from pathlib import Path
from typing import Any, ClassVar

from doctor.probes.check import comm, gpu, host
from doctor.probes.check.result import FAILED, PASSED, SKIPPED, MiB, skipped, timed
from doctor.probes.check.spec import PEER_MAX_GAP

from doctor.evidence.contract import CollectContext, Hints, Parsed, Probe, Sample
from doctor.evidence.errors import EvidenceError
from doctor.evidence.sections import Cell, Row, Section, SectionContext, Table

SCHEMA = "mldoctor.check/1"
_SCHEMA_FIELD = f'"schema": "{SCHEMA}"'


def run_checks(options: dict[str, Any], host_name: str | None = None) -> dict[str, Any]:
    """Every check of the level asked for, in the order that keeps the GPUs idle for the idle
    readings: host, GPU (idle snapshot, then load), NUMA (needs the GPUs' PCI ids), communication
    last (it loads the GPUs again). Returns the artifact document."""
    quick = options.get("level", "quick") != "full"
    name = host_name or socket.gethostname()
    t0 = time.time()
    records: list[dict[str, Any]] = []
    records += timed(host.shm)
    records += timed(host.ulimits)
    records += timed(host.governor)
    records += timed(host.memory)
    path = options.get("path")
    if path:
        size = int(options.get("io_bytes") or (256 if quick else 2048) * MiB)
        records += timed(lambda: host.folder_io(Path(path), size))
    info: dict[str, Any] = {"n_gpus": 0, "nvlink": False, "pci": []}

    def gpus() -> list[dict[str, Any]]:
        recs, found = gpu.run(name, quick, options.get("gpus") or None)
        info.update(found)
        return recs

    if options.get("skip_gpu"):
        records += gpu.all_skipped("GPU checks not asked for (--no-gpu)")
    else:
        records += timed(gpus)
    records += timed(lambda: host.numa_affinity(info["pci"]))
    if options.get("skip_comm"):
        why = "communication checks not asked for (--no-comm)"
        records += [skipped("comm.connect", "comm", "rank-to-rank connectivity", why),
                    skipped("comm.busbw", "comm", "all_reduce bus bandwidth", why)]
    else:
        records += timed(lambda: comm.run(info["n_gpus"], info["nvlink"], quick, options.get("nprocs")))
    for r in records:
        r["host"] = name
    return {"schema": SCHEMA, "host": name, "level": "quick" if quick else "full", "started": round(t0, 3),
            "seconds": round(time.time() - t0, 3), "checks": records}


class CheckProbe(Probe):
    name: ClassVar[str] = "check"
    title: ClassVar[str] = "Active node checks"
    collects: ClassVar[str] = (
        "Results of `mldoctor check`: /dev/shm, ulimits, CPU governor, free memory, folder "
        "throughput, GPU-NUMA affinity, NVML health, matmul TFLOPS and memory bandwidth per GPU, "
        "rank-to-rank connectivity and all_reduce bus bandwidth; each passed, failed or skipped."
    )
    priority: ClassVar[int] = 95
    build_order: ClassVar[int] = 60
    max_bytes: ClassVar[int] = 16 * 1024 * 1024
    shows_state: ClassVar[bool] = True
    fixtures: ClassVar[tuple[str, ...]] = ("tests/fixtures/check/*/check.json",)
    facts_schema: ClassVar[dict[str, str]] = {
        "check.hosts": "list<string>: hosts whose check results were read",
        "check.level": "string: quick or full (the deepest level among the hosts)",
        "check.counts": "map<string,int>: number of checks passed, failed and skipped (skipped is never a pass)",
        "check.checks": "list<map>: every check of every host",
        "check.checks[].id": "string: check id (host.shm, comm.busbw, gpu.matmul.bf16, ...)",
        "check.checks[].group": "string: host, gpu, comm",
        "check.checks[].title": "string: what was checked",
        "check.checks[].status": "string: passed, failed or skipped",
        "check.checks[].summary": "string: the measured result in one line",
        "check.checks[].cause": "string: taxonomy cause of a failed check (empty otherwise)",
        "check.checks[].reason": "string: why a skipped check could not run",
        "check.checks[].host": "string: host the check ran on",
        "check.checks[].gpus": "list<string>: GPUs a failed check names (host:gpuN)",
        "check.checks[].seconds": "float: time the check took",
        "check.checks[].value": "any: the measured numbers (sizes, limits, TFLOPS, bandwidths, sweeps)",
        "check.by_cause": "map<string,map>: failed checks grouped by taxonomy cause",
        "check.by_cause[].summaries": "list<string>: host-prefixed one-line results of the failed checks",
        "check.by_cause[].hosts": "list<string>: hosts with a failed check of this cause",
        "check.by_cause[].gpus": "list<string>: GPUs named by those checks",
        "check.by_cause[].checks": "list<string>: ids of those checks",
        "check.outlier_hosts": "list<string>: hosts with a failed check while other hosts passed that check",
    }

    def sniff(self, sample: Sample) -> bool:
        text = sample.text
        if text.find(_SCHEMA_FIELD, 0, 400) == -1:  # a bounded find first: no copy of the head per file
            return False
        return text[:400].lstrip().startswith("{")

    def parse(self, path: Path, rel: str, hints: Hints) -> Parsed:
        try:
            doc = json.loads(path.read_text(encoding="utf-8", errors="replace"))
        except json.JSONDecodeError as exc:
            raise EvidenceError(rel, f"not valid JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("checks"), list):
            raise EvidenceError(rel, f"not a {SCHEMA} document (no checks list)")
        checks = [c for c in doc["checks"] if isinstance(c, dict) and c.get("status") in (PASSED, FAILED, SKIPPED)]
        return Parsed(self.name, rel, {**doc, "checks": checks}, host=str(doc.get("host") or hints.host or ""))

    def build(self, parsed: list[Parsed], facts: dict[str, Any]) -> None:
        checks: list[dict[str, Any]] = []
        hosts: list[str] = []
        level = "quick"
        for p in parsed:
            hosts.append(p.host or "")
            level = "full" if p.data.get("level") == "full" else level
            for c in p.data["checks"]:
                checks.append({
                    "id": str(c.get("id") or ""), "group": str(c.get("group") or ""), "title": str(c.get("title") or ""),
                    "status": c["status"], "summary": str(c.get("summary") or ""),
                    "cause": str(c.get("cause") or "") if c["status"] == FAILED else "",
                    "reason": str(c.get("reason") or ""), "host": str(c.get("host") or p.host or ""),
                    "gpus": [str(g) for g in c["gpus"]] if isinstance(c.get("gpus"), list) else [],
                    "seconds": float(c["seconds"]) if isinstance(c.get("seconds"), (int, float)) else 0.0,
                    "value": c.get("value") if isinstance(c.get("value"), dict) else {},
                })
        counts = {s: sum(1 for c in checks if c["status"] == s) for s in (PASSED, FAILED, SKIPPED)}
        by_cause: dict[str, dict[str, Any]] = {}
        for c in checks:
            if c["status"] != FAILED or not c["cause"]:
                continue
            e = by_cause.setdefault(c["cause"], {"summaries": [], "hosts": [], "gpus": [], "checks": []})
            e["summaries"].append(f"{c['host']}: {c['summary']}" if len(hosts) > 1 else c["summary"])
            for key, val in (("hosts", [c["host"]]), ("gpus", c["gpus"]), ("checks", [c["id"]])):
                e[key] += [v for v in val if v and v not in e[key]]
        if len(set(hosts)) > 1:
            self._cross_host_peers(checks, by_cause)
        # an outlier: failed a check that the same check passed on some other host
        passed_on: dict[str, set[str]] = {}
        for c in checks:
            if c["status"] == PASSED:
                passed_on.setdefault(c["id"], set()).add(c["host"])
        outliers = sorted({c["host"] for c in checks if c["status"] == FAILED
                           and passed_on.get(c["id"], set()) - {c["host"]}})
        facts[self.name] = {"hosts": sorted(set(hosts)), "level": level, "counts": counts, "checks": checks,
                            "by_cause": by_cause, "outlier_hosts": outliers}

    @staticmethod
    def _cross_host_peers(checks: list[dict[str, Any]], by_cause: dict[str, dict[str, Any]]) -> None:
        """Merged nodes: each node compared its GPUs with each other; here every GPU of the same
        model is compared with the median of all of them, so a node whose GPUs are all slow
        (a power cap set node-wide, a bad firmware) stands out too."""
        series: dict[tuple[str, str], list[tuple[str, str, float]]] = {}
        for c in checks:
            if not c["id"].startswith(("gpu.matmul.", "gpu.membw")) or c["status"] == SKIPPED:
                continue
            for label, entry in ((c.get("value") or {}).get("gpus") or {}).items():
                if isinstance(entry, dict) and isinstance(entry.get("value"), (int, float)):
                    series.setdefault((c["id"], str(entry.get("model") or "")), []).append(
                        (c["host"], label, float(entry["value"])))
        for (cid, _model), vals in series.items():
            if len(vals) < 3 or len({h for h, _l, _v in vals}) < 2:
                continue
            med = statistics.median(v for _h, _l, v in vals)
            for h, label, v in vals:
                if med and v < (1 - PEER_MAX_GAP) * med:
                    e = by_cause.setdefault("gpu_underperforming", {"summaries": [], "hosts": [], "gpus": [], "checks": []})
                    e["summaries"].append(f"{h}: {label} {cid} {v:.1f} is {1 - v / med:.0%} below the median "
                                          f"{med:.1f} of {len(vals)} GPUs across the nodes")
                    for key, val in (("hosts", h), ("gpus", label), ("checks", cid)):
                        if val not in e[key]:
                            e[key].append(val)

    def collect(self, ctx: CollectContext) -> None:
        doc = run_checks(ctx.options, ctx.host)
        ctx.add("check.json", json.dumps(doc, indent=1))

    def unexplained_state(self, facts: dict[str, Any]) -> dict[str, str] | None:
        """No check passed (all skipped): nothing was verified, so the node is not "healthy"."""
        counts = (facts.get(self.name) or {}).get("counts") or {}
        if counts and not counts.get(PASSED) and not counts.get(FAILED):
            return {"state": "unknown", "what": "every check was skipped",
                    "summary": "No check could run (all skipped); nothing about this node was verified."}
        return None

    def job_label(self, facts: dict[str, Any]) -> str:
        hosts = (facts.get(self.name) or {}).get("hosts") or []
        return f"check-{hosts[0]}" if len(hosts) == 1 else ("check" if hosts else "")

    def host_names(self, facts: dict[str, Any]) -> list[str]:
        return list((facts.get(self.name) or {}).get("hosts") or [])

    def report_sections(self, facts: dict[str, Any], context: SectionContext) -> list[Section]:
        ns = facts.get(self.name) or {}
        checks = ns.get("checks") or []
        if not checks:
            return []
        multi = len(ns.get("hosts") or []) > 1
        rows = []
        for c in checks:
            shown = c["summary"] if c["status"] != SKIPPED else f"skipped: {c['reason']}"
            cells = [Cell(c["id"], code=True)] + ([Cell(c["host"])] if multi else []) + [Cell(c["status"]), Cell(shown)]
            rows.append(Row(cells, marks=["LOOK"] if c["status"] == FAILED else ()))
        counts = ns.get("counts") or {}
        summary = (f"{counts.get(PASSED, 0)} passed, {counts.get(FAILED, 0)} failed, "
                   f"{counts.get(SKIPPED, 0)} skipped (skipped checks are not passes)")
        cols = ["check"] + (["host"] if multi else []) + ["status", "result"]
        return [Section("check", "Active checks", Table(cols, rows, noun="check", legend="LOOK = the check failed"),
                        order=5, nav="Checks", summary=summary,
                        note="Measured on the node now; a failed check names the cause its finding explains.")]


PROBE = CheckProbe()
