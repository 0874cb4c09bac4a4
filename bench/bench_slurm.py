"""SLURM benchmark: time to verdict of ``mldoctor diagnose --slurm-job`` on a real 2-node job,
the per-node collection figures, and the controller-side cost at 1,024 nodes.

Run (as root, with slurm-wlm slurm-client munge installed; .ci/run installs them):

    python bench/bench_slurm.py [--runs 5] [--nodes 1024]

Part 1 starts the localhost cluster of tests/slurm_cluster.py (two slurmd on this host),
submits a real 2-node job (4 gloo ranks; rank 3 on node2 blocks on its own lock, so the verdict
needs a follow-up round of native stacks on node2) and runs the real CLI ``--runs`` times.
Part 2 takes two real fragments written by the same srun fan-out and replicates them to
``--nodes`` nodes (renamed nodes, renumbered ranks, checksums recomputed), then times the
merge of all of them and the analysis of the merged bundle.

Prints medians and the 1,024-node estimate that docs/slurm.md quotes; nothing is asserted.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.slurm_cluster import SlurmCluster, missing_binaries, train_job_script  # noqa: E402

_ANSWER = re.compile(r"^(\S+): answered after ([\d.]+)s \(collection ([\d.]+)s on the node\)")


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def wait_fault(cluster: SlurmCluster, job_id: str, needle: str, timeout: float = 180) -> None:
    log = cluster.root / "work" / f"slurm-{job_id}.out"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and needle in log.read_text(errors="replace"):
            time.sleep(1.0)  # the other ranks reach the all_reduce they wait in
            return
        time.sleep(0.3)
    raise RuntimeError(f"job {job_id} never reached its fault")


def part1(cluster: SlurmCluster, job_id: str, runs: int) -> dict[str, list[float]]:
    m: dict[str, list[float]] = {k: [] for k in ("verdict", "fanout", "answer", "collect", "merge", "followup",
                                                 "analysis", "srun_bare")}
    causes = []
    for _ in range(runs):
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "doctor.cli", "diagnose", "--slurm-job", job_id, "--json"],
                             capture_output=True, text=True, env=cluster.env, timeout=300)
        m["verdict"].append(time.perf_counter() - t0)
        rep = json.loads(res.stdout)
        causes.append((rep["findings"][0]["cause"], rep["findings"][0]["hosts"]) if rep["findings"] else None)
        trace = rep["trace"]
        first_merge = next(s for s in trace if s["action"] == "merge")
        mm = re.search(r"answered in ([\d.]+)s; \d+ artifact\(s\) merged in ([\d.]+)s", first_merge["detail"])
        m["fanout"].append(float(mm.group(1)))
        m["merge"].append(float(mm.group(2)))
        seen = set()
        for s in trace:
            a = _ANSWER.match(s["detail"]) if s["action"] == "fragment" else None
            if a and a.group(1) not in seen:  # first round only
                seen.add(a.group(1))
                m["answer"].append(float(a.group(2)))
                m["collect"].append(float(a.group(3)))
        fu = [s for s in trace if s["action"] == "merge" and s["detail"].startswith("follow-up")]
        if fu:
            m["followup"].append(float(re.search(r"in ([\d.]+)s", fu[0]["detail"]).group(1)))
        rules = [s for s in trace if s["action"] == "rules"]
        parse = [s for s in trace if s["action"] == "parse"]
        if rules and parse:  # the last analysis: from the last merge to the rules' verdict
            last_merge_t = max(s["t"] for s in trace if s["action"] == "merge")
            m["analysis"].append(rules[-1]["t"] - last_merge_t)
    print(f"verdicts: {sorted(set(map(str, causes)))}")
    for _ in range(runs):
        t0 = time.perf_counter()
        cluster.run("srun", f"--jobid={job_id}", "--overlap", "--nodes=2", "--ntasks-per-node=1", "--mem=0",
                    "--cpus-per-task=1", "/bin/true")
        m["srun_bare"].append(time.perf_counter() - t0)
    return m


def real_fragments(cluster: SlurmCluster, job_id: str, dest: Path) -> list[Path]:
    """The fragments of one fan-out, exactly as diagnose's srun writes them."""
    from doctor.live.slurm import collect_command, srun_command

    argv = srun_command(job_id, ["node1", "node2"], "node[1-2]", dest, 60.0, collect_command(job_id))
    cluster.run(*argv, timeout=120)
    return sorted(dest.glob("frag-*.tar.gz"))


