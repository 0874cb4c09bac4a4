"""Host tool output pasted into a ticket: ``top``/``htop`` summaries, ``uptime``, ``mpstat``,
``iostat -x``, ``vmstat``, ``free``, ``lscpu``: the CPU, I/O and memory pressure of the host.

Formats (procps-ng and sysstat manuals):

- ``top`` batch/summary area (top(1), "SUMMARY Display",
  https://man7.org/linux/man-pages/man1/top.1.html): ``top - 10:00:00 up 3 days, ... load
  average: 1.00, 0.50, 0.25``; ``%Cpu(s):  99.5 us,  0.5 sy, 0.0 ni, 0.0 id, 0.0 wa, 0.0 hi,
  0.0 si, 0.0 st`` (older ``Cpu(s):``, per CPU ``%Cpu0  :``); ``MiB Mem :``/``KiB Mem :`` and
  ``MiB Swap: total, free, used. avail Mem``.
- ``uptime`` (uptime(1)): the same ``load average:`` triple, 1, 5 and 15 minutes.
- htop's header (htop(1)): ``Load average: a b c`` and ``Swp[|||  used/total]``.
- ``vmstat`` (vmstat(8), https://man7.org/linux/man-pages/man8/vmstat.8.html): ``r`` runnable
  processes (running or waiting for a CPU), ``b`` blocked in uninterruptible sleep, ``si``/``so``
  swapped in/out per second, ``us sy id wa st`` CPU shares; the first line is the average since
  boot.
- ``mpstat`` (sysstat mpstat(1), https://man7.org/linux/man-pages/man1/mpstat.1.html): header
  ``Linux <ver> (<host>) <date> _x86_64_ (16 CPU)``, then ``CPU %usr %nice %sys %iowait ...
  %idle`` rows, ``Average:`` rows at the end.
- ``iostat -x`` (sysstat iostat(1), https://man7.org/linux/man-pages/man1/iostat.1.html):
  ``avg-cpu:  %user %nice %system %iowait %steal %idle`` then a value row; device rows with
  ``%util``; the first report covers the time since boot. %iowait is the share of time the CPUs
  were idle while the system had an outstanding disk I/O request.
- ``free`` (free(1)): ``Mem:`` and ``Swap:`` rows under ``total used free shared buff/cache
  available``, in KiB, or the unit of ``-m``/``-g``/``-h``.
- ``lscpu``: ``CPU(s):  16``.
- top's task area and process table (top(1) "2c. TASK and CPU States", "3. FIELDS"): ``Tasks: 312
  total,  70 running, ...`` (``Threads:`` with ``-H``), then the ``PID USER PR NI VIRT RES SHR S
  %CPU %MEM TIME+ COMMAND`` header and one row per process, %CPU in per cent of one CPU (Irix
  mode, the default: a process with 16 busy threads shows 1600); htop's ``Tasks: 55, 1530 thr; 64
  running`` and its ``CPU%`` column. The running count is the run queue now, like vmstat's r.

Several tools in one paste are read together; the facts are the worst reading of each kind
(the highest load, iowait, swap use), because a paste is taken while the job is slow.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any, ClassVar

from doctor.probes import host_tools_report

from doctor.evidence.contract import Hints, Parsed, Probe, Sample, read_whole
from doctor.evidence.errors import EvidenceError
from doctor.evidence.sections import Section, SectionContext

_LOAD = re.compile(r"load averages?:\s*([\d.]+),?\s+([\d.]+),?\s+([\d.]+)", re.I)
_TOP_CPU = re.compile(r"^%?Cpu\(s\):\s*(.*)$", re.M)
_TOP_PERCPU = re.compile(r"%Cpu\d+\s*:")  # top -1 prints one or two CPUs a line
_TOP_MEM = re.compile(r"^(KiB|MiB|GiB)\s+(Mem|Swap)\s*:\s*(.*)$", re.M)
_HTOP_SWP = re.compile(r"Swp\[[|\s]*([\d.]+)([KMGT])?/([\d.]+)([KMGT])?\]")
_MPSTAT_HEAD = re.compile(r"^Linux \S+ \(([^)]*)\)\s+\S+\s+_\w+_\s+\((\d+) CPU\)", re.M)
_LSCPU = re.compile(r"^CPU\(s\):\s+(\d+)\s*$", re.M)
_VMSTAT_HEAD = re.compile(r"^\s*r\s+b\s+swpd\s+free\s+(?:buff|inact)\s+(?:cache|active)\s+si\s+so\b.*$", re.M)
_FREE_HEAD = re.compile(r"^\s+total\s+used\s+free\s+shared\s+(?:buff/cache|buffers).*$", re.M)
_FREE_ROW = re.compile(r"^(Mem|Swap):\s+(.*)$", re.M)
#: the first line of each tool's output (procps top/uptime/vmstat/free, htop, sysstat, lscpu)
_OPENERS = (
    re.compile(r"^(?:top - )?\d{1,2}:\d{2}(?::\d{2})?\s+up\b.*load averages?:", re.I),
    re.compile(r"^\s*(?:\d+\s*\[.*\]\s*)*Load average:\s*[\d.]+\s+[\d.]+\s+[\d.]+"),
    re.compile(r"^procs\s+-+memory-+"),
    _VMSTAT_HEAD,
    _MPSTAT_HEAD,
    re.compile(r"^avg-cpu:\s+%user"),
    _FREE_HEAD,
    re.compile(r"^Architecture:\s+\w+"),
)
_TOP_TASKS = re.compile(r"^(?:Tasks|Threads):\s*(\d+)\s+total,\s*(\d+)\s+running", re.M)
_HTOP_TASKS = re.compile(r"Tasks:\s*(\d+),\s*(\d+)\s+(?:thr|kthr)\b[^;\n]*;\s*(\d+)\s+running")
_PROC_HEAD = re.compile(r"^\s*PID\s+USER\s+PRI?\s+NI\b.*?(%CPU|CPU%).*$", re.M)
_PROMPT = re.compile(r"^(?:\$|#|>|\w[\w.@-]*[$#%])\s+\S")
_UNIT_MB = {"": 1 / 1024, "K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 ** 2}
_SCALE_MB = {"KiB": 1 / 1024, "MiB": 1.0, "GiB": 1024.0}


def _head_lines(text: str) -> list[str]:
    """The first non-blank lines, a shell prompt line (``$ uptime``) skipped."""
    out = []
    for ln in text.splitlines():
        if not ln.strip():
            continue
        if not out and _PROMPT.match(ln) and len(out) == 0 and not ln.lstrip().startswith("#!"):
            out.append("")  # keep the count, drop the prompt
            continue
        out.append(ln.rstrip())
        if len(out) >= 3:
            break
    return out


def _f(x: str) -> float | None:
    try:
        return float(x.replace(",", "."))
    except ValueError:
        return None


def _size_mb(tok: str, default_unit: str) -> float | None:
    """A free(1) value: a plain number in the table's unit, or ``1.5Gi`` / ``512Mi`` with -h."""
    m = re.fullmatch(r"([\d.,]+)([KMGT]i?)?B?", tok)
    if not m:
        return None
    v = _f(m.group(1))
    if v is None:
        return None
    unit = (m.group(2) or default_unit)[:1]
    return v * _UNIT_MB.get(unit, 1.0)


