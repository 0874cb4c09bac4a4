"""Secrets never reach anything mldoctor writes.

Fake secrets are planted where real ones live: a real torchrun/gloo job's environment, its
command line and its log (including a private key block, URL credentials, a JWT and
``--password=...``). The job's /proc files, a py-spy dump and the log are then diagnosed with
``--out`` (plain and ``--redact-hosts``), through the live agent's Bundle path and through
``mldoctor report``; every file written, and every member of every archive after gunzip, is
searched for each planted value.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from doctor.cli import app
from doctor.engine.diagnose import diagnose_path
from doctor.evidence.bundle import Bundle
from doctor.evidence.redact import MASK, HostRedactor, filter_env_text, scrub, scrub_bytes
from doctor.evidence.unpickle import safe_loads
from doctor.render.output import write_outputs

from .conftest import FIXTURES, mldoctor

PEM_BODY = "MIIEpAIBAAKCAQEAplantedFAKEkeyMATERIALdoNotUse0123456789abcdefghij"
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJwbGFudGVkLWZha2UiLCJyb2xlIjoiYWRtaW4ifQ"
       ".c2lnbmF0dXJlUGxhbnRlZEZha2VWYWx1ZTAxMjM0NQ")
ENV_SECRETS = {
    "HF_TOKEN": "hf_FAKEplantedTOKENabcdefghijklmnop1234",
    "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
    "AWS_ACCESS_KEY_ID": "AKIAFAKEPLANTED12345",
    "AWS_SECRET_ACCESS_KEY": "FAKEplanted/secretKEYvalue0123456789abcdEF",
    "GITHUB_TOKEN": "ghp_FAKEplantedGitHubToken0123456789abcd",
    "OPENAI_API_KEY": "sk-proj-FAKEplantedOpenAIkey0123456789abcdefgh",
    "NCCL_FAKE_PASSWORD": "hunter2-planted",
    "TORCH_HUB_TOKEN": "ghp_FAKEplantedHubToken0123456789abcdefgh",
    "DATABASE_URL": "postgres://trainer:pgPl4ntedPw@db.internal:5432/runs",
    # No telltale shape or key word: only the environment allowlist keeps it out (it is not logged:
    # nothing could tell it from any other word in a log).
    "INTERNAL_SESSION": "opaque-planted-session-7d1f9c",
}
ARGV_SECRETS = ["--password=cliPl4ntedPassword", "--api-key", "sk-FAKEplantedCLIkey0123456789abcdefgh",
                "--token", JWT, "--resume-from", "https://ci-bot:urlPl4ntedPass@artifacts.example.com/ckpt.pt"]
#: What must never appear, as written (the values, not the key names).
PLANTED = sorted({*ENV_SECRETS.values(), "cliPl4ntedPassword", "sk-FAKEplantedCLIkey0123456789abcdefgh", JWT,
                  "urlPl4ntedPass", "pgPl4ntedPw", PEM_BODY, "logPl4ntedPassword", "Bearer-planted-token-0123"})
REAL_HOST = "gpu-node-17.example.internal"
REAL_IP = "10.20.30.40"

JOB = r'''
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
r = dist.get_rank()
# What careless training scripts log: their argv and config, with credentials in them.
print(f"[secret-job] rank {r} argv: {' '.join(sys.argv[1:])}", flush=True)
print(f"[secret-job] rank {r} db={os.environ['DATABASE_URL']}", flush=True)
if r == 0:
    print("config: {'wandb': {'api_key': '%s'}, 'password': 'logPl4ntedPassword'}" % os.environ["WANDB_API_KEY"])
    print("loaded deploy key:\n-----BEGIN RSA PRIVATE KEY-----\n%s\n-----END RSA PRIVATE KEY-----" % os.environ["PEM_BODY"])
    print("GET /v1/models Authorization: Bearer Bearer-planted-token-0123")
    print("rendezvous via %s:29500 on host %s" % (os.environ["FAKE_PEER_IP"], os.environ["HOSTNAME"]), flush=True)
t = torch.ones(8)
dist.all_reduce(t)
print(f"[secret-job] rank {r} ready", flush=True)
time.sleep(300)
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _rank_pids(launcher: int) -> dict[int, int]:
    ranks = {}
    for pid in _children(launcher):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(b"RANK="):
                ranks[int(item[5:])] = pid
    return ranks


def all_written(out: Path) -> dict[str, bytes]:
    """Every file under ``out``, and every member of each archive (after gunzip), by name."""
    found: dict[str, bytes] = {}
    for p in sorted(out.rglob("*")):
        if not p.is_file():
            continue
        found[str(p)] = p.read_bytes()
        if p.name.endswith(".tar.gz"):
            found[f"{p}!tar-stream"] = gzip.decompress(p.read_bytes())  # names and headers too
            with tarfile.open(p, "r:gz") as tar:
                for m in tar.getmembers():
                    if m.isfile():
                        found[f"{p}!{m.name}"] = tar.extractfile(m).read()
    return found


def assert_no_planted(out: Path, planted: list[str] = PLANTED) -> int:
    files = all_written(out)
    assert files, f"nothing written under {out}"
    leaks = [(name, s) for name, data in files.items() for s in planted if s.encode() in data]
    assert not leaks, leaks
    return len(files)


@pytest.fixture(scope="module")
def real_job_evidence(tmp_path_factory) -> Path:
    """Evidence of a real 2-rank torchrun/gloo job with planted secrets, gathered as a probe would."""
    base = tmp_path_factory.mktemp("secret-job")
    script = base / "train_secret.py"
    script.write_text(JOB)
    ev = base / "evidence"
    ev.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(base), "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
           "NCCL_P2P_DISABLE": "1", "NCCL_DEBUG": "WARN", "HOSTNAME": REAL_HOST, "FAKE_PEER_IP": REAL_IP,
           "PEM_BODY": PEM_BODY, **ENV_SECRETS}
    log = open(ev / "torchrun.log", "wb")  # noqa: SIM115 - kept open for the job's lifetime
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
            "--master-port", str(_free_port()), str(script), *ARGV_SECRETS]
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, cwd=base)
    ranks: dict[int, int] = {}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ranks = _rank_pids(proc.pid)
            text = (ev / "torchrun.log").read_text(errors="replace")
            if len(ranks) == 2 and all(f"[secret-job] rank {r} ready" in text for r in (0, 1)):
                break
            assert proc.poll() is None, text[-3000:]
            time.sleep(0.2)
        else:
            pytest.fail("the secret job did not start in 120 s:\n" + (ev / "torchrun.log").read_text()[-3000:])
        for r, pid in sorted(ranks.items()):
            (ev / f"environ-rank{r}").write_bytes(Path(f"/proc/{pid}/environ").read_bytes())
            (ev / f"cmdline-rank{r}").write_bytes(Path(f"/proc/{pid}/cmdline").read_bytes())
        if shutil.which("py-spy"):
            dump = subprocess.run(["py-spy", "dump", "--pid", str(ranks[0])], capture_output=True, text=True, timeout=60)
            if dump.returncode == 0:
                (ev / "pyspy-rank0.txt").write_text(dump.stdout)
    finally:
        pids = [proc.pid, *ranks.values()]
        for pid in pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        proc.wait(timeout=30)
        log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() and
                                                  Path(f"/proc/{p}/stat").read_text().split()[2] != "Z"
                                                  for p in ranks.values() if Path(f"/proc/{p}/stat").exists()):
            time.sleep(0.1)
    # the evidence really carries every planted secret (else the test below proves nothing)
    everything = b"".join(p.read_bytes() for p in ev.iterdir())
    missing = [s for s in PLANTED if s.encode() not in everything]
    assert not missing, missing
    assert b"--password=cliPl4ntedPassword" in (ev / "cmdline-rank0").read_bytes()
    return ev


@pytest.mark.live
def test_real_job_secrets_never_reach_any_output(real_job_evidence, tmp_path):
    ev = real_job_evidence
    # 1. the CLI: diagnose a loose folder with --out
    out = tmp_path / "out"
    res = mldoctor("diagnose", "--from", str(ev), "--out", str(out))
    assert res.returncode in (0, 1, 3), res.stderr
    assert (out / "report.md").is_file() and list(out.glob("mldoctor-*.tar.gz"))
    for s in PLANTED:
        assert s not in res.stdout
    n = assert_no_planted(out)
    assert n >= 10  # 5 files + the archive's members
    report = json.loads((out / "report.json").read_text())
    assert report["facts"]["env"]["vars"]["NCCL_P2P_DISABLE"] == "1"  # the useful part survives
    assert any(f["cause"] == "nccl_slow_transport" for f in report["findings"])
    manifest_kinds = {a["path"]: a["kind"] for a in json.loads(
        next(v for k, v in all_written(out).items() if k.endswith("/manifest.json")))["artifacts"]}
    assert manifest_kinds["loose/environ-rank0"] == "env"
    # the masked places are visible as masked
    log = next(v for k, v in all_written(out).items() if k.endswith("/loose/torchrun.log")).decode()
    assert "-----BEGIN RSA PRIVATE KEY-----" + MASK in log and "--password=" + MASK in log

    # 2. --redact-hosts: host names and IPs replaced everywhere written, the map beside the archive
    out2 = tmp_path / "out2"
    res = mldoctor("diagnose", "--from", str(ev), "--out", str(out2), "--redact-hosts")
    assert res.returncode in (0, 1, 3), res.stderr
    hostmap = json.loads((out2 / "host-map.json").read_text())["mapping"]
    assert hostmap[REAL_HOST].startswith("host-") and hostmap[REAL_IP].startswith("ip-")
    assert (out2 / "host-map.json").stat().st_mode & 0o777 == 0o600
    written = all_written(out2)
    assert not [k for k in written if "!" in k and k.endswith("host-map.json")]
    reals = [REAL_HOST, "gpu-node-17", REAL_IP]
    if len(socket.gethostname()) >= 3:  # shorter names are too likely to be words; not redacted
        reals.append(socket.gethostname())
    for name, data in written.items():
        if name.endswith(("host-map.json", ".tar.gz")):  # archives: checked after gunzip (their members)
            continue
        for real in reals:
            assert real.encode() not in data, (name, real)
    assert_no_planted(out2)
    red = json.loads((out2 / "report.json").read_text())
    assert hostmap[REAL_HOST] in red["facts"]["job"]["hosts"]
    log2 = next(v for k, v in written.items() if k.endswith("/loose/torchrun.log")).decode()
    assert f"rendezvous via {hostmap[REAL_IP]}:29500 on host {hostmap[REAL_HOST]}" in log2

    # 3. the live agent's path: probes hand raw artifacts to a Bundle, write_outputs archives it
    live = Bundle.create(tmp_path / "live" / "bundle", {"type": "live", "job": "secret-job"})
    for p in sorted(ev.iterdir()):
        kind = "env" if p.name.startswith("environ") else "procs" if p.name.startswith("cmdline") else "logs"
        live.add_artifact(f"hosts/{REAL_HOST}/{kind}/{p.name}", p.read_bytes(), kind, host=REAL_HOST,
                          text=not p.name.startswith(("environ", "cmdline")))
    live.save()
    assert_no_planted(tmp_path / "live")  # the bundle folder itself, before any report
    out3 = tmp_path / "out3"
    write_outputs(diagnose_path(live.root), out3, bundle=live)
    assert_no_planted(out3)

    # 4. mldoctor report, every format, to files
    out4 = tmp_path / "out4"
    out4.mkdir()
    archive = next(out.glob("mldoctor-*.tar.gz"))
    runner = CliRunner()
    for fmt in ("md", "html", "json"):
        for src in (ev, archive):
            res = runner.invoke(app, ["report", str(src), "--format", fmt, "--out", str(out4 / f"{src.name}.{fmt}")])
            assert res.exit_code == 0, res.output
            stdout = runner.invoke(app, ["report", str(src), "--format", fmt]).stdout
            assert stdout and not [s for s in PLANTED if s in stdout]
    assert_no_planted(out4)


def test_captured_environ_files_keep_no_secret(tmp_path):
    """The stored real /proc environ captures (tests/fixtures/env_capture) with their planted
    tokens, and a log with every secret shape, through --out."""
    folder = tmp_path / "evidence"
    shutil.copytree(FIXTURES / "env_capture" / "slow_transport", folder)
    (folder / "train.log").write_text(
        "starting with --password=cliPl4ntedPassword --hf-token hf_FAKEplantedTOKENabcdefghijklmnop1234\n"
        f"resume from https://ci-bot:urlPl4ntedPass@artifacts.example.com/ckpt.pt token={JWT}\n"
        f"-----BEGIN OPENSSH PRIVATE KEY-----\n{PEM_BODY}\n-----END OPENSSH PRIVATE KEY-----\n")
    out = tmp_path / "out"
    write_outputs(diagnose_path(folder), out, from_path=folder)
    planted = ["hf_FAKEplantedTOKENabcdefghijklmnop1234", "0123456789abcdef0123456789abcdef01234567",
               "FAKEplanted/secretKEYvalue0123456789abcdEF", "hunter2-planted",
               "ghp_FAKEplantedGitHubToken0123456789abcd", "cliPl4ntedPassword", "urlPl4ntedPass", JWT, PEM_BODY]
    assert_no_planted(out, planted)


# ------------------------------------------------------------------------------- the patterns
@pytest.mark.parametrize("text, secret", [
    ("HF_TOKEN=hf_FAKEplantedTOKENabcdefghijklmnop1234", "hf_FAKEplanted"),
    ("export WANDB_API_KEY=0123456789abcdef0123456789abcdef01234567", "0123456789abcdef0123"),
    ("aws_secret_access_key = FAKEplanted/secretKEYvalue0123456789abcdEF", "FAKEplanted/secret"),
    ("key id AKIAFAKEPLANTED12345 in use", "AKIAFAKEPLANTED12345"),
    ("remote: https://x:ghp_FAKEplantedGitHubToken0123456789abcd@github.com/o/r", "ghp_FAKEplanted"),
    ("token github_pat_11FAKEplanted0123456789_abcdefghijklmnop", "github_pat_11FAKE"),
    ("OPENAI_API_KEY=sk-proj-FAKEplantedOpenAIkey0123456789abcdefgh", "sk-proj-FAKE"),
    ("client = OpenAI(api_key='sk-FAKEplantedCLIkey0123456789abcdefgh')", "sk-FAKEplanted"),
    ("python train.py --password=cliPl4ntedPassword --lr 0.1", "cliPl4ntedPassword"),
    ("python train.py --password cliPl4ntedPassword --lr 0.1", "cliPl4ntedPassword"),
    ("python train.py --db-password 'quoted pass phrase'", "quoted pass"),
    ("mysql://root:pgPl4ntedPw@10.0.0.5:3306/db", "pgPl4ntedPw"),
    ('{"password": "with spaces inside", "user": "x"}', "with spaces"),
    ('"{\\"password\\": \\"escapedPl4nted\\"}"', "escapedPl4nted"),
    ("Authorization: Bearer Bearer-planted-token-0123", "Bearer-planted-token"),
    (f"jwt {JWT} end", JWT[:40]),
    ("-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIFAKEplanted\n-----END EC PRIVATE KEY-----", "MHcCAQEEIFAKE"),
    ("-----BEGIN PGP PRIVATE KEY BLOCK-----\nlQOYBFAKEplanted\n-----END PGP PRIVATE KEY BLOCK-----", "lQOYBFAKE"),
    ("truncated -----BEGIN PRIVATE KEY-----\nMIIEvQIBFAKEplanted...", "MIIEvQIBFAKE"),
    ("SOME_SERVICE_KEY=opaquePl4nted", "opaquePl4nted"),
    ("slack xoxb-1234567890-FAKEplanted", "xoxb-1234567890"),
    ("glpat-FAKEplanted0123456789abc in .gitlab-ci", "glpat-FAKE"),
])
def test_scrub_masks_every_secret_shape(text, secret):
    out = scrub(text)
    assert secret not in out and MASK in out
    assert scrub(out) == out  # idempotent: scrubbing twice changes nothing more


@pytest.mark.parametrize("text", [
    "max_tokens=4096 tokens_per_sec=1234.5 num_tokens: 8192",
    "TOKENIZERS_PARALLELISM=false NCCL_IB_HCA=mlx5_0 NCCL_SOCKET_IFNAME=eth0",
    "    all_reduce (torch/distributed/distributed_c10d.py:3252)",
    "author: someone  keyboard interrupt  PWD=/home/user/run",
    "[rank3]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=42, OpType=ALLREDUCE)",
    "step 120 loss 2.3456 grad_norm 1.02 lr 3e-4",
])
def test_scrub_leaves_diagnostic_text_alone(text):
    assert scrub(text) == text


def test_scrub_bytes_keeps_pickles_loadable():
    secret_pickle = pickle.dumps({"frames": ["train (x.py:3)"], "cmd": "--password=hunter2planted --x 1",
                                  "env": "HF_TOKEN=hf_FAKEplantedTOKENabcdefghijklmnop1234"}, protocol=4)
    masked = scrub_bytes(secret_pickle)
    assert len(masked) == len(secret_pickle)
    value = safe_loads(masked)
    assert "hunter2planted" not in value["cmd"] and value["cmd"].startswith("--password=*")
    assert "hf_FAKEplanted" not in value["env"] and value["frames"] == ["train (x.py:3)"]
    # NUL-separated /proc cmdline: the flag's value, and nothing past the NUL
    cmd = b"python\0train.py\0--password\0cliPl4nted\0--lr\0" + b"0.1\0"
    assert scrub_bytes(cmd) == b"python\0train.py\0--password\0**********\0--lr\x000.1\0"


def test_env_filter_drops_everything_outside_the_allowlist():
    raw = (FIXTURES / "env_capture" / "slow_transport" / "environ-rank0").read_text()
    kept = filter_env_text(raw).split("\0")
    keys = {k.split("=", 1)[0] for k in kept if k}
    assert "NCCL_P2P_DISABLE" in keys and "RANK" in keys
    assert not keys & {"PATH", "HOME", "HF_TOKEN", "WANDB_API_KEY", "NCCL_FAKE_PASSWORD", "TORCH_HUB_TOKEN"}
    multi = "RANK=0\nSSH_KEY=-----BEGIN RSA PRIVATE KEY-----\nMIIEbodyLINE\n-----END RSA PRIVATE KEY-----\n"
    assert filter_env_text(multi) == "RANK=0\n"  # continuation lines of a dropped value go too


def test_host_redactor_is_consistent():
    red = HostRedactor(["node07.cluster.local", "node12"])
    text = "node07 talks to node12 at 10.1.2.3 and 10.1.2.3 again; node07.cluster.local; node070; 127.0.0.1"
    out = red(text)
    assert out == "host-0 talks to host-1 at ip-0 and ip-0 again; host-0; node070; 127.0.0.1"
    assert red("10.1.2.4 then 10.1.2.3.") == "ip-1 then ip-0."
    assert red("version 1.2.3 and 999.1.1.1") == "version 1.2.3 and 999.1.1.1"  # not addresses
    # IPv6, from a real NCCL IB error line (https://github.com/NVIDIA/nccl/issues/1405 style): full and "::" forms
    line = ("H100-2:19989:20082 [1] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer "
            "fe80::966d:ae03:8b:df78%ib0<53249> localGid fd00:1148:9000:5000:4:200:3:ff22 at 13:31:22 in "
            "c10d::ProcessGroupNCCL::WorkNCCL, ::1")
    out = red(line)
    assert "fe80::966d" not in out and "fd00:1148" not in out, out
    assert "peer ip-2%ib0<53249> localGid ip-3 at 13:31:22 in c10d::ProcessGroupNCCL::WorkNCCL" in out, out
    assert out.endswith("WorkNCCL, ::1")  # loopback kept