def replicate(frag: Path, node: str, first_rank: int, world: int, out: Path) -> Path:
    """A copy of a real fragment as if from ``node``, its ranks renumbered from ``first_rank``."""
    from doctor.evidence.bundle import Bundle

    work = Path(tempfile.mkdtemp(dir=out))
    root = Bundle.load(frag, workdir=work).root
    man = json.loads((root / "manifest.json").read_text())
    old = man["target"]["host"]
    man["target"]["host"] = node
    man["hosts"] = [node]
    shift = {r: first_rank + i for i, r in enumerate(sorted(man["ranks"]))}
    man["ranks"] = sorted(shift.values())

    def fix_name(rel: str) -> str:
        rel = rel.replace(f"hosts/{old}/", f"hosts/{node}/")
        return re.sub(r"rank(\d+)", lambda mt: f"rank{shift.get(int(mt.group(1)), int(mt.group(1)))}", rel)

    for art in man["artifacts"]:
        src = root / art["path"]
        data = src.read_bytes()
        if art["kind"] == "env":
            text = data.decode()
            for key in ("RANK", "SLURM_PROCID"):
                text = re.sub(rf"^{key}=(\d+)$", lambda mt: f"{mt.group(0).split('=')[0]}={shift.get(int(mt.group(1)), 0)}",
                              text, flags=re.M)
            text = re.sub(r"^(WORLD_SIZE|SLURM_NTASKS)=\d+$", lambda mt: f"{mt.group(1)}={world}", text, flags=re.M)
            text = text.replace(f"SLURM_TOPOLOGY_ADDR={old}", f"SLURM_TOPOLOGY_ADDR={node}")
            data = text.encode()
        elif art["kind"] in ("procs", "system"):
            doc = json.loads(data)
            doc["host"] = node
            for rec in doc.get("procs", []):
                if rec.get("rank") is not None:
                    rec["rank"] = shift.get(rec["rank"], rec["rank"])
            data = json.dumps(doc).encode()
        new_rel = fix_name(art["path"])
        dst = root / new_rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        src.unlink()
        dst.write_bytes(data)
        art.update(path=new_rel, host=node, sha256=hashlib.sha256(data).hexdigest(), size=len(data),
                   rank=shift.get(art["rank"], art["rank"]) if art.get("rank") is not None else None)
    for run in man["probes"]:
        run["host"] = node
    (root / "manifest.json").write_text(json.dumps(man))
    dest = out / f"{node}.tar.gz"
    with tarfile.open(dest, "w:gz") as tar:
        tar.add(root, arcname=f"fragment-{node}")
    shutil.rmtree(work)
    return dest


