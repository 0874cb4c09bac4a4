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


#: ``python -m torch.utils.collect_env`` output (every PyTorch bug report has it under "### Versions").
#: Its layout is torch/utils/collect_env.py's ``env_info_fmt`` (torch 2.13: lines 778-810; pytorch
#: commit 95511e2 has the 2021 form without the CPU section): ``Key: value`` lines, a multi-GPU
#: ``GPU models and configuration:`` followed by ``GPU N: model`` lines (``maybe_start_on_next_line``),
#: cuDNN as library paths under "Probably one of the following:", and the packages as
#: ``[pip3] name==version`` / ``[conda] name version build channel`` lines (``prepend``, 829-832).
_CE_KEYS = re.compile(r"^(?:PyTorch version|Is debug build|CUDA used to build PyTorch|OS|Python version|"
                      r"Is CUDA available|Nvidia driver version|Versions of relevant libraries):", re.M)
_CE_FIELDS = {
    "PyTorch version": "torch", "CUDA used to build PyTorch": "cuda_build", "ROCM used to build PyTorch": "rocm_build",
    "OS": "os", "GCC version": "gcc", "Libc version": "libc", "Python version": "python",
    "CUDA runtime version": "cuda_runtime", "Nvidia driver version": "driver", "cuDNN version": "cudnn",
    "HIP runtime version": "hip_runtime", "CUDA_MODULE_LOADING set to": "cuda_module_loading",
}
#: Values collect_env prints for "not known" (``replace_nones``, the "No CUDA" branch, ROCm's N/A).
_CE_NONE = {"", "n/a", "none", "could not collect", "no cuda", "not known", "no relevant packages"}
_CE_PKG = re.compile(r"^\[(?:pip\d?|conda)\]\s+([A-Za-z0-9_.-]+)(?:==|\s+)([0-9][\w.+!-]*)")
_CE_GPU = re.compile(r"GPU (\d+): ([^(\n]+?)\s*(?:\(UUID[^)]*\))?\s*$")
#: Minimum Linux driver per CUDA major release for minor-version compatibility: 13.x >= 580,
#: 12.x >= 525, 11.x >= 450 (https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html, Table 1).
CUDA_MIN_DRIVER = {11: 450, 12: 525, 13: 580}
#: A report is ~150 lines with lscpu's section and the package list; a log that printed one at its
#: top goes on with other "Key: value" lines that are not the report's.
_CE_MAX_LINES = 400


def is_collect_env(text: str) -> bool:
    """torch's collect_env report: its first key, and most of the others at line starts."""
    head = text[:8192]
    return "PyTorch version: " in head and len(set(_CE_KEYS.findall(head))) >= 4


def is_package_list(text: str) -> bool:
    """Only the package list of a collect_env report (its "Versions of relevant libraries:"
    section, ``[pip3] name==version`` / ``[conda] name version ...`` lines), as tickets often
    paste it: at least two package lines, and they make most of the non-blank lines. Why: which
    nvidia-nccl-cu* / torch packages sit side by side is what tells two NCCL libraries apart."""
    lines = [ln.strip() for ln in text[:8192].splitlines() if ln.strip()]
    pkgs = sum(1 for ln in lines if _CE_PKG.match(ln))
    return pkgs >= 2 and pkgs / max(1, len(lines)) >= 0.6


def parse_collect_env(text: str) -> dict[str, Any]:
    """Versions, GPUs and packages of one collect_env report; "not known" values are left out."""
    versions: dict[str, str] = {}
    packages: dict[str, str] = {}
    gpus: list[str] = []
    cuda_available: bool | None = None
    key = ""
    start = text.find("PyTorch version: ")
    lines = text[max(0, start):].replace("\r\n", "\n").split("\n")[:_CE_MAX_LINES]
    for raw in lines:
        line = raw.strip()
        if not line:
            key = ""
            continue
        m = _CE_PKG.match(line)
        if m:
            packages.setdefault(m.group(1).lower(), m.group(2))
            continue
        k, sep, v = line.partition(": ") if ": " in line else line.partition(":")
        field = _CE_FIELDS.get(k.strip())
        if k.strip() == "GPU models and configuration" or (key == "gpu" and line.startswith("GPU ")):
            g = _CE_GPU.search(line)
            if g:
                gpus.append(g.group(2).strip())
            elif k.strip() == "GPU models and configuration" and v.strip().lower() not in _CE_NONE:
                gpus.append(v.strip())  # one device named without "GPU 0:" (macOS, ROCm)
            key = "gpu"
            continue
        if k.strip() == "Is CUDA available":
            cuda_available = {"true": True, "yes": True, "false": False, "no": False}.get(v.strip().lower())
            key = ""
            continue
        if field:
            key = field
            if v.strip().lower() not in _CE_NONE and not v.strip().startswith("Probably one of"):
                versions.setdefault(field, v.strip())
            continue
        if key == "cudnn" and "cudnn" not in versions:
            c = re.search(r"libcudnn(?:_\w+)?\.so\.(\d+(?:\.\d+)*)", line)
            if c:
                versions["cudnn"] = c.group(1)
    if versions.get("python"):
        versions["python"] = versions["python"].split()[0]
    for name in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11", "nccl"):
        if name in packages:
            versions.setdefault("nccl", packages[name])
            break
    return {"versions": versions, "packages": packages, "gpus": gpus, "cuda_available": cuda_available}