class HostToolsProbe(Probe):
    name: ClassVar[str] = "host_tools"
    title: ClassVar[str] = "Host tools (top, uptime, vmstat, mpstat, iostat, free)"
    collects: ClassVar[str] = (
        "Pasted output of top/htop, uptime, vmstat, mpstat, iostat -x, free and lscpu: load averages, "
        "runnable threads, CPU shares (user, system, iowait, steal), swap use and activity, disk "
        "utilization, and the core count when a tool prints it."
    )
    priority: ClassVar[int] = 68  # recognizable shapes; ahead of the generic text readers
    build_order: ClassVar[int] = 25  # after system (20): its core count fills a gap here
    fixtures: ClassVar[tuple[str, ...]] = (
        "tests/fixtures/host_tools/h200/*/top.txt",
        "tests/fixtures/host_tools/h200/*/uptime.txt",
        "tests/fixtures/host_tools/h200/*/vmstat.txt",
        "tests/fixtures/host_tools/h200/*/free-*.txt",
        "tests/fixtures/host_tools/h200/*/lscpu.txt",
        "tests/fixtures/host_tools/local/*/*.txt",
    )
    facts_schema: ClassVar[dict[str, str]] = {
        "host_tools.tools": "list<string>: tools whose output was read: top, htop, uptime, vmstat, mpstat, iostat, free, lscpu",
        "host_tools.cores": "int: CPUs of the host (mpstat header, lscpu, top's per-CPU lines, else the system kind's count); 0 unknown",
        "host_tools.load1": "float: highest 1-minute load average read",
        "host_tools.load15": "float: 15-minute load average of the same reading",
        "host_tools.load_per_core": "float: load1 / cores (0 when cores unknown)",
        "host_tools.runnable": "float: vmstat r (runnable: running or waiting for a CPU), median of the interval lines (the first, since boot, skipped when others follow)",
        "host_tools.runnable_per_core": "float: runnable / cores (0 when either is unknown)",
        "host_tools.cpu": "map<string,float>: worst interval's CPU shares in %: user, system, iowait, idle, steal",
        "host_tools.iowait_pct": "float: highest %iowait / wa read (since-boot reports skipped when an interval report follows)",
        "host_tools.blocked": "float: vmstat b (uninterruptible sleep, usually I/O), median of the interval lines",
        "host_tools.mem_total_mb": "float: host memory (only when the unit is known: top, free -h, or a pasted free command)",
        "host_tools.mem_available_mb": "float: memory available (free's available, top's avail Mem)",
        "host_tools.swap_total_mb": "float: swap size",
        "host_tools.swap_used_mb": "float: swap in use",
        "host_tools.swap_used_frac": "float: share of the swap in use (0-1)",
        "host_tools.mem_available_frac": "float: available / total memory (0-1), the lowest read",
        "host_tools.swap_io": "float: vmstat si + so (pages swapped in and out per second), median of the interval lines",
        "host_tools.disk_util_max": "float: highest iostat -x %util of a device",
        "host_tools.disk_util_device": "string: that device",
        "host_tools.running": "float: tasks running or runnable now (top's Tasks/Threads line, htop's 'N running'), the highest read",
        "host_tools.threads_total": "int: threads on the host (htop's 'N thr', top -H's Threads total), 0 unknown",
        "host_tools.procs_listed": "int: process rows read from a top/htop process table",
        "host_tools.procs_busy": "int: of those, rows using more than 1.5 CPUs (%CPU > 150: a multi-threaded pool at work)",
        "host_tools.proc_cpu_max": "float: the highest %CPU of one process row (per cent of one CPU; 1600 = 16 CPUs busy)",
        "host_tools.proc_cpu_sum": "float: the sum of %CPU over the rows (per cent of one CPU)",
        "host_tools.running_per_core": "float: running / cores (0 when either is unknown)",
    }

    def sniff(self, sample: Sample) -> bool:
        # Claimed only when the tool's own first line opens the file (after a shell prompt line
        # at most): a log that merely quotes an uptime line stays the logs kind's.
        if sample.is_binary:
            return False
        t = sample.text
        if t.find("PyTorch version: ", 0, 4000) != -1:
            return False  # torch's collect_env report (its lscpu part included) is the env kind's
        if t.find("load", 0, 2000) == -1 and t.find("CPU", 0, 2000) == -1 and t.find("swpd", 0, 2000) == -1 \
                and t.find("total", 0, 2000) == -1:
            return False
        head = _head_lines(t[:2000])
        return any(rx.match(ln) or rx.match(ln.lstrip()) for ln in head for rx in _OPENERS)

    def parse(self, path: Path, rel: str, hints: Hints) -> Parsed:
        text = read_whole(path).decode("utf-8", errors="replace")
        data: dict[str, Any] = {"tools": []}
        _top(text, data)
        _vmstat(text, data)
        _mpstat(text, data)
        _iostat(text, data)
        _free(text, data)
        _tasks(text, data)
        m = _LSCPU.search(text)
        if m:
            data["cores"] = int(m.group(1))
            data["tools"].append("lscpu")
        if not data["tools"]:
            raise EvidenceError(rel, "no host tool output recognized")
        return Parsed(self.name, rel, data, hints.rank, hints.host)

    def build(self, parsed: list[Parsed], facts: dict[str, Any]) -> None:
        out: dict[str, Any] = {"tools": [], "cores": 0, "load1": 0.0, "load15": 0.0, "cpu": {}, "iowait_pct": 0.0}
        for p in parsed:
            d = p.data
            out["tools"] += [t for t in d["tools"] if t not in out["tools"]]
            out["cores"] = max(out["cores"], int(d.get("cores") or 0))
            if d.get("load") and d["load"][0] >= out["load1"]:
                out["load1"], out["load15"] = d["load"][0], d["load"][2]
            for key in ("running", "threads_total", "procs_listed", "procs_busy", "proc_cpu_max", "proc_cpu_sum"):
                if d.get(key) is not None:
                    out[key] = max(out.get(key, 0), d[key])
            for key in ("runnable", "blocked", "swap_io", "swap_used_mb", "swap_total_mb", "mem_total_mb",
                        "disk_util_max", "swap_used_frac"):
                if d.get(key) is not None:
                    out[key] = max(float(out.get(key, 0.0)), float(d[key]))
            if d.get("disk_util_max") is not None and d["disk_util_max"] >= out.get("disk_util_max", 0.0):
                out["disk_util_device"] = d.get("disk_util_device", "")
            if d.get("mem_available_frac") is not None:
                cur = out.get("mem_available_frac")
                out["mem_available_frac"] = d["mem_available_frac"] if cur is None else min(cur, d["mem_available_frac"])
            if d.get("mem_available_mb") is not None:
                cur = out.get("mem_available_mb")
                out["mem_available_mb"] = d["mem_available_mb"] if cur is None else min(cur, d["mem_available_mb"])
            for cpu in d.get("cpu", []):
                out["iowait_pct"] = max(out["iowait_pct"], cpu.get("iowait", 0.0))
                if not out["cpu"] or cpu.get("idle", 100.0) < out["cpu"].get("idle", 100.0):
                    out["cpu"] = cpu
        if not out["cores"]:
            out["cores"] = int((facts.get("system") or {}).get("cores") or 0)
        cores = out["cores"]
        out["load_per_core"] = round(out["load1"] / cores, 2) if cores else 0.0
        out["runnable_per_core"] = round(out.get("runnable", 0.0) / cores, 2) if cores else 0.0
        out["running_per_core"] = round(float(out.get("running", 0)) / cores, 2) if cores else 0.0
        facts[self.name] = out

    def report_sections(self, facts: dict[str, Any], context: SectionContext) -> list[Section]:
        return host_tools_report.sections(facts)