def part2(frags: list[Path], n_nodes: int, tmp: Path) -> dict[str, float]:
    from doctor.engine import facts as facts_mod
    from doctor.engine.diagnose import analyze
    from doctor.evidence.bundle import Bundle
    from doctor.live.slurm import Merger

    with tarfile.open(frags[0]) as tar:  # ranks per real fragment
        man = next(m for m in tar.getmembers() if m.name.endswith("/manifest.json"))
        per = len(json.loads(tar.extractfile(man).read())["ranks"]) or 2
    reps = tmp / "reps"
    reps.mkdir()
    world = n_nodes * per
    t0 = time.perf_counter()
    copies = [replicate(frags[i % len(frags)], f"node{i + 1:04d}", i * per, world, reps) for i in range(n_nodes)]
    t_rep = time.perf_counter() - t0
    sizes = [p.stat().st_size for p in copies]
    bundle = Bundle.create(tmp / "merged", {})
    merger = Merger(bundle)
    analyze([], {"type": "live"})  # imports and rule compilation happen during the fan-out (warm-up)
    t0, c0 = time.perf_counter(), time.process_time()
    for i, p in enumerate(copies):
        merger.add(p, f"node{i + 1:04d}")
    t_merge, c_merge = time.perf_counter() - t0, time.process_time() - c0
    bundle.save()
    t0, c0 = time.perf_counter(), time.process_time()
    rep = analyze(facts_mod.items_from_bundle(bundle), {"type": "live"}, None, list(bundle.manifest["probes"]))
    t_analysis, c_analysis = time.perf_counter() - t0, time.process_time() - c0
    return {"nodes": n_nodes, "ranks": len(rep.facts["job"]["ranks_seen"]), "world": world,
            "frag_kib": med(sizes) / 1024, "replicate_s": t_rep, "merge_s": t_merge,
            "merge_ms_per_node": 1000 * t_merge / n_nodes, "analysis_s": t_analysis,
            "merge_cpu_s": c_merge, "analysis_cpu_s": c_analysis,
            "top": rep.findings[0].cause if rep.findings else ""}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=1024)
    args = ap.parse_args()
    if missing_binaries():
        sys.exit("SLURM/munge not installed: " + ", ".join(missing_binaries()))
    tmp = Path(tempfile.mkdtemp(prefix="mldslurm-", dir="/tmp"))
    cluster = SlurmCluster(tmp / "cluster")
    try:
        t0 = time.perf_counter()
        cluster.start()
        t_start = time.perf_counter() - t0
        tree = re.search(r"TreeWidth\s*=\s*(\d+)", cluster.run("scontrol", "show", "config").stdout)
        job = cluster.sbatch(train_job_script("lock_self", 3))
        cluster.wait_state(job, "RUNNING", 60)
        wait_fault(cluster, job, "rank 3 fault=lock_self injected")
        m = part1(cluster, job, args.runs)
        fr_dir = tmp / "frags"
        fr_dir.mkdir()
        frags = real_fragments(cluster, job, fr_dir)
    finally:
        cluster.stop()
    s = part2(frags, args.nodes, tmp)
    shutil.rmtree(tmp, ignore_errors=True)

    load = os.getloadavg()[0]
    print(f"\n== 2-node job (4 gloo ranks, lock_self on rank 3 / node2), {args.runs} runs; cluster up in "
          f"{t_start:.1f}s; {os.cpu_count()} cores, load average {load:.1f} (figures scale with it)")
    print(f"time to verdict (CLI wall, incl. follow-up)   median {med(m['verdict']):6.2f}s  max {max(m['verdict']):.2f}s")
    print(f"first fan-out (srun start -> last fragment)   median {med(m['fanout']):6.2f}s")
    print(f"per node: answer after srun start             median {med(m['answer']):6.2f}s  max {max(m['answer']):.2f}s")
    print(f"per node: collection on the node              median {med(m['collect']):6.2f}s  max {max(m['collect']):.2f}s")
    print(f"bare srun --overlap /bin/true on 2 nodes      median {med(m['srun_bare']):6.2f}s")
    print(f"merge of 2 fragments                          median {med(m['merge']):6.3f}s")
    print(f"follow-up round (native stacks, node2)        median {med(m['followup']):6.2f}s")
    print(f"\n== controller side at {s['nodes']} nodes (real fragments replicated, {s['ranks']} ranks)")
    print(f"fragment size                                 median {s['frag_kib']:6.1f} KiB")
    print(f"merge, all fragments one after another        {s['merge_s']:6.2f}s wall ({s['merge_ms_per_node']:.1f} ms/node), "
          f"{s['merge_cpu_s']:.2f}s CPU")
    print(f"analysis of the merged bundle                 {s['analysis_s']:6.2f}s wall, {s['analysis_cpu_s']:.2f}s CPU "
          f"(top: {s['top']})")
    launch_2 = med(m["srun_bare"])
    width = int(tree.group(1)) if tree else 50
    levels = 1
    while width ** levels < args.nodes:
        levels += 1
    est_launch = launch_2 * levels
    scale = 4  # 8 ranks per node instead of 2: fragment work and analysis are about linear in ranks
    for label, merge, analysis in (("wall, this load", s["merge_s"], s["analysis_s"]),
                                   ("CPU (an idle controller)", s["merge_cpu_s"], s["analysis_cpu_s"])):
        total = est_launch + max(m["answer"]) + merge * scale + analysis * scale
        print(f"\n== estimate for {args.nodes} nodes x 8 ranks, {label} (TreeWidth {width}: {levels} launch level(s))")
        print(f"launch ~{est_launch:.1f}s + slowest node {max(m['answer']):.1f}s + merge {merge * scale:.1f}s + "
              f"analysis {analysis * scale:.1f}s = ~{total:.0f}s to a first verdict "
              f"(+ one follow-up round on the culprit nodes: ~{med(m['followup']):.0f}s)")


if __name__ == "__main__":
    main()
