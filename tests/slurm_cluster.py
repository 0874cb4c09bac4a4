"""A real two-node SLURM cluster on localhost, for tests and the SLURM benchmark.

Debian's ``slurmctld``, ``slurmd`` and ``munge`` (installed by ``.ci/run``; nothing is installed
here) run one controller and two ``slurmd`` (``slurmd -N node1`` / ``-N node2``) on this host,
everything (key, sockets, state, spool, logs, ports) under a temp dir, so nothing touches the
host's own SLURM or munge setup. Clients find it through ``SLURM_CONF`` (see :attr:`env`).

    with SlurmCluster(tmp_path) as cluster:
        job_id = cluster.sbatch(script_text)
        cluster.wait_state(job_id, "RUNNING", 30)

Each daemon runs in the foreground in its own session, so :meth:`stop` can end exactly the
processes this helper started (and the job steps they spawned) by their ids.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "scancel")
NODES = ("node1", "node2")
CPUS = 2


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]


def _which(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def _consecutive_free_ports(n: int) -> int:
    """A first port P with P..P+n-1 free a moment ago (NodeName Port= takes a range)."""
    for _ in range(50):
        base = _free_ports(1)[0]
        if base + n > 65535:
            continue
        ok = True
        for p in range(base, base + n):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no range of free ports found")


class SlurmCluster:
    """munged + slurmctld + two slurmd on localhost, under ``root``; a context manager."""

    def __init__(self, root: Path, nodes: tuple[str, ...] = NODES, cpus: int = CPUS,
                 overrides: dict[str, str] | None = None) -> None:
        self.root = Path(root)
        self.overrides = overrides or {}
        self.nodes = nodes
        self.cpus = cpus
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.conf = self.root / "etc" / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        for key in list(self.env):  # a test run inside some other allocation must not leak into ours
            if key.startswith(("SLURM_", "SRUN_", "SBATCH_", "SALLOC_")) and key != "SLURM_CONF":
                del self.env[key]

    # -- setup ---------------------------------------------------------------------------------
    def _write_config(self) -> None:
        for sub in ("etc", "state", "log", "munge", "work"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            (self.root / "spool" / node).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(128))
        os.chmod(key, 0o600)
        ctld_port = _free_ports(1)[0]
        node_port = _consecutive_free_ports(len(self.nodes))
        self.ctld_port = ctld_port
        names = f"node[1-{len(self.nodes)}]"
        r = self.root
        self.conf.write_text(f"""\