def _top(text: str, data: dict[str, Any]) -> None:
    m = _LOAD.search(text)
    if m:
        data["load"] = [float(m.group(i)) for i in (1, 2, 3)]
        low = text.lower()
        data["tools"].append("top" if "tasks:" in low and "cpu" in low else
                             "htop" if "Load average:" in text else "uptime")
    cpu_rows = []
    for m in _TOP_CPU.finditer(text):
        vals = dict((k, v) for v, k in re.findall(r"([\d.,]+)\s*(us|sy|ni|id|wa|hi|si|st)\b", m.group(1)))
        if vals:
            cpu_rows.append({"user": _f(vals.get("us", "0")) or 0.0, "system": _f(vals.get("sy", "0")) or 0.0,
                             "iowait": _f(vals.get("wa", "0")) or 0.0, "idle": _f(vals.get("id", "0")) or 0.0,
                             "steal": _f(vals.get("st", "0")) or 0.0})
    if cpu_rows:
        data.setdefault("cpu", []).extend(cpu_rows)
    per_cpu = len(_TOP_PERCPU.findall(text))
    if per_cpu >= 2:
        data["cores"] = per_cpu
    for m in _TOP_MEM.finditer(text):
        scale = _SCALE_MB[m.group(1)]
        nums = dict((k.strip().rstrip("."), _f(v)) for v, k in re.findall(r"([\d.,]+)\s+(total|free|used|avail Mem)", m.group(3)))
        if m.group(2) == "Mem" and nums.get("total"):
            data["mem_total_mb"] = round(nums["total"] * scale, 1)
        if m.group(2) == "Swap":
            data["swap_total_mb"] = round((nums.get("total") or 0.0) * scale, 1)
            data["swap_used_mb"] = round((nums.get("used") or 0.0) * scale, 1)
            tot = nums.get("total") or 0.0
            data["swap_used_frac"] = round((nums.get("used") or 0.0) / tot, 3) if tot else 0.0
            if nums.get("avail Mem") is not None:
                data["mem_available_mb"] = round(nums["avail Mem"] * scale, 1)
                if data.get("mem_total_mb"):
                    data["mem_available_frac"] = round(data["mem_available_mb"] / data["mem_total_mb"], 3)
    m = _HTOP_SWP.search(text)
    if m:
        data["swap_used_mb"] = _f(m.group(1)) * _UNIT_MB.get(m.group(2) or "K", 1.0)  # type: ignore[operator]
        data["swap_total_mb"] = _f(m.group(3)) * _UNIT_MB.get(m.group(4) or "K", 1.0)  # type: ignore[operator]
        data["swap_used_frac"] = round(data["swap_used_mb"] / data["swap_total_mb"], 3) if data["swap_total_mb"] else 0.0


