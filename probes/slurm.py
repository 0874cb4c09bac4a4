"""What SLURM knows about the job: ``scontrol show job``, ``sacct --parsable2`` and ``squeue``
output, and the record of mldoctor's own fan-out over the job's nodes.

The scheduler's view answers questions the processes cannot: is the job still RUNNING, did a
step end FAILED or NODE_FAIL (and with which exit code or signal), when did it start, which
nodes does it hold, why does it wait. The fan-out record (written by ``doctor/live/slurm.py`` when it
runs ``mldoctor collect`` on every node through srun) says which nodes answered, and which did
not: a node that does not answer is itself evidence (dead node, hung kernel, full disk).

Offline the probe reads the three commands' saved output (by content, whatever the file name);
live it runs them once (from the host that diagnoses, never from every node: 1,024 nodes asking
slurmctld at once is the kind of load a controller suffers from).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from itertools import product
from pathlib import Path
from typing import Any, ClassVar

from doctor.evidence.contract import (
    CollectContext,
    Hints,
    Parsed,
    Probe,
    ProbeFailed,
    ProbeSkipped,
    Sample,
)
from doctor.evidence.errors import EvidenceError

FANOUT_SCHEMA = "mldoctor.slurm-fanout/1"
SACCT_FORMAT = "JobID,JobName,Partition,State,ExitCode,DerivedExitCode,NNodes,NodeList,Start,End,Elapsed"
#: The step name of mldoctor's own collectors (doctor/live/slurm.py): never evidence against the job.
OWN_STEP = "mldoctor-collect"
MAX_HOSTS = 200_000  # a host list expression expanding past this is refused (a typo, not a cluster)
#: Step/job states that mean processes ended badly (sacct/scontrol spelling, man sacct "JOB STATE CODES").
BAD_STATES = ("FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL")
SQUEUE_CODES = {
    "PD": "PENDING", "R": "RUNNING", "CG": "COMPLETING", "CD": "COMPLETED", "CA": "CANCELLED",
    "F": "FAILED", "TO": "TIMEOUT", "NF": "NODE_FAIL", "PR": "PREEMPTED", "OOM": "OUT_OF_MEMORY",
    "S": "SUSPENDED", "ST": "STOPPED", "BF": "BOOT_FAIL", "DL": "DEADLINE", "RQ": "REQUEUED",
    "RH": "REQUEUE_HOLD", "RF": "REQUEUE_FED", "RS": "RESIZING", "RD": "RESV_DEL_HOLD", "RV": "REVOKED",
    "SE": "SPECIAL_EXIT", "SI": "SIGNALING", "SO": "STAGE_OUT", "CF": "CONFIGURING",
}
_KEY = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_/:]*)=")
_EMPTY = ("", "(null)", "None", "Unknown", "N/A", "n/a")
_SACCT_HEADER = re.compile(r"^\s*JobID(?:Raw)?\b")


# -- small readers -----------------------------------------------------------------------------
def expand_hostlist(expr: str) -> list[str]:
    """``node[01-03,7],gpu-a[1-2]-b[1-2]`` -> the host names, in SLURM's order.

    Comma-separated items; each may hold several bracket groups (every combination, the last
    varying fastest); ranges keep their zero padding. Refuses more than ``MAX_HOSTS`` names.
    """
    expr = (expr or "").strip()
    if expr in _EMPTY:
        return []
    items, depth, cur = [], 0, ""
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    out: list[str] = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        parts = re.split(r"(\[[^\]]*\])", item)
        choices: list[list[str]] = []
        for part in parts:
            if part.startswith("[") and part.endswith("]"):
                vals: list[str] = []
                for rng in part[1:-1].split(","):
                    lo, sep, hi = rng.strip().partition("-")
                    if not lo.isdigit() or (sep and not hi.isdigit()):
                        raise ValueError(f"bad range {rng!r} in host list {expr!r}")
                    if not sep:
                        vals.append(lo)
                        continue
                    width = len(lo) if lo.startswith("0") else 0
                    if int(hi) - int(lo) > MAX_HOSTS:
                        raise ValueError(f"host list {expr!r} is too large")
                    vals.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
                choices.append(vals)
            elif part:
                choices.append([part])
        count = 1
        for c in choices:
            count *= len(c)
        if len(out) + count > MAX_HOSTS:
            raise ValueError(f"host list {expr!r} is too large")
        out.extend("".join(combo) for combo in product(*choices))
    return out


def duration_s(text: str) -> int | None:
    """``[D-]HH:MM:SS``, ``MM:SS`` or ``MM`` (SLURM durations) -> seconds; None for UNLIMITED/unknown."""
    text = (text or "").strip()
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+)(?::(\d+))?(?:\.\d+)?", text)
    if not m or text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    days, a, b, c = (int(g) if g else 0 for g in m.groups())
    if m.group(4) is not None:  # [D-]HH:MM:SS
        return days * 86400 + a * 3600 + b * 60 + c
    if m.group(2) is not None:  # MM:SS, or D-HH:MM
        return days * 86400 + (a * 3600 + b * 60 if m.group(1) else a * 60 + b)
    return days * 86400 + (b * 3600 if m.group(1) else b * 60)


def exit_code(text: str) -> tuple[int | None, int | None]:
    """``1:0`` (status:signal) -> (1, 0)."""
    m = re.fullmatch(r"\s*(\d+):(\d+)\s*", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def _value(v: str | None) -> str:
    v = (v or "").strip()
    return "" if v in _EMPTY else v


def parse_scontrol_jobs(text: str) -> list[dict[str, Any]]:
    """``scontrol show job [-d] [-o]``: one dict per job (keys as printed), with ``_nodes`` detail lines."""
    records: list[str] = []
    for line in text.splitlines():
        if line.lstrip().startswith("JobId="):
            records.append(line)
        elif records:
            records[-1] += "\n" + line
    jobs = []
    for rec in records:
        job: dict[str, Any] = {"_nodes": []}
        for line in rec.splitlines():
            keys = list(_KEY.finditer(line))
            pairs = {}
            for i, m in enumerate(keys):
                end = keys[i + 1].start() if i + 1 < len(keys) else len(line)
                pairs[m.group(1)] = line[m.end():end].strip()
            if "Nodes" in pairs and "CPU_IDs" in pairs:  # -d detail: Nodes=node[1-2] CPU_IDs=0-1 Mem=0 GRES=
                job["_nodes"].append(pairs)
                continue
            job.update(pairs)
        jobs.append(job)
    return jobs


def parse_sacct(text: str) -> list[dict[str, str]]:
    """``sacct --parsable2`` (or ``--parsable``, or the default fixed-width table) with its header."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines or not _SACCT_HEADER.match(lines[0]):
        raise ValueError("no sacct header line (JobID|...); keep the header (no --noheader)")
    head = lines[0]
    rows: list[dict[str, str]] = []
    if "|" in head:
        cols = [c.strip() for c in head.rstrip("|").split("|")]
        for ln in lines[1:]:
            vals = ln.rstrip("\n")
            vals = vals[:-1] if vals.endswith("|") and vals.count("|") == len(cols) else vals
            parts = vals.split("|")
            if len(parts) != len(cols):
                continue
            rows.append(dict(zip(cols, (p.strip() for p in parts), strict=True)))
        return rows
    if len(lines) < 2 or not set(lines[1].strip()) <= {"-", " "}:
        raise ValueError("sacct table without its ---- line; use --parsable2")
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", lines[1])]
    cols = [head[a:b].strip() for a, b in spans]
    for ln in lines[2:]:
        rows.append({c: ln[a:b].strip() for c, (a, b) in zip(cols, spans, strict=True)})
    return rows