def driver_below_minimum(versions: dict[str, str]) -> bool:
    """The driver is older than the CUDA major release torch was built with needs (Table 1 above)."""
    try:
        major = int(versions.get("cuda_build", "").split(".")[0])
        driver = int(versions.get("driver", "").split(".")[0])
    except ValueError:
        return False
    need = CUDA_MIN_DRIVER.get(major)
    return need is not None and driver < need


def _unquote(v: str) -> str:
    v = v.strip()
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
        return v[1:-1]
    return v


def _versions(reports: list[Parsed]) -> dict[str, Any]:
    """The env.versions facts of the collect_env reports (several: one per host, in path order)."""
    docs = [p.data["collect_env"] for p in sorted(reports, key=lambda p: p.path)]
    values: dict[str, list[str]] = {}
    packages: dict[str, str] = {}
    for d in docs:
        for k, v in d["versions"].items():
            if v not in values.setdefault(k, []):
                values[k].append(v)
        for k, v in d["packages"].items():
            packages.setdefault(k, v)
    versions = {k: vs[0] for k, vs in values.items()}
    gpus = max((d["gpus"] for d in docs), key=len)
    out: dict[str, Any] = {
        "versions": versions, "version_values": values, "versions_differ": sorted(k for k, vs in values.items() if len(vs) > 1),
        "packages": packages, "gpu_models": gpus, "gpu_count": len(gpus), "collect_env_reports": len(docs),
        "driver_below_cuda_minimum": driver_below_minimum(versions),
    }
    known = [d["cuda_available"] for d in docs if d["cuda_available"] is not None]
    if known:
        out["cuda_available"] = all(known)
    return out


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
        "tests/fixtures/collect_env/*.txt",
    )
    facts_schema: ClassVar[dict[str, str]] = {
        "env.vars": "map<string,string>: allowlisted variables; where ranks disagree, the lowest rank's value",
        "env.values": "map<string,list<string>>: every distinct value seen per variable",
        "env.differing": "list<string>: variables whose value differs across the dumps",
        "env.sources": "int: number of environment dumps read",
        "env.by_rank": "map<string,map<string,string>>: allowlisted variables per rank",
        "env.ranks_by_value": "map<string,map<string,list<int>>>: variable -> value -> ranks that have it (for culprits without per-rank loops)",
        # from `python -m torch.utils.collect_env` output (a ticket's "### Versions"): context, never a finding alone
        "env.versions": "map<string,string>: software versions from collect_env output: torch, cuda_build (CUDA torch was "
                        "built with), cuda_runtime (nvcc), cudnn, nccl (pip/conda package), driver, os, python, libc, gcc, "
                        "rocm_build, hip_runtime, cuda_module_loading; the first report's value where several differ",
        "env.versions_differ": "list<string>: version keys whose value differs across the collect_env reports read (hosts on different images)",
        "env.version_values": "map<string,list<string>>: every distinct value per version key",
        "env.packages": "map<string,string>: pip/conda package -> version from collect_env's 'Versions of relevant libraries'",
        "env.gpu_models": "list<string>: GPU models collect_env lists, one entry per GPU",
        "env.gpu_count": "int: GPUs collect_env lists (0 when none or not collected)",
        "env.cuda_available": "bool: torch.cuda.is_available() as collect_env reports it (absent when not reported)",
        "env.driver_below_cuda_minimum": "bool: the NVIDIA driver is older than the minimum for the CUDA major release torch was built with (11.x 450, 12.x 525, 13.x 580)",
        "env.collect_env_reports": "int: collect_env reports read",
    }


    def scrub(self, data: bytes) -> bytes:
        """Environment values are kept for the allowlist only (text dumps and /proc's NULs)."""
        return filter_env_text(data.decode("utf-8", errors="replace")).encode()

    #: A collect_env report is read besides whatever kind owns it: its CPU section is lscpu
    #: output (host_tools reads that), and trainers print it at the top of their logs.
    also_reads: ClassVar[frozenset[str] | None] = None

    def also_sniff(self, sample: Sample) -> bool:
        return b"PyTorch version: " in sample.raw and is_collect_env(sample.text)

    def sniff(self, sample: Sample) -> bool:
        raw = sample.raw
        if b"PyTorch version: " in raw and is_collect_env(sample.text):
            return True
        if (b"[pip" in raw or b"[conda]" in raw) and is_package_list(sample.text):
            return True
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
        head = raw[:8192].decode("utf-8", "replace")
        if (b"PyTorch version: " in raw[:8192] and is_collect_env(head)) or \
                ((b"[pip" in raw[:8192] or b"[conda]" in raw[:8192]) and is_package_list(head)):
            report = parse_collect_env(raw.decode("utf-8", "replace"))
            return Parsed(self.name, rel, {"vars": {}, "dropped": 0, "collect_env": report}, hints.rank, hints.host)
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
        reports = [p for p in parsed if "collect_env" in p.data]
        parsed = [p for p in parsed if "collect_env" not in p.data]
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
        if reports:
            facts["env"].update(_versions(reports))
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