def _vmstat(text: str, data: dict[str, Any]) -> None:
    m = _VMSTAT_HEAD.search(text)
    if not m:
        return
    cols = m.group(0).split()
    rows = []
    for ln in text[m.end():].splitlines()[1:]:
        parts = ln.split()
        if len(parts) != len(cols) or not all(p.lstrip("-").isdigit() for p in parts):
            if rows:
                break
            continue
        rows.append(dict(zip(cols, (int(p) for p in parts), strict=True)))
    if not rows:
        return
    data["tools"].append("vmstat")
    rows = rows[1:] if len(rows) > 1 else rows  # the first line averages since boot
    data["runnable"] = float(statistics.median(r["r"] for r in rows))
    data["blocked"] = float(statistics.median(r["b"] for r in rows))
    data["swap_io"] = float(statistics.median(r.get("si", 0) + r.get("so", 0) for r in rows))
    worst = min(rows, key=lambda r: r.get("id", 100))
    data.setdefault("cpu", []).append({"user": float(worst.get("us", 0)), "system": float(worst.get("sy", 0)),
                                       "iowait": float(max(r.get("wa", 0) for r in rows)),
                                       "idle": float(worst.get("id", 0)), "steal": float(worst.get("st", 0))})


def _mpstat(text: str, data: dict[str, Any]) -> None:
    m = _MPSTAT_HEAD.search(text)
    if not m:
        return
    data["cores"] = int(m.group(2))
    data["tools"].append("mpstat")
    header: list[str] = []
    alls = []
    for ln in text.splitlines():
        parts = ln.split()
        if "%usr" in parts or "%user" in parts:
            header = parts
            continue
        if header and "all" in parts:
            # rows start with a time (one or two fields) or "Average:"; align on the right
            vals = parts[len(parts) - (len(header) - header.index("CPU") - 1):] if "CPU" in header else []
            names = header[header.index("CPU") + 1:] if "CPU" in header else []
            rec = dict(zip(names, (_f(v) or 0.0 for v in vals), strict=False))
            alls.append((parts[0].startswith("Average"), rec))
    avg = [r for is_avg, r in alls if is_avg]
    use = avg or [r for _, r in alls][1:] or [r for _, r in alls]
    for r in use:
        data.setdefault("cpu", []).append({
            "user": r.get("%usr", r.get("%user", 0.0)), "system": r.get("%sys", r.get("%system", 0.0)),
            "iowait": r.get("%iowait", 0.0), "idle": r.get("%idle", 0.0), "steal": r.get("%steal", 0.0)})


