"""Host facts that decide whether a job can run well: cores, load, memory, /dev/shm, per-process
limits (memlock, open files), free disk, and kernel log lines about GPUs (Xid) and the OOM killer.

Read from /proc, statvfs and `dmesg` (which may be forbidden to non-root users: then the probe
says so and goes on). Offline it also reads `ulimit -a` output and /proc/PID/limits copies.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, ClassVar

from doctor.evidence import procfs
from doctor.evidence.contract import CollectContext, Hints, Parsed, Probe, Sample
from doctor.evidence.errors import EvidenceError
from doctor.evidence.redact import scrub

SCHEMA = "mldoctor.system/1"
KERNEL_RE = re.compile(r"NVRM: Xid|Out of memory: Kill|oom-kill|Killed process|hung_task|blocked for more than", re.I)
_LIMIT_ROW = re.compile(r"^Max (?P<name>[a-z ]+?)\s{2,}(?P<soft>\S+)\s+(?P<hard>\S+)", re.M)
_ULIMIT_ROW = re.compile(r"^(?P<name>[a-z][a-z ()-]+?)\s+\((?:-\w, )?(?P<unit>[^)]*)-(?P<flag>\w)\)\s+(?P<val>\S+)", re.M)
_LIMIT_KEYS = {"locked memory": "memlock", "open files": "nofile", "processes": "nproc"}
_ULIMIT_FLAGS = {"l": "memlock", "n": "nofile", "u": "nproc"}


def _num(v: str, scale: int = 1) -> int:
    return -1 if v in ("unlimited", "infinity") else int(v) * scale


def _proc_limits(text: str) -> dict[str, int]:
    out = {}
    for m in _LIMIT_ROW.finditer(text):
        key = _LIMIT_KEYS.get(m.group("name").strip())
        if key:
            out[key] = _num(m.group("soft"))
    return out


def _meminfo() -> dict[str, int]:
    info = procfs.meminfo()
    return {k: info[k] for k in ("MemTotal", "MemAvailable") if k in info}


class SystemProbe(Probe):
    name: ClassVar[str] = "system"
    title: ClassVar[str] = "Host limits and health"
    collects: ClassVar[str] = (
        "Cores and CPU affinity, load average, memory, /dev/shm size and use, per-rank limits "
        "(memlock, nofile, nproc), free space of each rank's working directory, and kernel log "
        "lines about Xid errors, the OOM killer and hung tasks."
    )
    priority: ClassVar[int] = 85
    build_order: ClassVar[int] = 20
    live_first_round: ClassVar[bool] = True
    follow_ups: ClassVar[dict[str, dict[str, Any]]] = {"system": {}}
    fixtures: ClassVar[tuple[str, ...]] = (
        "tests/fixtures/slow/*/bundle/hosts/*/system/system.json",
        "tests/fixtures/slurm/bundle_*/hosts/*/system/system.json",
    )
    facts_schema: ClassVar[dict[str, str]] = {
        "system.cores": "int: online CPUs of the host",
        "system.affinity_cores": "int: CPUs the ranks may run on (smallest affinity seen)",
        "system.load1": "float: 1-minute load average",
        "system.mem_total_mb": "float: host memory",
        "system.mem_available_mb": "float: memory available",
        "system.shm_bytes": "int: size of /dev/shm",
        "system.shm_used_bytes": "int: bytes used in /dev/shm",
        "system.limits": "map<string,int>: smallest soft limit across ranks: memlock (bytes), nofile, nproc; -1 unlimited",
        "system.by_rank": "map<string,map>: per-rank limits",
        "system.by_rank[].limits": "map<string,int>: the rank's soft limits: memlock (bytes), nofile, nproc; -1 unlimited",
        "system.by_rank[].affinity": "int: CPUs the rank may run on (its affinity mask)",
        "system.disk": "list<map>: free space where ranks work: path, free_bytes, total_bytes",
        "system.disk[].path": "string: mount or folder",
        "system.disk[].free_bytes": "int: bytes free",
        "system.disk[].total_bytes": "int: size",
        "system.kernel_events": "list<string>: kernel log lines about Xid, OOM kills, hung tasks (capped)",
        "system.kernel_log": "string: ok | unreadable (why) | absent",
        "system.hosts": "int: hosts that reported system facts",
    }

    def sniff(self, sample: Sample) -> bool:
        # bounded finds over the first 4000 characters: no copy of the head per file
        t = sample.text
        if t.find("locked memory", 0, 4000) == -1:  # both limit tables name it: one scan for most files
            return t.find(SCHEMA, 0, 400) != -1
        return (t.find(SCHEMA, 0, 400) != -1
                or (t.find("Max locked memory", 0, 4000) != -1 and t.find("Max open files", 0, 4000) != -1)
                or (t.find("max locked memory", 0, 4000) != -1 and t.find("open files", 0, 4000) != -1
                    and t.find("(-n)", 0, 4000) != -1))

    def parse(self, path: Path, rel: str, hints: Hints) -> Parsed:
        text = path.read_text(errors="replace")
        if SCHEMA in text[:400]:
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                raise EvidenceError(rel, f"not valid JSON ({exc})") from None
            return Parsed(self.name, rel, data, None, data.get("host") or hints.host)
        if "Max locked memory" in text:
            limits = _proc_limits(text)
        else:
            limits = {}
            for m in _ULIMIT_ROW.finditer(text):
                key = _ULIMIT_FLAGS.get(m.group("flag"))
                if key:
                    scale = 1024 if key == "memlock" and "kbytes" in m.group("unit") else 1
                    limits[key] = _num(m.group("val"), scale)
        if not limits:
            raise EvidenceError(rel, "no limits found")
        return Parsed(self.name, rel, {"limits_only": limits}, hints.rank, hints.host)

    def collect(self, ctx: CollectContext) -> None:
        doc: dict[str, Any] = {"schema": SCHEMA, "host": ctx.host, "wall": time.time()}
        doc["cores"] = os.cpu_count() or 0
        doc["load"] = list(os.getloadavg())
        mem = _meminfo()
        doc["mem_total"], doc["mem_available"] = mem.get("MemTotal", 0), mem.get("MemAvailable", 0)
        try:
            st = os.statvfs("/dev/shm")
            doc["shm_bytes"] = st.f_blocks * st.f_frsize
            doc["shm_used_bytes"] = (st.f_blocks - st.f_bfree) * st.f_frsize
        except OSError:
            doc["shm_bytes"] = None
        ranks: dict[str, Any] = {}
        disks: dict[str, Any] = {}
        for p in ctx.ranks:
            entry: dict[str, Any] = {}
            limits_text = procfs.read_text(p.pid, "limits")
            entry["limits"] = (_proc_limits(limits_text) if limits_text else None) or {}
            try:
                entry["affinity"] = len(os.sched_getaffinity(p.pid))
            except OSError:
                pass
            cwd = procfs.link(p.pid, "cwd")
            if cwd is not None:
                try:
                    st = os.statvfs(cwd)
                    disks[cwd] = {"path": cwd, "free_bytes": st.f_bavail * st.f_frsize,
                                  "total_bytes": st.f_blocks * st.f_frsize}
                except OSError:
                    pass
            ranks[str(p.rank)] = entry
        doc["ranks"] = ranks
        doc["disk"] = list(disks.values())
        doc["kernel_events"], doc["kernel_log"] = self._kernel_lines()
        ctx.add("system.json", json.dumps(doc, indent=1))

    @staticmethod
    def _kernel_lines() -> tuple[list[str], str]:
        exe = shutil.which("dmesg")
        if not exe:
            return [], "absent (no dmesg)"
        try:
            res = subprocess.run([exe, "--ctime", "--nopager"], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return [], f"unreadable ({exc})"
        if res.returncode != 0:
            why = (res.stderr.strip().splitlines() or ["permission denied"])[0]
            return [], f"unreadable ({why[:120]}; run as root or set kernel.dmesg_restrict=0)"
        lines = [scrub(ln.strip()) for ln in res.stdout.splitlines() if KERNEL_RE.search(ln)]
        return lines[-200:], "ok"

    def build(self, parsed: list[Parsed], facts: dict[str, Any]) -> None:
        out: dict[str, Any] = {"kernel_events": [], "kernel_log": "absent", "by_rank": {}, "disk": []}
        limits: dict[str, int] = {}
        affinity: list[int] = []
        hosts = set()

        def take(key: str, value: int) -> None:
            if value == -1:
                limits.setdefault(key, -1)
            elif limits.get(key, -1) == -1 or value < limits[key]:
                limits[key] = value

        for p in parsed:
            d = p.data
            if "limits_only" in d:
                for k, v in d["limits_only"].items():
                    take(k, v)
                if p.rank is not None:
                    out["by_rank"].setdefault(str(p.rank), {})["limits"] = d["limits_only"]
                continue
            hosts.add(d.get("host", ""))
            out["cores"] = max(int(out.get("cores", 0)), int(d.get("cores") or 0))
            load = d.get("load") or [0.0]
            out["load1"] = max(float(out.get("load1", 0.0)), float(load[0]))
            if d.get("mem_total"):
                out["mem_total_mb"] = round(d["mem_total"] / 2**20, 1)
                out["mem_available_mb"] = round(d.get("mem_available", 0) / 2**20, 1)
            if d.get("shm_bytes") is not None:
                out["shm_bytes"] = min(int(out.get("shm_bytes", d["shm_bytes"])), int(d["shm_bytes"]))
                out["shm_used_bytes"] = max(int(out.get("shm_used_bytes", 0)), int(d.get("shm_used_bytes") or 0))
            for rank, entry in (d.get("ranks") or {}).items():
                out["by_rank"][rank] = entry
                for k, v in (entry.get("limits") or {}).items():
                    take(k, int(v))
                if entry.get("affinity"):
                    affinity.append(int(entry["affinity"]))
            out["disk"].extend(d.get("disk") or [])
            out["kernel_events"].extend(d.get("kernel_events") or [])
            out["kernel_log"] = d.get("kernel_log", "absent")
        if limits:
            out["limits"] = limits
        if affinity:
            out["affinity_cores"] = min(affinity)
        out["kernel_events"] = out["kernel_events"][-200:]
        out["hosts"] = len(hosts)
        facts["system"] = out


PROBE = SystemProbe()