def parse_squeue(text: str) -> list[dict[str, str]]:
    """``squeue`` (default, ``-l`` or ``-o`` with a header): one dict per job line."""
    lines = text.splitlines()
    heads = [i for i, ln in enumerate(lines[:3])
             if "JOBID" in ln.split() and ("ST" in ln.split() or "STATE" in ln.split())]
    if not heads:
        raise ValueError("no squeue header line (JOBID ... ST|STATE ...)")
    cols = lines[heads[0]].split()
    rows = []
    for ln in lines[heads[0] + 1:]:
        parts = ln.split(None, len(cols) - 1)
        if len(parts) == len(cols):
            rows.append(dict(zip(cols, parts, strict=True)))
    return rows


def _job_key(job_id: str) -> str:
    """``4242.0`` / ``4242.batch`` -> ``4242``; ``4242_7.0`` -> ``4242_7``."""
    return re.split(r"[.]", job_id.strip(), maxsplit=1)[0]


# -- the probe ---------------------------------------------------------------------------------
class SlurmProbe(Probe):
    name: ClassVar[str] = "slurm"
    title: ClassVar[str] = "SLURM job record"
    collects: ClassVar[str] = (
        "The job's SLURM record from `scontrol show job -d`, `sacct --parsable2` (steps, states, exit "
        "codes) and `squeue`, run once from the diagnosing host; plus mldoctor's fan-out record "
        "(which nodes answered `mldoctor collect`, which did not and why). Paths in the record are "
        "kept; no environment."
    )
    priority: ClassVar[int] = 80
    build_order: ClassVar[int] = 30
    follow_ups: ClassVar[dict[str, dict[str, Any]]] = {"slurm": {}}
    max_bytes: ClassVar[int] = 64 * 1024 * 1024
    fixtures: ClassVar[tuple[str, ...]] = (
        "tests/fixtures/slurm/*/sacct.txt",
        "tests/fixtures/slurm/*/scontrol-show-job.txt",
        "tests/fixtures/slurm/*/squeue.txt",
        "tests/fixtures/slurm/bundle_*/slurm/*",
    )
    facts_schema: ClassVar[dict[str, str]] = {
        "slurm.job_id": "string: the job id (array jobs: 4242_7)",
        "slurm.name": "string: job name",
        "slurm.state": "string: job state as SLURM says it: RUNNING, PENDING, COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, ...",
        "slurm.reason": "string: SLURM's reason for the state (pending reason, failure reason), empty when None",
        "slurm.exit_code": "string: the job's ExitCode status:signal, e.g. 1:0",
        "slurm.exit_status": "int: exit status part of the exit code (-1 unknown)",
        "slurm.exit_signal": "int: signal part of the exit code (-1 unknown)",
        "slurm.restarts": "int: times the job was requeued",
        "slurm.nodes": "int: number of nodes the job holds (or asked for)",
        "slurm.node_list": "list<string>: the job's nodes, expanded, in SLURM's order",
        "slurm.node_list_expr": "string: the job's node list as SLURM writes it (node[1-2])",
        "slurm.batch_host": "string: node running the batch script",
        "slurm.start_time": "string: start time as SLURM prints it (local time, ISO-like), empty when unknown",
        "slurm.end_time": "string: end time, empty while running",
        "slurm.run_time_s": "int: seconds the job has run (-1 unknown)",
        "slurm.time_limit_s": "int: the job's time limit in seconds (0 unlimited, -1 unknown)",
        "slurm.steps": "list<map>: job steps from sacct: id, name, state, exit_code, exit_status, exit_signal, nodes, node_expr, n_nodes, elapsed_s",
        "slurm.steps[].id": "string: step id (4242.0, 4242.batch, 4242.extern)",
        "slurm.steps[].state": "string: step state (CANCELLED by N is CANCELLED)",
        "slurm.steps[].exit_status": "int: the step's exit status (-1 unknown)",
        "slurm.steps[].exit_signal": "int: the signal that ended the step (0 none, -1 unknown)",
        "slurm.steps[].nodes": "list<string>: the step's nodes, expanded",
        "slurm.steps[].name": "string: step name (batch, extern, the command)",
        "slurm.steps[].exit_code": "string: status:signal as SLURM prints it (1:0), empty when unknown",
        "slurm.steps[].node_expr": "string: the step's nodes as SLURM writes them (node[1-2]), empty when unknown",
        "slurm.steps[].n_nodes": "int: nodes the step ran on",
        "slurm.steps[].elapsed_s": "int: the step's run time in seconds",
        "slurm.failed_steps": f"list<map>: steps (or the job itself) whose state is one of {', '.join(BAD_STATES)} (mldoctor's own collect steps left out): id, state, exit_code, nodes, node_expr",
        "slurm.failed_steps[].id": "string: step id, or the job id when only the job record says it",
        "slurm.failed_steps[].state": "string: the bad state",
        "slurm.failed_steps[].exit_code": "string: status:signal as SLURM prints it (1:0), empty when unknown",
        "slurm.failed_steps[].nodes": "list<string>: the step's nodes, expanded",
        "slurm.failed_steps[].node_expr": "string: the step's nodes as SLURM writes them (node[1-2]), empty when unknown",
        "slurm.sources": "list<string>: what was read: scontrol, sacct, squeue, fanout",
        "slurm.fanout": "map: how mldoctor's own srun fan-out over the job's nodes went (live collection only)",
        "slurm.fanout.asked": "list<string>: nodes mldoctor asked to collect (srun over the job's nodes)",
        "slurm.fanout.answered": "list<string>: nodes whose fragment came back whole",
        "slurm.fanout.node_timeout_s": "float: seconds every node had to answer",
        "slurm.fanout.wall_s": "float: seconds from srun start to the last fragment (or the deadline)",
        "slurm.fanout.collect_s": "map<string,float>: per answering node, seconds its collection took",
        "slurm.nodes_missing": "list<string>: nodes asked that sent no usable fragment (did not answer in time, failed to launch, or broke)",
        "slurm.missing_reasons": "map<string,string>: per missing node, why (one line)",
    }

    # -- offline ---------------------------------------------------------------------------------
    def sniff(self, sample: Sample) -> bool:
        text = sample.text.lstrip()
        # Every shape below names a job id column or field in its first lines: one bounded scan
        # each rules out most files (this runs on every file of a folder) before any line is split.
        # All three names hold a "J", found at memchr speed: most files have none.
        if (text.find("J", 0, 4096) == -1 or (text.find("JobId=", 0, 4096) == -1 and text.find("JobID", 0, 4096) == -1
                                              and text.find("JOBID", 0, 4096) == -1)) \
                and text.find(FANOUT_SCHEMA, 0, 400) == -1:
            return False
        head = text[:400]
        if head.startswith("{") and FANOUT_SCHEMA in head:
            return True
        if head.startswith("JobId=") and "JobState=" in text[:4000]:
            return True
        # the first three lines, without splitting the whole sample when its head holds them
        lines = text[:8192].splitlines()
        if len(lines) < 4:
            lines = text.splitlines()
        first = lines[0] if text else ""
        if _SACCT_HEADER.match(first) and ("|" in first or "State" in first):
            return True
        for ln in lines[:3]:
            cols = ln.split()
            if "JOBID" in cols and ("ST" in cols or "STATE" in cols) and ("NODES" in cols or "PARTITION" in cols):
                return True
        return False

    def parse(self, path: Path, rel: str, hints: Hints) -> Parsed:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise EvidenceError(rel, f"cannot read ({exc.strerror or exc})") from None
        stripped = text.lstrip()
        if stripped.startswith("{"):
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                raise EvidenceError(rel, f"fan-out record is not valid JSON ({exc.msg} at line {exc.lineno})") from None
            if not isinstance(data, dict) or data.get("schema") != FANOUT_SCHEMA:
                raise EvidenceError(rel, "not an mldoctor SLURM fan-out record")
            return Parsed(self.name, rel, {"source": "fanout", "record": data})
        if stripped.startswith("JobId="):
            jobs = parse_scontrol_jobs(text)
            if not jobs or not any("JobState" in j for j in jobs):
                raise EvidenceError(rel, "scontrol output without a JobState")
            return Parsed(self.name, rel, {"source": "scontrol", "jobs": jobs})
        first = stripped.splitlines()[0] if stripped else ""
        try:
            if _SACCT_HEADER.match(first):
                rows = parse_sacct(stripped)
                if not rows:
                    raise EvidenceError(rel, "sacct output with a header but no job lines")
                return Parsed(self.name, rel, {"source": "sacct", "rows": rows})
            rows = parse_squeue(text)
        except ValueError as exc:
            raise EvidenceError(rel, str(exc)) from None
        return Parsed(self.name, rel, {"source": "squeue", "rows": rows})

    def build(self, parsed: list[Parsed], facts: dict[str, Any]) -> None:
        scontrol = [j for p in parsed if p.data["source"] == "scontrol" for j in p.data["jobs"]]
        sacct = [r for p in parsed if p.data["source"] == "sacct" for r in p.data["rows"]]
        squeue = [r for p in parsed if p.data["source"] == "squeue" for r in p.data["rows"]]
        fanouts = [p.data["record"] for p in parsed if p.data["source"] == "fanout"]
        fanout = fanouts[-1] if fanouts else None

        job_id = self._which_job(fanout, scontrol, sacct, squeue, facts)
        out: dict[str, Any] = {
            "job_id": job_id, "name": "", "state": "", "reason": "", "exit_code": "", "exit_status": -1,
            "exit_signal": -1, "restarts": 0, "nodes": 0, "node_list": [], "node_list_expr": "",
            "batch_host": "", "start_time": "", "end_time": "", "run_time_s": -1, "time_limit_s": -1,
            "steps": [], "failed_steps": [],
            "sources": sorted({p.data["source"] for p in parsed}),
            "fanout": {"asked": [], "answered": [], "node_timeout_s": 0.0, "wall_s": 0.0, "collect_s": {}},
            "nodes_missing": [], "missing_reasons": {},
        }
        # squeue first, then sacct, then scontrol: the most detailed source has the last word.
        for row in squeue:
            if _job_key(row.get("JOBID", "")) != job_id:
                continue
            st = row.get("STATE") or SQUEUE_CODES.get(row.get("ST", ""), row.get("ST", ""))
            out["state"] = st
            out["name"] = out["name"] or row.get("NAME", "")
            nl = row.get("NODELIST(REASON)") or row.get("NODELIST") or ""
            if nl.startswith("(") and nl.endswith(")"):
                out["reason"] = nl[1:-1]
            elif nl:
                self._nodes(out, nl)
            if row.get("REASON"):
                out["reason"] = _value(row["REASON"])
            if (row.get("NODES") or "").isdigit():
                out["nodes"] = int(row["NODES"])
        accounted: list[str] = []  # the job lines' states in sacct (-D: one per run of a requeued job)
        for row in sacct:
            jid = row.get("JobID") or row.get("JobIDRaw") or ""
            if _job_key(jid) != job_id:
                continue
            st = (row.get("State") or "").split()[0] if row.get("State") else ""
            status, sig = exit_code(row.get("ExitCode", ""))
            nodes = self._safe_expand(row.get("NodeList", ""))
            if jid == job_id:  # the job's own line
                out["state"] = st or out["state"]
                accounted.append(st)
                out["name"] = row.get("JobName") or out["name"]
                self._exit(out, row.get("ExitCode", ""))
                if nodes:
                    self._nodes(out, row.get("NodeList", ""))
                out["start_time"] = _value(row.get("Start")) or out["start_time"]
                out["end_time"] = _value(row.get("End")) or out["end_time"]
                el = duration_s(row.get("Elapsed", ""))
                out["run_time_s"] = el if el is not None else out["run_time_s"]
                continue
            out["steps"].append({
                "id": jid, "name": row.get("JobName", ""), "state": st,
                "exit_code": row.get("ExitCode", ""),
                "exit_status": -1 if status is None else status, "exit_signal": -1 if sig is None else sig,
                "nodes": nodes, "node_expr": _value(row.get("NodeList")), "n_nodes": int(row["NNodes"]) if (row.get("NNodes") or "").isdigit() else len(nodes),
                "elapsed_s": duration_s(row.get("Elapsed", "")) or 0,
            })
        for job in scontrol:
            ids = {job.get("JobId", "")}
            if job.get("ArrayJobId") and job.get("ArrayTaskId"):
                ids.add(f"{job['ArrayJobId']}_{job['ArrayTaskId']}")
            if job_id not in ids:
                continue
            out["name"] = job.get("JobName") or out["name"]
            live = job.get("JobState") or ""
            if not (live == "COMPLETING" and accounted and accounted[-1] not in ("", "RUNNING", "PENDING")):
                out["state"] = live or out["state"]  # COMPLETING hides the end state sacct already has
            out["reason"] = _value(job.get("Reason")) or out["reason"]
            self._exit(out, job.get("ExitCode", ""))
            if (job.get("Restarts") or "").isdigit():
                out["restarts"] = int(job["Restarts"])
            if _value(job.get("NodeList")):
                self._nodes(out, job["NodeList"])
            if (job.get("NumNodes") or "").split("-")[0].isdigit():
                out["nodes"] = int(job["NumNodes"].split("-")[0])
            out["batch_host"] = _value(job.get("BatchHost")) or out["batch_host"]
            # A pending job shows its expected start time; only a job that ran has started.
            if out["state"] not in ("PENDING",):
                out["start_time"] = _value(job.get("StartTime")) or out["start_time"]
            out["end_time"] = _value(job.get("EndTime")) or out["end_time"]
            rt = duration_s(job.get("RunTime", ""))
            out["run_time_s"] = rt if rt is not None else out["run_time_s"]
            tl = job.get("TimeLimit", "")
            out["time_limit_s"] = 0 if tl.upper() == "UNLIMITED" else (duration_s(tl) if duration_s(tl) is not None else -1)
        if out["nodes"] == 0 and out["node_list"]:
            out["nodes"] = len(out["node_list"])

        failed = [{"id": s["id"], "state": s["state"], "exit_code": s["exit_code"], "nodes": s["nodes"],
                   "node_expr": s["node_expr"]} for s in out["steps"]
                  if s["state"] in BAD_STATES and s["name"] != OWN_STEP]
        for st in dict.fromkeys([*accounted, out["state"]]):  # e.g. NODE_FAIL, then requeued: PENDING
            if not failed and st in BAD_STATES:
                failed.append({"id": job_id, "state": st, "exit_code": out["exit_code"], "nodes": out["node_list"],
                               "node_expr": out["node_list_expr"]})
        out["failed_steps"] = failed

        if fanout is not None:
            asked = [str(n) for n in fanout.get("asked") or []]
            answered = [str(n) for n in fanout.get("answered") or []]
            reasons = {str(k): str(v)[:300] for k, v in (fanout.get("missing") or {}).items()}
            missing = [n for n in asked if n not in answered]
            for n in missing:
                reasons.setdefault(n, "no fragment came back")
            out["fanout"] = {
                "asked": asked, "answered": answered,
                "node_timeout_s": float(fanout.get("node_timeout_s") or 0.0),
                "wall_s": float(fanout.get("wall_s") or 0.0),
                "collect_s": {str(k): float(v) for k, v in (fanout.get("collect_s") or {}).items()
                              if isinstance(v, (int, float))},
            }
            out["nodes_missing"] = missing
            out["missing_reasons"] = {n: reasons[n] for n in missing}
            if not out["node_list"] and asked:
                out["node_list"] = asked
                out["nodes"] = out["nodes"] or len(asked)
        facts["slurm"] = out

    @staticmethod
    def _safe_expand(expr: str) -> list[str]:
        try:
            return expand_hostlist(expr)
        except ValueError:
            return []

    def _nodes(self, out: dict[str, Any], expr: str) -> None:
        nodes = self._safe_expand(expr)
        if nodes:
            out["node_list"], out["node_list_expr"] = nodes, expr.strip()

    @staticmethod
    def _exit(out: dict[str, Any], code: str) -> None:
        status, sig = exit_code(code)
        if status is not None:
            out["exit_code"], out["exit_status"], out["exit_signal"] = code.strip(), status, sig

    @staticmethod
    def _which_job(fanout: dict[str, Any] | None, scontrol: list[dict[str, Any]], sacct: list[dict[str, str]],
                   squeue: list[dict[str, str]], facts: dict[str, Any]) -> str:
        """The job the evidence is about: the fan-out's, else the ranks' SLURM_JOB_ID, else the only/first one."""
        if fanout and fanout.get("job_id"):
            return str(fanout["job_id"])
        env_id = ((facts.get("env") or {}).get("vars") or {}).get("SLURM_JOB_ID", "")
        known = [j.get("JobId", "") for j in scontrol] + [_job_key(r.get("JobID", "")) for r in sacct]
        known += [_job_key(r.get("JOBID", "")) for r in squeue]
        known = [k for k in known if k]
        if env_id and env_id in known:
            return env_id
        return known[0] if known else ""

    # -- live --------------------------------------------------------------------------------------
    def collect(self, ctx: CollectContext) -> None:
        job_id = str(ctx.options.get("slurm_job") or "")
        if not job_id:
            ids = {p.env.get("SLURM_JOB_ID", "") for p in ctx.procs if p.env}
            ids.discard("")
            if len(ids) > 1:
                raise ProbeFailed(f"the processes belong to several SLURM jobs ({', '.join(sorted(ids))})")
            job_id = ids.pop() if ids else ""
        if not job_id:
            raise ProbeSkipped("not a SLURM job (no SLURM_JOB_ID in the ranks' environment)")
        outputs, errors = run_commands(job_id, min(ctx.timeout, 10.0), ctx.options.get("env"))
        for name, text in outputs.items():
            ctx.add(name, text)
        for line in errors:  # sacct without accounting, say: the rest still counts
            ctx.bundle.note(f"slurm probe: {line}")