def _iostat(text: str, data: dict[str, Any]) -> None:
    lines = text.splitlines()
    reports = []
    blocks: list[tuple[float, str] | None] = []  # the busiest device of each report
    for i, ln in enumerate(lines):
        if ln.lstrip().startswith("avg-cpu:") and i + 1 < len(lines):
            names = ln.split()[1:]
            vals = [_f(v) for v in lines[i + 1].split()]
            if len(vals) == len(names) and all(v is not None for v in vals):
                reports.append(dict(zip(names, vals, strict=True)))
        if re.match(r"^\s*Device:?\s", ln) and "%util" in ln:
            names = ln.split()
            best: tuple[float, str] | None = None
            j = i + 1
            while j < len(lines) and lines[j].strip():
                parts = lines[j].split()
                if len(parts) == len(names):
                    u = _f(parts[names.index("%util")])
                    if u is not None and (best is None or u > best[0]):
                        best = (u, parts[0])
                j += 1
            blocks.append(best)
    if not reports:
        return
    data["tools"].append("iostat")
    for r in (reports[1:] if len(reports) > 1 else reports):  # the first report averages since boot
        data.setdefault("cpu", []).append({"user": r.get("%user", 0.0), "system": r.get("%system", 0.0),
                                           "iowait": r.get("%iowait", 0.0), "idle": r.get("%idle", 0.0),
                                           "steal": r.get("%steal", 0.0)})
    now = [b for b in (blocks[1:] if len(blocks) > 1 else blocks) if b is not None]
    if now:
        data["disk_util_max"], data["disk_util_device"] = max(now)


