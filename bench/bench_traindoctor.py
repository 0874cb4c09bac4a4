"""mldoctor vs train-doctor on the same single-process slow scripts (prints a Markdown table).

    . /tmp/venv/bin/activate && pip install train-doctor && python bench/bench_traindoctor.py

The scripts are doctor/scenarios/train_job.py with one fault each, run as one process (the
scenarios dataloader_heavy, host_sync, compile_recompile, checkpoint_sync, and healthy, all with
one process: note that the "healthy" script run alone is input-bound, its tiny MLP step costing
about as much as loading 32 synthetic items).

- train-doctor (https://github.com/Abelo9996/train-doctor) must start the script itself: its
  ``profile`` re-launches the command with a sitecustomize hook that wraps the DataLoader,
  .item()/.cpu(), torch.save and stdout writes, measures a bounded window and stops the run;
  ``diagnose`` ranks its findings. Run here as
  ``train-doctor profile --steps 20 --seconds 5 --json -- python train_job.py --fault NAME ...``
  with RANK/WORLD_SIZE/MASTER_* set so the script's init_process_group works in one process.
- mldoctor attaches to the already running job (torchrun, 1 rank) without restarting it:
  ``mldoctor diagnose --pid <torchrun> --symptom slow --duration 10 --json``.

For each script the table says which bottleneck each tool names first, whether that is the
injected one, and the wall time each needed (train-doctor's includes the script's start-up,
since it restarts it; mldoctor's is the time attached to a running job).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from doctor.live import demo  # noqa: E402
from doctor.scenarios import SCENARIOS, STEP_LINE_RE, TRAIN_JOB, free_port, job_command  # noqa: E402

SCRIPTS = ["dataloader_heavy", "host_sync", "compile_recompile", "checkpoint_sync", "healthy"]
#: train-doctor finding ids that name the same bottleneck as an mldoctor cause
SAME = {"dataloader_starvation": {"dataloader_bound", "cpu_bound_preprocessing"},
        "host_sync_in_loop": {"host_sync_in_loop"},
        "checkpoint_stall": {"checkpoint_in_hot_loop"},
        "torch_compile_recompiles": set()}


def train_doctor(name: str, work: Path) -> dict:
    exe = shutil.which("train-doctor") or str(Path(sys.executable).with_name("train-doctor"))
    if not Path(exe).exists():
        return {"error": "train-doctor is not installed (pip install train-doctor)"}
    sc = SCENARIOS[name]
    argv = [exe, "profile", "--steps", "20", "--seconds", "5", "--out", str(work / "td"), "--json", "--",
            sys.executable, str(TRAIN_JOB), *sc.fault_argv()]
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "MLDOCTOR_SCRATCH_DIR": str(work / "scratch"), **dict(sc.env)}
    t0 = time.monotonic()
    res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900, cwd=work)
    wall = time.monotonic() - t0
    try:
        doc = json.loads(res.stdout)
    except ValueError:
        return {"error": f"exit {res.returncode}: {(res.stderr or res.stdout).strip().splitlines()[-1:]}", "wall": wall}
    if doc.get("error"):
        return {"error": str(doc["error"])[:200], "wall": wall}
    found = [f["id"] for f in doc.get("findings") or []]
    split = {k: round(v, 3) for k, v in (doc.get("split") or {}).items() if isinstance(v, (int, float))}
    return {"findings": found, "split": split, "wall": wall,
            "step_ms": round((doc.get("step_time_ms") or {}).get("median") or 0.0, 1)}


def mldoctor(name: str, work: Path) -> dict:
    argv, env = job_command(name, nproc=1, extra_env={"MLDOCTOR_SCRATCH_DIR": str(work / "scratch")})
    log = work / "job.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=work)
    try:
        want = {"compile_recompile": 10, "checkpoint_sync": 12}.get(name, 6)
        deadline = time.monotonic() + 300
        while max((int(m.group(2)) + 1 for m in STEP_LINE_RE.finditer(log.read_text(errors="replace"))),
                  default=0) < want:
            if proc.poll() is not None or time.monotonic() > deadline:
                return {"error": "job did not start"}
            time.sleep(0.5)
        t0 = time.monotonic()
        res = subprocess.run([sys.executable, "-m", "doctor.cli", "diagnose", "--pid", str(proc.pid), "--symptom",
                              "slow", "--duration", "10", "--json"], capture_output=True, text=True, timeout=300)
        wall = time.monotonic() - t0
    finally:
        demo.stop(proc)
    rep = json.loads(res.stdout)
    return {"findings": [f"{f['cause']}({f['severity']})" for f in rep["findings"] if f["severity"] != "info"],
            "causes": [f["cause"] for f in rep["findings"] if f["severity"] != "info"], "wall": wall,
            "verdict": rep["verdict"]["state"]}


def main() -> int:
    rows = []
    for name in sys.argv[1:] or SCRIPTS:
        sc = SCENARIOS[name]
        with tempfile.TemporaryDirectory(prefix=f"bench-td-{name}-") as tmp:
            td = train_doctor(name, Path(tmp))
        with tempfile.TemporaryDirectory(prefix=f"bench-md-{name}-") as tmp:
            md = mldoctor(name, Path(tmp))
        want = sc.cause or "none injected"
        td_top = (td.get("findings") or ["none"])[0] if "error" not in td else "error"
        md_top = (md.get("causes") or ["none"])[0] if "error" not in md else "error"
        if sc.cause is None:  # alone, this script is input-bound: agreeing on that is right
            td_ok = td_top in ("none", *SAME["dataloader_starvation"])
            md_ok = md_top in ("none", "dataloader_starvation")
        else:
            td_ok = td_top in SAME.get(want, set())
            md_ok = md_top == want
        rows.append((name, want, td, td_ok, md, md_ok))
        print(f"{name}: train-doctor {td}; mldoctor {md}", flush=True)
    print()
    print("| script | injected bottleneck | train-doctor (restarts the script) | right? | mldoctor (attaches, no restart) | right? |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, want, td, td_ok, md, md_ok in rows:
        if "error" in td:
            tdc = f"error: {td['error']}"
        else:
            tdc = (", ".join(td["findings"]) or "no finding") + f"; split {td['split']}; {td['wall']:.0f} s"
        mdc = ("error: " + md["error"]) if "error" in md else \
            (", ".join(md["findings"]) or "no finding") + f"; {md['wall']:.0f} s"
        print(f"| {name} | {want} | {tdc} | {'yes' if td_ok else 'no'} | {mdc} | {'yes' if md_ok else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
