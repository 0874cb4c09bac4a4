"""The env kind's part of the report: the allowlisted variables, those that differ across ranks
first with the ranks behind each value; and what the environment names (job id, hosts).

Kept apart from ``env.py`` (parsing and building) because it reads only the built facts, which
old bundles and hand-made facts documents may shape loosely: every read here is defensive.
"""

from __future__ import annotations

from typing import Any

from doctor.evidence.sections import Cell, KeyValues, Row, Section, SectionContext, Table

#: The collect_env versions shown, in this order, with their labels.
VERSION_LABELS = (("torch", "PyTorch"), ("cuda_build", "CUDA (torch build)"), ("cuda_runtime", "CUDA runtime (nvcc)"),
                  ("driver", "NVIDIA driver"), ("cudnn", "cuDNN"), ("nccl", "NCCL (package)"), ("rocm_build", "ROCm (torch build)"),
                  ("os", "OS"), ("python", "Python"), ("libc", "libc"))

#: Variables whose values are host names or addresses (the report scrubber aliases them).
HOST_KEYS = ("HOSTNAME", "MASTER_ADDR", "SLURMD_NODENAME", "SLURM_LAUNCH_NODE_IPADDR",
             "SLURM_SUBMIT_HOST", "SLURM_TOPOLOGY_ADDR")
#: Variables naming the job, in order of preference (report file names).
JOB_KEYS = ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")


def _ns(facts: dict[str, Any]) -> dict[str, Any]:
    env = facts.get("env")
    return env if isinstance(env, dict) else {}


def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def rows(facts: dict[str, Any]) -> list[Row]:
    """Allowlisted variables, the differing ones first with the ranks behind each value."""
    env = _ns(facts)
    merged = {str(k): str(v) for k, v in _as_dict(env.get("vars")).items()}
    differing_raw = env.get("differing")
    differing = {str(k) for k in (differing_raw if isinstance(differing_raw, list) else [])}
    by_rank = _as_dict(env.get("by_rank"))
    out = []
    for key in sorted(set(merged) | differing, key=lambda k: (k not in differing, k)):
        value = merged.get(key, "(unset)")
        if key not in differing:
            out.append(Row([Cell(key), Cell(value, code=True)]))
            continue
        by_value: dict[str, list[int]] = {}
        for rank_s, vars_ in by_rank.items():
            if isinstance(vars_, dict) and str(rank_s).isdigit():
                by_value.setdefault(str(vars_.get(key, "(unset)")), []).append(int(rank_s))
        ordered = sorted(by_value.items(), key=lambda kv: -len(kv[1]))
        out.append(Row([Cell(key), Cell(value, code=True, by_ranks=ordered)], marks=["DIFF"], suffix="(differs)"))
    return out


def versions_section(facts: dict[str, Any]) -> list[Section]:
    """What collect_env said (versions, GPUs, whether CUDA works): context for every finding."""
    env = _ns(facts)
    versions = _as_dict(env.get("versions"))
    items = [(label, str(versions[k])) for k, label in VERSION_LABELS if versions.get(k)]
    gpus = env.get("gpu_models") if isinstance(env.get("gpu_models"), list) else []
    if gpus:
        counts: dict[str, int] = {}
        for g in gpus:
            counts[str(g)] = counts.get(str(g), 0) + 1
        items.append(("GPUs", ", ".join(f"{n} x {g}" for g, n in counts.items())))
    if isinstance(env.get("cuda_available"), bool):
        items.append(("CUDA available", "yes" if env["cuda_available"] else "no"))
    differ = env.get("versions_differ") if isinstance(env.get("versions_differ"), list) else []
    if differ:
        items.append(("differ across reports", ", ".join(str(d) for d in differ)))
    if not items:
        return []
    return [Section(id="versions", title="Versions (collect_env)", nav="Versions", order=31, body=KeyValues(items),
                    summary="Versions: " + ", ".join(f"{label} {value}" for label, value in items[:3]))]


def sections(facts: dict[str, Any], context: SectionContext) -> list[Section]:
    table = rows(facts)
    if not table:
        return versions_section(facts)
    n, n_diff = len(table), sum(r.highlighted for r in table)
    return [Section(
        id="env", title="Environment", nav="Environment", order=30,
        body=Table(["variable", "value"], table, noun="variable",
                   legend="DIFF = the value differs across ranks (listed first)"),
        summary=f"Environment: {n} allowlisted variable(s), {n_diff} differ across ranks",
        note=(f"{n} allowlisted variable(s); {n_diff} differ across ranks (highlighted). "
              "Values of other variables are never collected."),
    )] + versions_section(facts)


def job_label(facts: dict[str, Any]) -> str:
    env_vars = _as_dict(_ns(facts).get("vars"))
    for key in JOB_KEYS:
        value = env_vars.get(key)
        if value and value != "none":
            return str(value)
    return ""


def host_names(facts: dict[str, Any]) -> list[str]:
    env = _ns(facts)
    names: list[str] = []
    for key in HOST_KEYS:
        names += [v for v in (env.get("values") or {}).get(key, []) if isinstance(v, str)]
    for per in (env.get("by_rank") or {}).values():
        if isinstance(per, dict):
            names += [per[k] for k in HOST_KEYS if isinstance(per.get(k), str)]
    return names