def _free(text: str, data: dict[str, Any]) -> None:
    m = _FREE_HEAD.search(text)
    if not m:
        return
    cols = m.group(0).split()
    # the unit: -h prints suffixes on each value; else KiB unless the user said -m/-g
    # the unit: -h prints suffixes on each value; a pasted command line names -m/-g; without
    # either the unit is unknown (KiB by default, but people paste free -g without the command),
    # so only the shares are kept then
    cmd = re.search(r"free\s+-\w*([kmgt])", text)
    unit = cmd.group(1).upper() if cmd else "K"
    sized = bool(cmd) or bool(re.search(r"\d[KMGT]i\b", text[m.start():]))
    for row in _FREE_ROW.finditer(text[m.start():]):
        vals = [_size_mb(v, unit) for v in row.group(2).split()]
        rec = dict(zip(cols, vals, strict=False))
        if row.group(1) == "Mem" and rec.get("total"):
            data["mem_available_frac"] = round((rec.get("available") or 0.0) / rec["total"], 3) \
                if rec.get("available") is not None else None
            if sized:
                data["mem_total_mb"] = round(rec["total"], 1)
                if rec.get("available") is not None:
                    data["mem_available_mb"] = round(rec["available"], 1)
        elif row.group(1) == "Swap" and rec.get("total") is not None:
            data["swap_used_frac"] = round((rec.get("used") or 0.0) / rec["total"], 3) if rec["total"] else 0.0
            data["swap_any"] = bool(rec.get("used"))
            if sized:
                data["swap_total_mb"] = round(rec["total"], 1)
                data["swap_used_mb"] = round(rec.get("used") or 0.0, 1)
    if "mem_available_frac" in data or "swap_used_frac" in data:
        data["tools"].append("free")


def _tasks(text: str, data: dict[str, Any]) -> None:
    """top's ``Tasks:``/``Threads:`` line, htop's ``Tasks: N, M thr; R running`` and the process
    table under a ``PID USER PR NI ... %CPU`` header: how many threads are runnable now and how
    many CPUs each listed process keeps busy (%CPU is per cent of one CPU in top's Irix mode)."""
    for m in _TOP_TASKS.finditer(text):
        data["running"] = max(float(data.get("running", 0.0)), float(m.group(2)))
        if m.group(0).startswith("Threads"):
            data["threads_total"] = max(int(data.get("threads_total", 0)), int(m.group(1)))
    for m in _HTOP_TASKS.finditer(text):
        data["running"] = max(float(data.get("running", 0.0)), float(m.group(3)))
        data["threads_total"] = max(int(data.get("threads_total", 0)), int(m.group(2)))
    head = _PROC_HEAD.search(text)
    if head:
        names = head.group(0).split()
        col = names.index(head.group(1))
        cpus = []
        for ln in text[head.end():].splitlines()[1:]:
            parts = ln.split()
            if not parts:
                if cpus:
                    break
                continue
            if len(parts) < len(names) - 1 or not parts[0].isdigit():
                break
            v = _f(parts[col])
            if v is not None:
                cpus.append(v)
        if cpus:
            data["procs_listed"] = len(cpus)
            data["procs_busy"] = sum(1 for v in cpus if v > 150.0)
            data["proc_cpu_max"] = max(cpus)
            data["proc_cpu_sum"] = round(sum(cpus), 1)
    if "running" in data or "procs_listed" in data:
        if not any(t in data["tools"] for t in ("top", "htop")):
            data["tools"].append("htop" if "thr;" in text or "CPU%" in text else "top")


PROBE = HostToolsProbe()