# Written by tests/slurm_cluster.py: a throwaway localhost cluster.
ClusterName=mldoctor-test
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmdTimeout=300
MessageTimeout=10
KillWait=5
InactiveLimit=0
MinJobAge=300
NodeName={names} NodeHostname=localhost NodeAddr=127.0.0.1 Port={node_port}-{node_port + len(self.nodes) - 1} CPUs={self.cpus} State=UNKNOWN
PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP
""")
        if self.overrides:  # e.g. accounting through slurmdbd for the fixture capture
            lines = []
            for line in self.conf.read_text().splitlines():
                key = line.split("=", 1)[0]
                if key in self.overrides:
                    line = f"{key}={self.overrides[key]}"
                lines.append(line)
            for key, value in self.overrides.items():
                if not any(ln.startswith(key + "=") for ln in lines):
                    lines.insert(-2, f"{key}={value}")
            self.conf.write_text("\n".join(lines) + "\n")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.stdio", "wb")  # noqa: SIM115 - closed with the process
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True, cwd=self.root)
        log.close()

    def start(self, timeout: float = 60.0) -> SlurmCluster:
        missing = missing_binaries()
        if missing:
            raise RuntimeError("SLURM/munge binaries missing: " + ", ".join(missing))
        self._write_config()
        m = self.root / "munge"
        self._spawn("munged", [_which("munged"), "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={m / 'munge.key'}", f"--pid-file={m / 'munged.pid'}",
                               f"--log-file={m / 'munged.log'}", f"--seed-file={m / 'munged.seed'}"])
        self._poll(lambda: self.munge_socket.exists(), 10, "munged did not create its socket")
        self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._poll(lambda: self._run(["scontrol", "ping"], check=False).returncode == 0 and
                   "UP" in self._run(["scontrol", "ping"], check=False).stdout, 20,
                   "slurmctld did not answer scontrol ping")
        for node in self.nodes:
            self._spawn(f"slurmd-{node}", [_which("slurmd"), "-D", "-N", node, "-f", str(self.conf)])
        self.wait_nodes_idle(timeout)
        return self

    def wait_nodes_idle(self, timeout: float = 60.0) -> None:
        def idle() -> bool:
            out = self._run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout
            states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
            return all(states.get(n, "").startswith("idle") for n in self.nodes)
        self._poll(idle, timeout, "the nodes did not become idle")

    def _poll(self, cond, timeout: float, what: str) -> None:  # noqa: ANN001
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode}: {self.log_tail(name)}")
            if cond():
                return
            time.sleep(0.2)
        raise RuntimeError(f"{what} within {timeout:.0f}s; slurmctld log: {self.log_tail('slurmctld.log')}")

    def log_tail(self, name: str, n: int = 1500) -> str:
        for p in (self.root / "log" / name, self.root / "log" / f"{name}.stdio", self.root / "log" / f"{name}.log"):
            if p.is_file():
                return p.read_text(errors="replace")[-n:]
        return ""

    # -- use -----------------------------------------------------------------------------------
    def _run(self, argv: list[str], check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=timeout)
        if check and res.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: exit {res.returncode}: {res.stderr.strip()}")
        return res

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """A SLURM client command against this cluster."""
        return self._run(list(argv), check=check, timeout=timeout)

    def sbatch(self, script: str, *args: str) -> str:
        path = self.root / "work" / f"job-{time.monotonic_ns()}.sh"
        path.write_text(script)
        out = self.run("sbatch", "--parsable", f"--chdir={self.root / 'work'}", *args, str(path)).stdout
        return out.strip().split(";")[0]

    def job_state(self, job_id: str) -> str:
        out = self.run("scontrol", "show", "job", job_id, check=False).stdout
        m = re.search(r"JobState=(\S+)", out)
        return m.group(1) if m else ""

    def wait_state(self, job_id: str, state: str, timeout: float) -> None:
        self._poll(lambda: self.job_state(job_id) == state, timeout, f"job {job_id} did not reach {state}")

    def pause_node(self, node: str) -> None:
        """SIGSTOP this node's slurmd (our own daemon): it stops answering, like a hung node."""
        os.kill(self.procs[f"slurmd-{node}"].pid, signal.SIGSTOP)

    def resume_node(self, node: str) -> None:
        os.kill(self.procs[f"slurmd-{node}"].pid, signal.SIGCONT)

    # -- teardown ------------------------------------------------------------------------------
    def stop(self) -> None:
        """Cancel every job, then end the daemons this helper started and everything they spawned."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            for node in self.nodes:  # a stopped slurmd would never see the cancel
                p = self.procs.get(f"slurmd-{node}")
                if p is not None and p.poll() is None:
                    os.kill(p.pid, signal.SIGCONT)
            self._run(["scancel", "--user=root"], check=False, timeout=10)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and self.run("squeue", "-h", check=False).stdout.strip():
                time.sleep(0.2)
        for name in reversed(list(self.procs)):
            p = self.procs[name]
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)
        # slurmstepd daemonizes out of slurmd's session; whatever of ours is left goes now.
        for pid in self._own_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _own_pids(self) -> list[int]:
        """Live processes started through this cluster: they carry our SLURM_CONF in their environment."""
        mine = f"SLURM_CONF={self.conf}".encode()
        out = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                env = Path(f"/proc/{entry}/environ").read_bytes()
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state == "Z" or mine not in env.split(b"\0"):
                continue
            out.append(int(entry))
        return out

    def __enter__(self) -> SlurmCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory):
    """A running localhost cluster for one test module; skipped when SLURM is not installed."""
    missing = missing_binaries()
    if missing:
        pytest.skip("SLURM/munge not installed (.ci/run apt-installs slurm-wlm slurm-client munge): "
                    "missing " + ", ".join(missing))
    if os.geteuid() != 0:
        pytest.skip("the localhost SLURM cluster runs its daemons as root (SlurmUser=root)")
    root = Path(tempfile_dir(tmp_path_factory))
    cluster = SlurmCluster(root)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    try:
        yield cluster
    finally:
        cluster.stop()


def tempfile_dir(factory: pytest.TempPathFactory) -> Path:
    """A short path: munge and slurmd sockets live under it (sun_path is 108 bytes)."""
    import tempfile

    return Path(tempfile.mkdtemp(prefix="mldslurm-", dir="/tmp"))


def train_job_script(fault: str, fault_rank: int | None = None, *, nodes: int = 2, tasks_per_node: int = 2,
                     port: int | None = None, job_args: tuple[str, ...] = (), env: dict[str, str] | None = None,
                     python: str | None = None) -> str:
    """An sbatch script: ``doctor/scenarios/train_job.py`` with one task per rank, through srun.

    A small wrapper in the step derives the torch.distributed variables from SLURM's
    (RANK=SLURM_PROCID, WORLD_SIZE=SLURM_NTASKS, LOCAL_RANK=SLURM_LOCALID); every node here is
    this host, so MASTER_ADDR is 127.0.0.1 (on a real cluster: the first node of the job).
    """
    import shlex
    import sys

    from doctor.scenarios import TRAIN_JOB, free_port

    argv = [python or sys.executable, str(TRAIN_JOB), "--fault", fault]
    if fault_rank is not None:
        argv += ["--fault-rank", str(fault_rank)]
    argv += list(job_args)
    exports = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port or free_port()), "OMP_NUM_THREADS": "1",
               "TORCH_FR_BUFFER_SIZE": "2000", "PYTHONUNBUFFERED": "1", **(env or {})}
    lines = ["#!/bin/bash", f"#SBATCH --nodes={nodes} --ntasks-per-node={tasks_per_node} --job-name=train-{fault}"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in exports.items()]
    inner = ("export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID "
             "LOCAL_WORLD_SIZE=$SLURM_NTASKS_PER_NODE; exec " + " ".join(shlex.quote(a) for a in argv))
    lines.append(f"srun --kill-on-bad-exit=0 bash -c {shlex.quote(inner)}")
    return "\n".join(lines) + "\n"
