"""Environment of the job's processes: ``env``/``printenv`` output, ``KEY=VALUE`` files,
``export``/``declare -x`` lines and raw ``/proc/PID/environ``.

Only allowlisted keys keep their values (NCCL_*, TORCH_*, CUDA_*, rank variables, ...): the rest
of an environment is where tokens live, and no rule needs it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, ClassVar

from doctor.probes import env_report

from doctor.evidence.contract import (
    CollectContext,
    Hints,
    Parsed,
    Probe,
    ProbeFailed,
    Sample,
    set_world_size,
)
from doctor.evidence.errors import EvidenceError
from doctor.evidence.redact import env_key_allowed, filter_env_text, scrub
from doctor.evidence.sections import Section, SectionContext

_LINE = re.compile(r"^(?:export\s+|declare\s+-x\s+|setenv\s+)?([A-Za-z_][A-Za-z0-9_]*)(=|\s+)(.*)$")
_KEYVAL = re.compile(r"^(?:export\s+|declare\s+-x\s+)?[A-Za-z_][A-Za-z0-9_]*=")
_SIGNAL_KEYS = re.compile(r"^(?:export\s+|declare\s+-x\s+)?(PATH|HOME|USER|SHELL|PWD|HOSTNAME|LANG|RANK|WORLD_SIZE|LOCAL_RANK|MASTER_ADDR|(?:NCCL|TORCH|CUDA|SLURM|OMP)_[A-Z0-9_]+)=", re.M)


def _unquote(v: str) -> str:
    v = v.strip()
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
        return v[1:-1]
    return v


class EnvProbe(Probe):
    name: ClassVar[str] = "env"
    title: ClassVar[str] = "Process environment"
    collects: ClassVar[str] = (
        "Allowlisted environment variables of each rank (NCCL_*, TORCH_*, CUDA_*, OMP_*/MKL_*, "
        "SLURM_*, rank variables): values of every other key are dropped at parse time."
    )
    priority: ClassVar[int] = 20  # generic KEY=VALUE shape: let specific kinds claim first
    build_order: ClassVar[int] = 10
    live_first_round: ClassVar[bool] = True
    follow_ups: ClassVar[dict[str, dict[str, Any]]] = {"env": {}}
    max_bytes: ClassVar[int] = 16 * 1024 * 1024
    fixtures: ClassVar[tuple[str, ...]] = (
        "tests/fixtures/env_capture/*/env-rank*.txt",
        "tests/fixtures/env_capture/*/environ-rank*",
        "tests/fixtures/evidence/*/env-rank*.txt",
    )
    facts_schema: ClassVar[dict[str, str]] = {
        "env.vars": "map<string,string>: allowlisted variables; where ranks disagree, the lowest rank's value",
        "env.values": "map<string,list<string>>: every distinct value seen per variable",
        "env.differing": "list<string>: variables whose value differs across the dumps",
        "env.sources": "int: number of environment dumps read",
        "env.by_rank": "map<string,map<string,string>>: allowlisted variables per rank",
        "env.ranks_by_value": "map<string,map<string,list<int>>>: variable -> value -> ranks that have it (for culprits without per-rank loops)",
    }


    def scrub(self, data: bytes) -> bytes:
        """Environment values are kept for the allowlist only (text dumps and /proc's NULs)."""
        return filter_env_text(data.decode("utf-8", errors="replace")).encode()

    def sniff(self, sample: Sample) -> bool:
        raw = sample.raw
        if b"\x00" in raw[:4096]:
            parts = [p for p in raw.split(b"\x00") if p]
            good = sum(1 for p in parts[:200] if _KEYVAL.match(p.decode("utf-8", "replace")))
            return len(parts) >= 2 and good / len(parts[:200]) >= 0.8
        lines = [ln for ln in sample.text.splitlines()[:300] if ln.strip() and not ln.startswith("#")]
        if len(lines) < 2:
            return False
        good = sum(1 for ln in lines if _KEYVAL.match(ln))
        # Plain KEY=VALUE files are common (configs, .env); ask for keys a process environment has.
        return good / len(lines) >= 0.7 and bool(_SIGNAL_KEYS.search(sample.text))

    def parse(self, path: Path, rel: str, hints: Hints) -> Parsed:
        raw = path.read_bytes()
        if b"\x00" in raw[:4096]:
            entries = [p.decode("utf-8", "replace") for p in raw.split(b"\x00") if p]
        else:
            entries = raw.decode("utf-8", "replace").splitlines()
        env: dict[str, str] = {}
        for line in entries:
            m = _LINE.match(line.strip())
            if m and (m.group(2) == "=" or line.lstrip().startswith("setenv")):
                env[m.group(1)] = _unquote(m.group(3))
        if not env:
            raise EvidenceError(rel, "no KEY=VALUE lines found")
        kept = {k: scrub(v) for k, v in env.items() if env_key_allowed(k)}
        rank = hints.rank
        for key in ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
            if kept.get(key, "").isdigit():
                rank = int(kept[key])
                break
        # HOSTNAME is inherited through srun/mpirun from the launching host (every task of a
        # SLURM step says the batch host): the node's own name and the collector's word come first.
        topo = kept.get("SLURM_TOPOLOGY_ADDR", "").rsplit(".", 1)[-1]
        host = env.get("SLURMD_NODENAME") or topo or hints.host or kept.get("HOSTNAME")
        return Parsed(self.name, rel, {"vars": kept, "dropped": len(env) - len(kept)}, rank, host)

    def collect(self, ctx: CollectContext) -> None:
        """Write each rank's environment as ``KEY=VALUE`` lines (discovery already filtered it)."""
        wrote = 0
        for p in ctx.ranks:
            if p.env:
                lines = [f"{k}={v}" for k, v in sorted(p.env.items())]
                ctx.add(f"env-rank{p.rank}.txt", "\n".join(lines) + "\n", rank=p.rank, pid=p.pid)
                wrote += 1
        if not wrote:
            if not ctx.ranks:
                raise ProbeFailed("no rank process left to read (they exited, or are zombies)")
            raise ProbeFailed("no rank environment was readable" + (
                " (the processes exited, or are zombies)" if os.geteuid() == 0 else " (run as the job's user or root)"))

    def build(self, parsed: list[Parsed], facts: dict[str, Any]) -> None:
        ordered = sorted(parsed, key=lambda p: (p.rank is None, p.rank if p.rank is not None else 0, p.path))
        values: dict[str, list[str]] = {}
        merged: dict[str, str] = {}
        by_rank: dict[str, dict[str, str]] = {}
        for p in ordered:
            for k, v in p.data["vars"].items():
                values.setdefault(k, [])
                if v not in values[k]:
                    values[k].append(v)
                merged.setdefault(k, v)
            if p.rank is not None:
                by_rank.setdefault(str(p.rank), {}).update(p.data["vars"])
        # A key missing from some dumps also differs.
        n = len(ordered)
        differing = sorted(k for k, vs in values.items()
                           if len(vs) > 1 or (n > 1 and sum(k in p.data["vars"] for p in ordered) < n))
        ranks_by_value: dict[str, dict[str, list[int]]] = {}
        for rank, env in by_rank.items():
            for k, v in env.items():
                ranks_by_value.setdefault(k, {}).setdefault(v, []).append(int(rank))
        facts["env"] = {"vars": merged, "values": values, "differing": differing,
                        "sources": n, "by_rank": by_rank, "ranks_by_value": ranks_by_value}
        for key in ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"):
            if merged.get(key, "").isdigit():
                set_world_size(facts, int(merged[key]))
                break

    # -- the report (doctor/probes/env_report.py) -----------------------------------------------
    def report_sections(self, facts: dict[str, Any], context: SectionContext) -> list[Section]:
        return env_report.sections(facts, context)

    def job_label(self, facts: dict[str, Any]) -> str:
        return env_report.job_label(facts)

    def host_names(self, facts: dict[str, Any]) -> list[str]:
        return env_report.host_names(facts)


PROBE = EnvProbe()