def valid_job_id(job_id: str) -> bool:
    """Plain ids, array tasks and het components: 4242, 4242_7, 4242+1."""
    return bool(re.fullmatch(r"\d{1,12}(?:_\d{1,9}|\+\d{1,4})?", job_id or ""))


def run_commands(job_id: str, timeout: float = 10.0,
                 env: dict[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    """Run scontrol/sacct/squeue for one job: ({artifact name: output}, [one line per failed command]).

    sacct needs accounting (slurmdbd): where it is off the other two still answer, and that is
    enough; a failure of all three is a failed probe.
    """
    if not valid_job_id(job_id):
        raise ProbeFailed(f"{job_id!r} is not a SLURM job id")
    if shutil.which("scontrol") is None:
        raise ProbeSkipped("scontrol not found (SLURM client tools are not installed here)")
    cmds = {
        "scontrol-show-job.txt": ["scontrol", "show", "job", "-d", job_id],
        "sacct.txt": ["sacct", "-j", job_id, "--duplicates", "--parsable2", f"--format={SACCT_FORMAT}"],
        "squeue.txt": ["squeue", "--all", "--jobs", job_id],
    }
    out: dict[str, str] = {}
    errors: list[str] = []
    for name, argv in cmds.items():
        if shutil.which(argv[0]) is None:
            errors.append(f"{argv[0]}: not installed")
            continue
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            errors.append(f"{argv[0]}: no answer within {timeout:.0f}s")
            continue
        except OSError as exc:
            errors.append(f"{argv[0]}: {exc.strerror or exc}")
            continue
        if res.returncode != 0 or not res.stdout.strip():
            msg = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
            errors.append(f"{argv[0]}: {msg[:200]}")
            continue
        out[name] = res.stdout
    if not out:
        raise ProbeFailed("; ".join(errors) or "no output")
    return out, errors


PROBE = SlurmProbe()
