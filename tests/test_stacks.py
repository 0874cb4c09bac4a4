"""The stacks evidence kind: parsing every dump format, classifying threads, grouping ranks,
live collection, and the diagnosis it leads to.

Evidence comes from real captures (tests/fixtures/evidence/<scenario>, tests/fixtures/stacks/*)
or from real processes this test starts (faulthandler, gdb, py-spy --locals, collect); every
process started here is killed and checked gone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from doctor.probes import stacks as S
from doctor.probes.stacks import classify as ss
from doctor.probes.stacks import live, summary

from doctor.engine import facts as facts_mod
from doctor.evidence import plugins
from doctor.evidence.bundle import Bundle
from doctor.evidence.contract import (
    CollectContext,
    Hints,
    ProbeFailed,
    ProbeSkipped,
    RankProcess,
    Sample,
)
from doctor.evidence.errors import EvidenceError

from .conftest import FIXTURES, diagnose_json

EV = FIXTURES / "evidence"
ST = FIXTURES / "stacks"
PROBE = S.PROBE


def parse(path: Path, rel: str | None = None) -> list:
    rel = rel or path.name
    return PROBE.parse(path, rel, Hints.from_path(rel))


def stacks_facts(path: Path) -> dict:
    facts, _ = facts_mod.build(facts_mod.items_from_folder(path), "loose")
    return facts


def needs(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"fixture {path.relative_to(FIXTURES)} not captured yet")
    return path


# -----------------------------------------------------------------------------------------------
# live processes of our own


TARGET = r'''
import os, sys, threading, time
SECRET = "hf_" + "Q" * 34  # a planted token: must never reach parsed facts
lock = threading.Lock()
held = threading.Event()
def holder():
    with lock:
        held.set()
        threading.Event().wait()
threading.Thread(target=holder, name="holder", daemon=True).start()
held.wait()
if os.environ.get("ARM_FAULTHANDLER"):
    import faulthandler
    faulthandler.dump_traceback_later(float(os.environ["ARM_FAULTHANDLER"]), exit=False)
print("ready", flush=True)
def stuck(api_token):
    lock.acquire()
stuck(SECRET)
'''


class Proc:
    """A process this test owns, in its own session, killed (and checked gone) at the end."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None, wait_ready: bool = True,
                 stderr: Path | None = None):
        self._err = open(stderr, "w") if stderr else None
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._err or subprocess.PIPE,
                                  text=True, start_new_session=True, env={**os.environ, **(env or {})})
        if wait_ready:
            line = self.p.stdout.readline()  # the target prints "ready" once its threads are set
            assert line.strip() == "ready", self.p.stderr.read()
            deadline = time.monotonic() + 10  # ... and the main thread has entered acquire
            while time.monotonic() < deadline:
                wchan = Path(f"/proc/{self.p.pid}/wchan").read_text()
                if wchan and wchan != "0" and "hrtimer" not in wchan:
                    break
                time.sleep(0.02)

    @property
    def pid(self) -> int:
        return self.p.pid

    def kill(self) -> None:
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.p.wait(timeout=10)
        assert self.p.poll() is not None
        if self._err:
            self._err.close()


@pytest.fixture
def target():
    proc = Proc([sys.executable, "-c", TARGET])
    yield proc
    proc.kill()


# -----------------------------------------------------------------------------------------------
# sniffing and parsing each format


@pytest.mark.parametrize("rel", [
    "evidence/extra_collective/pyspy-rank1.txt",
    "evidence/dataloader_hang/pyspy-rank3.json",
    "evidence/lock_self/pyspy-native-rank1.txt",
    "stacks/native_collective/gdb-rank1.txt",
    "stacks/faulthandler_tee/torchrun.log",
    "stacks/node_file/trace-node01.out",
    "stacks/subprocesses_dataloader/pyspy-rank3.txt",
    "stacks/live_rank_gone/hosts/node01/stacks/pyspy-rank3-snap0.error.json",
])
def test_sniff_claims_real_dumps(rel):
    assert PROBE.sniff(Sample.read(needs(FIXTURES / rel)))


@pytest.mark.parametrize("rel", [
    "evidence/extra_collective/env-rank0.txt",
    "evidence/extra_collective/torchrun.log",
    "env_capture/slow_transport/environ-rank0",
])
def test_sniff_leaves_other_evidence_alone(rel):
    assert not PROBE.sniff(Sample.read(needs(FIXTURES / rel)))


def test_pyspy_text_dump():
    out = parse(needs(EV / "extra_collective" / "pyspy-rank1.txt"))
    assert len(out) == 1
    d = out[0].data
    assert (d.rank, d.role, d.fmt, d.native) == (1, "rank", "pyspy_text", False)
    assert d.main.name == "MainThread" and d.main.state == "collective" and d.main.op == "barrier"
    assert d.main.site.startswith("sync_before_logging (doctor/scenarios/train_job.py:")
    assert {t.name for t in d.others} == {"fr-dumper", "feature-cache-refresher", "metrics-pusher"}
    assert all(t.state == "lock_wait" for t in d.others if t.name != "fr-dumper")


def test_pyspy_json_dump():
    d = parse(needs(EV / "dataloader_hang" / "pyspy-rank3.json"))[0].data
    assert (d.rank, d.fmt, d.pid) == (3, "pyspy_json", d.pid)
    assert d.main.state == "dataloader_wait" and d.main.op == "worker_queue"
    assert d.main.active is False and len(d.others) == 5


def test_pyspy_native_text_with_cpp_frames():
    d = parse(needs(EV / "lock_self" / "pyspy-native-rank1.txt"))[0].data
    assert d.native and d.main.state == "lock_wait" and d.main.op == "lock"
    assert d.main.top == "MetricsReporter.record (doctor/scenarios/train_job.py:169)" or \
        d.main.top.startswith("MetricsReporter.record (")
    pusher = next(t for t in d.others if t.name == "metrics-pusher")
    assert pusher.state == "io" and pusher.op == "socket"
    # a C++ frame whose name holds parentheses and spaces parses whole
    nat = parse(needs(ST / "native_collective" / "pyspy-native-rank0.txt"))[0].data
    assert nat.main.state == "collective" and nat.main.op == "all_reduce"


def test_subprocesses_dump_links_workers_to_their_rank():
    out = parse(needs(ST / "subprocesses_dataloader" / "pyspy-rank3.txt"))
    roles = sorted((p.data.role, p.data.rank) for p in out)
    assert roles == [("rank", 3), ("worker", 3), ("worker", 3)]
    workers = [p.data for p in out if p.data.role == "worker"]
    assert all(w.parent == out[0].data.pid and w.main.worker == "blocked" for w in workers)


def test_several_processes_per_file_and_rank_lines():
    unranked = parse(needs(ST / "node_file" / "trace-node01.out"))
    assert len(unranked) == 4 and all(p.data.rank is None for p in unranked)
    ranked = parse(needs(ST / "node_file" / "stacks-with-rank-lines.txt"))
    assert sorted(p.data.rank for p in ranked) == [0, 1, 2, 3]
    assert all(p.data.rank_source == "rank_line" for p in ranked)
    # together: the unlabelled dumps take the ranks of the same pids, nothing is counted twice
    st = stacks_facts(ST / "node_file")["stacks"]
    assert st["n_members"] == 4 and st["n_unranked"] == 0 and st["outliers"] == [1]


@pytest.mark.parametrize("folder,source", [("faulthandler_tee_rankprefix", "prefix"),
                                           ("faulthandler_tee", "local prefix")])
def test_faulthandler_in_torchrun_tee_log(folder, source):
    out = parse(needs(ST / folder / "torchrun.log"))
    by_rank = {p.data.rank: p.data for p in out}
    assert sorted(by_rank) == [0, 1] and all(d.rank_source == source for d in by_rank.values())
    assert by_rank[0].main.op == "all_reduce" and by_rank[1].main.op == "barrier"
    assert all(d.fmt == "faulthandler" and len(d.others) == 1 for d in by_rank.values())


def test_gdb_thread_apply_all_bt():
    d = parse(needs(ST / "native_io" / "gdb-rank2.txt"))[0].data
    assert (d.fmt, d.rank, d.native) == ("gdb", 2, True)
    assert d.main.state == "io" and d.main.op == "torch.save"  # caffe2 PyTorchStreamWriter
    assert d.pid is not None and d.main.tid == str(d.pid)
    assert len(d.others) >= 3  # gloo's native threads are there too


def test_live_faulthandler_dump_of_our_own_process(tmp_path):
    f = tmp_path / "rank5-faulthandler.txt"
    proc = Proc([sys.executable, "-X", "faulthandler", "-c", TARGET], env={"ARM_FAULTHANDLER": "0.3"},
                stderr=f)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and f.read_text().count("most recent call first") < 2:
            time.sleep(0.05)
    finally:
        proc.kill()
    assert PROBE.sniff(Sample.read(f))
    d = parse(f)[0].data
    assert d.fmt == "faulthandler" and d.rank == 5
    assert d.main.top.startswith("stuck (<string>:")  # the main thread: the one ending in <module>
    assert d.others[0].state == "lock_wait"  # the holder thread in Event.wait


def test_live_faulthandler_on_sigabrt(tmp_path):
    proc = Proc([sys.executable, "-X", "faulthandler", "-c", TARGET])
    os.kill(proc.pid, signal.SIGABRT)  # our own child
    _, err = proc.p.communicate(timeout=20)
    proc.kill()
    f = tmp_path / "crash.log"
    f.write_text(err)
    out = parse(f)
    assert any("Fatal Python error: Aborted" in n for n in out[0].notes)
    assert out[0].data.main.top.startswith("stuck (")


@pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb not installed")
def test_live_gdb_backtrace_of_our_own_process(target, tmp_path):
    r = subprocess.run(["gdb", "-p", str(target.pid), "-batch", "-nx", "-ex", "thread apply all bt"],
                       capture_output=True, text=True, timeout=120)
    f = tmp_path / "gdb-rank0.txt"
    f.write_text(r.stdout)
    d = parse(f)[0].data
    assert d.fmt == "gdb" and d.pid == target.pid and d.main.state == "lock_wait"
    assert len(d.others) == 1


def test_live_pyspy_locals_never_keep_values(target, tmp_path):
    exe = S.find_pyspy()
    out = subprocess.run([exe, "dump", "--locals", "--pid", str(target.pid)], capture_output=True,
                         text=True, timeout=60).stdout
    assert "hf_QQQQ" in out  # py-spy did print the local
    f = tmp_path / "pyspy-rank0.txt"
    f.write_text(out)
    parsed = parse(f)
    assert parsed[0].data.main.top.startswith("stuck (<string>:")
    assert "hf_QQQQ" not in repr(parsed)
    facts = stacks_facts(tmp_path)
    assert "hf_QQQQ" not in json.dumps(facts)


def test_truncated_text_and_json_are_parsed_as_far_as_they_go(tmp_path):
    text = needs(EV / "extra_collective" / "pyspy-rank0.txt").read_text()
    cut = tmp_path / "pyspy-rank0.txt"
    cut.write_text(text[: int(len(text) * 0.6)])
    p = parse(cut)
    assert p[0].data.main.state == "collective" and p[0].data.truncated
    assert any("truncated" in n for n in p[0].notes)
    raw = needs(EV / "dataloader_hang" / "pyspy-rank3.json").read_text()
    jcut = tmp_path / "pyspy-rank3.json"
    jcut.write_text(raw[: int(len(raw) * 0.8)])
    q = parse(jcut)
    assert q[0].data.truncated and len(q[0].data.others) + 1 >= 4
    assert any("truncated" in n for n in q[0].notes)


def test_garbage_gives_one_line_errors_and_the_rest_is_used(tmp_path):
    (tmp_path / "noise.bin").write_bytes(os.urandom(4096))
    (tmp_path / "notes.txt").write_text("hello\nworld\n")
    (tmp_path / "pyspy-rank9.json").write_text('[{"pid": 1, "owns_gil": false, "frames": [{"name": ')
    shutil.copy(needs(EV / "extra_collective" / "pyspy-rank1.txt"), tmp_path / "pyspy-rank1.txt")
    for name in ("noise.bin", "notes.txt"):
        assert not PROBE.sniff(Sample.read(tmp_path / name))
        with pytest.raises(EvidenceError) as exc:
            parse(tmp_path / name)
        assert "\n" not in str(exc.value)
    facts = stacks_facts(tmp_path)
    errors = facts["evidence"]["errors"]
    assert len(errors) == 1 and errors[0].startswith("pyspy-rank9.json: ") and "\n" not in errors[0]
    assert facts["stacks"]["by_rank"]["1"]["op"] == "barrier"


def test_log_with_an_embedded_dump_is_left_to_the_log_reader():
    """A real console log of a GPU run with one py-spy dump among other lines: not claimed (the log
    reader owns it), yet parse_text reads the dump for whoever hands it over."""
    log = needs(FIXTURES / "gpu" / "h200" / "bench" / "run2-console.txt")
    assert not PROBE.sniff(Sample.read(log))
    procs, _ = S.parse_text(log.read_text())
    d = summary.to_dump(procs[0], 0, log.name)
    assert (d.main.state, d.main.op) == ("cuda_sync", "cuStreamSynchronize")  # .item() on an H200
    assert d.main.top.startswith("stuck (capture_jobs.py:")


def test_every_fact_path_is_documented():
    schema = PROBE.facts_schema
    lists = {"groups", "collective_splits", "lock_holders", "dump_errors"}
    for folder in (EV / "lock_self", EV / "dataloader_hang", ST / "live_rank_gone", ST / "snapshots_extra_collective"):
        st = stacks_facts(needs(folder))["stacks"]
        for key, value in st.items():
            assert f"stacks.{key}" in schema, key
            if key in lists:
                for item in value:
                    for sub in item:
                        assert f"stacks.{key}[].{sub}" in schema, f"{key}[].{sub}"


# -----------------------------------------------------------------------------------------------
# shapes pasted into issue threads: bare gdb bt, py-spy without thread ids, gdb py-bt,
# traceback-style stacks, IDE call stacks (public copies and our own captures)

PUB = ST / "public_formats"
CAP = ST / "captured_formats"


def raw_procs(path: Path) -> list:
    procs, _ = S.parse_text(needs(path).read_text())
    return procs


def frames_of(thread) -> list[tuple[str, str, int, bool]]:
    return [tuple(f) for f in thread.frames]


def owner(path: Path) -> str:
    """The kind the diagnosis hands this file to (every registered probe sniffs, by priority)."""
    p = facts_mod._claim(Sample.read(needs(path)), plugins.probes())
    return p.name if p is not None else ""


@pytest.mark.parametrize("rel", [
    "public_formats/pytorch-130610-gdb-bt.txt", "public_formats/pytorch-129367-gdb-bt-rank3.txt",
    "public_formats/ami-140-pyspy-dump.txt", "public_formats/pytorch-97833-gdb-pybt-thread1.txt",
    "public_formats/pytorch-24927-worker-thread-stack.txt", "public_formats/jorldy-28-ide-stack.txt",
    "captured_formats/gdb-bt-dataloader-rank1.txt", "captured_formats/gdb-bt-tcpstore-rank0.txt",
    "captured_formats/pybt-dataloader-rank1.txt", "captured_formats/pybt-gil-py27.txt",
    "captured_formats/pybt-gil-py311.txt", "captured_formats/pybt-gil-py313.txt",
    "captured_formats/traceback-dataloader-rank1.txt", "captured_formats/traceback-py27.txt",
    "captured_formats/traceback-recipe-dataloader-rank1.txt", "captured_formats/pyspy-noid-dataloader-rank1.txt",
])
def test_pasted_shapes_are_claimed_by_the_stacks_probe(rel):
    assert owner(ST / rel) == "stacks"


def test_bare_gdb_bt_joins_wrapped_frames():
    # pytorch#130610: two frames, each wrapped onto an indented line, no Thread header
    (proc,) = raw_procs(PUB / "pytorch-130610-gdb-bt.txt")
    (t,) = proc.threads
    assert frames_of(t) == [("__internal_atexit", "stdlib/cxa_atexit.c", 41, True),
                            ("__GI___cxa_atexit", "stdlib/cxa_atexit.c", 70, True)]
    d = parse(PUB / "pytorch-130610-gdb-bt.txt")[0].data
    assert (d.fmt, d.native, d.main.state, d.main.op) == ("gdb", True, "lock_wait", "atexit_lock")
    # pytorch#129367: rank from the file name; "   from libtorch_cpu.so" continues frame #3
    d = parse(PUB / "pytorch-129367-gdb-bt-rank3.txt")[0].data
    assert (d.rank, d.rank_source, d.main.state, d.main.op) == (3, "file name", "init", "store")
    assert d.main.anchor == "c10d::TCPStore::doGet (libtorch_cpu.so)"
    (t,) = raw_procs(PUB / "pytorch-129367-gdb-bt-rank3.txt")[0].threads
    assert [f[0] for f in t.frames][:2] == ["__libc_recv", "__libc_recv"] and len(t.frames) == 5
    assert t.frames[3][0].endswith("c10d::tcputil::recvVector<unsigned char>") and t.frames[3][1] == "libtorch_cpu.so"


def test_bare_gdb_bt_of_our_own_hung_processes():
    # rank 0 of a 2-rank gloo init whose rank 1 never came: gdb -p PID -batch -ex bt
    out = parse(CAP / "gdb-bt-tcpstore-rank0.txt")
    assert len(out) == 1
    d = out[0].data
    assert (d.fmt, d.rank, d.main.state, d.main.op) == ("gdb", 0, "init", "store")
    assert d.pid is not None and d.main.frames[0].startswith("__GI___clock_nanosleep (")
    assert d.main.anchor.startswith("c10d::TCPStore::waitForWorkers (")
    # a DataLoader whose worker never returns: natively the main thread only polls its pipe
    d = parse(CAP / "gdb-bt-dataloader-rank1.txt")[0].data
    assert (d.rank, d.main.state, d.main.op) == (1, "ipc_wait", "poll") and not d.others


def test_pyspy_text_without_thread_ids():
    d = parse(PUB / "ami-140-pyspy-dump.txt")[0].data
    assert (d.fmt, d.main.name, d.main.tid) == ("pyspy_text", "MainThread", "")
    assert (d.main.state, d.main.op) == ("dataloader_wait", "worker_queue")
    assert d.main.top == "wait (threading.py:359)"
    (pin,) = d.others
    assert pin.name == "Thread-... (_pin_memory_loop)" and pin.state == "ipc_wait"
    main = raw_procs(PUB / "ami-140-pyspy-dump.txt")[0].threads[0]
    assert len(main.frames) == 9  # the poster's "..." is no frame
    d = parse(CAP / "pyspy-noid-dataloader-rank1.txt")[0].data
    assert (d.rank, d.main.name, d.main.state, d.main.op) == (1, "MainThread", "dataloader_wait", "worker_queue")
    assert {t.name for t in d.others} == {"watchdog", "QueueFeederThread"}


def test_gdb_pybt_innermost_first_and_waiting_for_the_gil():
    # pytorch#97833: one thread's py-bt, its header line not pasted
    (t,) = raw_procs(PUB / "pytorch-97833-gdb-pybt-thread1.txt")[0].threads
    assert t.frames[0] == ("take_gil", "Waiting for the GIL", 0, True)
    assert t.frames[1] == ("_invoke_rpc_python_udf", "<built-in>", 0, True)
    assert t.frames[2] == ("_invoke_rpc", "torch/distributed/rpc/api.py", 719, False)
    assert t.frames[-1] == ("then", "torch/futures/__init__.py", 161, False)
    d = parse(PUB / "pytorch-97833-gdb-pybt-thread1.txt")[0].data
    assert (d.fmt, d.main.state, d.main.op) == ("gdb_pybt", "lock_wait", "gil")
    assert d.main.top == "_invoke_rpc (torch/distributed/rpc/api.py:719)"


@pytest.mark.parametrize("name,re_file", [("pybt-gil-py27.txt", "re.py"), ("pybt-gil-py311.txt", "re/__init__.py"),
                                          ("pybt-gil-py313.txt", "re/__init__.py")])
def test_gdb_thread_apply_all_pybt_of_three_pythons(name, re_file):
    """'sleeper' woke while 'hog' holds the GIL in a C regex; the main thread waits on a lock."""
    d = parse(CAP / name)[0].data
    assert d.fmt == "gdb_pybt" and d.pid is not None and d.main.tid == str(d.pid)
    assert d.main.top.startswith("stuck (") and d.main.frames[-1].startswith("<module> (")
    sleeper = next(t for t in d.others if any(f.startswith("sleeper (") for f in t.frames))
    hog = next(t for t in d.others if any(f.startswith("hog (") for f in t.frames))
    assert (sleeper.state, sleeper.op) == ("lock_wait", "gil")
    assert hog.top.startswith(f"match ({re_file}:")
    # stdlib paths shortened as py-spy prints them; Python 2.7 names it __bootstrap
    assert hog.frames[-1] in ("_bootstrap (threading.py)", "__bootstrap (threading.py)")


def test_traceback_style_stacks_outermost_first():
    # pytorch#24927 (Python 2.7 paths): threading's __bootstrap first, so outermost first
    (t,) = raw_procs(PUB / "pytorch-24927-worker-thread-stack.txt")[0].threads
    assert t.frames[0] == ("dump", "pickle.py", 224, False)
    assert t.frames[-1] == ("__bootstrap", "threading.py", 783, False)
    d = parse(PUB / "pytorch-24927-worker-thread-stack.txt")[0].data
    assert (d.fmt, d.main.state, d.main.anchor) == ("traceback", "ipc_wait", "_feed (multiprocessing/queues.py:266)")
    # our own: the DataLoader process wrote its main thread's traceback.format_stack
    d = parse(CAP / "traceback-dataloader-rank1.txt")[0].data
    assert (d.fmt, d.rank, d.main.state, d.main.op) == ("traceback", 1, "dataloader_wait", "worker_queue")
    assert d.main.top.startswith("select (selectors.py:")
    d = parse(CAP / "traceback-py27.txt")[0].data
    assert d.main.top.startswith("wait (threading.py:") and d.main.state == "lock_wait"
    # every thread, as the all-threads recipe prints them ("# Thread: name(id)", 'File: "..."')
    d = parse(CAP / "traceback-recipe-dataloader-rank1.txt")[0].data
    assert (d.main.name, d.main.state, d.main.op) == ("MainThread", "dataloader_wait", "worker_queue")
    assert {t.name: t.state for t in d.others}["QueueFeederThread"] == "lock_wait"


def test_traceback_and_pybt_of_one_process_give_the_same_frames():
    """The same main thread printed outermost first (format_stack) and innermost first (py-bt,
    under its 'most recent call first' header) reads the same once the order is decided."""
    tb = raw_procs(CAP / "traceback-dataloader-rank1.txt")[0].threads[0]
    pybt_proc = raw_procs(CAP / "pybt-dataloader-rank1.txt")[0]
    main = next(t for t in pybt_proc.threads if t.tid == str(pybt_proc.pid))
    assert [f[:3] for f in tb.frames] == [f[:3] for f in main.frames]
    assert tb.frames[0][0] == "select" and tb.frames[-1][0] == "<module>"
    d = parse(CAP / "pybt-dataloader-rank1.txt")[0].data
    assert (d.fmt, d.rank, d.main.state) == ("gdb_pybt", 1, "dataloader_wait")


def test_ide_call_stack_is_native_frames():
    (t,) = raw_procs(PUB / "jorldy-28-ide-stack.txt")[0].threads
    assert [f[0] for f in t.frames] == ["futex_abstimed_wait_cancelable", "do_futex_wait", "__new_sem_wait_slow"]
    assert t.frames[0][1].endswith("/sysdeps/unix/sysv/linux/futex-internal.h") and t.frames[0][2] == 205
    d = parse(PUB / "jorldy-28-ide-stack.txt")[0].data
    assert (d.fmt, d.native, d.main.state, d.main.op) == ("ide", True, "lock_wait", "lock")


PY27 = Path(os.environ.get("PYENV_ROOT", "/root/.pyenv")) / "versions" / "2.7.18" / "bin" / "python"
RAISER = '''
def load(i):
    raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Bus error.")
def step(i):
    try:
        load(i)
    except RuntimeError as exc:
        raise ValueError("step %d failed" % i) from exc
step(3)
'''


@pytest.mark.parametrize("exe", [sys.executable, str(PY27)])
def test_exception_tracebacks_stay_logs(exe, tmp_path):
    """A real exception's traceback (a crash report) belongs to the log reader, even when the
    file holds nothing else; Python 2.7 has no chained exceptions, so it raises plainly."""
    if not Path(exe).exists():
        pytest.skip("Python 2.7 not installed")
    src = RAISER if "2.7" not in exe else RAISER.replace(" from exc", "")
    r = subprocess.run([exe, "-c", src], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "Traceback (most recent call last):" in r.stderr
    f = tmp_path / "stderr.txt"
    f.write_text(r.stderr)
    assert S.tb_is_exception(r.stderr.splitlines())
    assert not PROBE.sniff(Sample.read(f))
    assert owner(f) == "logs"
    # and the last traceback's frames alone (its exception line cut) are a stack, outermost first
    last = r.stderr.split("Traceback (most recent call last):")[-1]
    frames_only = "\n".join(ln for ln in last.splitlines() if ln.startswith(" ")) + "\n"
    (t,) = S.parse_text(frames_only)[0][0].threads
    assert [f[0] for f in t.frames] == ["step", "<module>"] if "2.7" not in exe else ["load", "step", "<module>"]


@pytest.mark.parametrize("rel", ["logs/worker_kill/torchrun.log", "logs/gpu_oom/torchrun.log",
                                 "../../bench/cases/public-pipedream-28-shm/train.log"])
def test_logs_with_tracebacks_are_not_stack_dumps(rel):
    f = needs((FIXTURES / rel).resolve())
    assert not PROBE.sniff(Sample.read(f))
    assert owner(f) == "logs"


# -----------------------------------------------------------------------------------------------
# classification


def test_pattern_table_is_documented_and_valid():
    for p in ss.PATTERNS:
        assert p["state"] in ss.STATES and p["tier"] in (1, 3) and len(p["why"]) > 15
        assert p.get("func") or p.get("file")
    assert set(PROBE.facts_schema) >= {"stacks.groups", "stacks.by_rank", "stacks.outliers",
                                       "stacks.majority_state", "stacks.majority_op", "stacks.frozen",
                                       "stacks.lock_holders", "stacks.snapshots", "stacks.n_ranks"}


def py(name, file, line=1):
    return (name, file, line, False)


def nat(name, lib="libtorch_cpu.so"):
    return (name, lib, 0, True)


@pytest.mark.parametrize("frames,active,state,op", [
    # the native Work.wait defers to the Python collective further out, which names the op
    ([nat("pthread_cond_wait", "libc.so.6"), nat("c10d::Work::wait"),
      py("all_gather_into_tensor", "torch/distributed/distributed_c10d.py"), py("step", "train.py")],
     False, "collective", "all_gather"),
    # a CUDA event wait inside an NCCL work wait is the collective, not a stuck GPU
    ([nat("cudaEventSynchronize", "libcudart.so.12"), nat("c10d::ProcessGroupNCCL::WorkNCCL::synchronizeStream"),
      py("all_reduce", "torch/distributed/distributed_c10d.py")], False, "collective", "all_reduce"),
    # .item() on a stuck GPU
    ([nat("cudaStreamSynchronize", "libcudart.so.12"), nat("at::native::_local_scalar_dense_cuda", "libtorch_cuda.so"),
      py("train_step", "train.py")], False, "cuda_sync", "cudaStreamSynchronize"),
    # waiting for the GIL after a collective returned: the GIL, not the collective
    ([nat("take_gil", "libpython3.11.so"), nat("PyEval_RestoreThread", "libpython3.11.so"),
      nat("c10d::Work::wait"), py("all_reduce", "torch/distributed/distributed_c10d.py")], False, "lock_wait", "gil"),
    # DataLoader queue wait: the inner generic poll does not decide
    ([py("_PollLikeSelector.select", "selectors.py"), py("Queue.get", "multiprocessing/queues.py"),
      py("_try_get_data", "torch/utils/data/dataloader.py"), py("main", "train.py")], False, "dataloader_wait", "worker_queue"),
    # Python < 3.11 names: bare _next_data over a fetch is single-process loading
    ([py("__getitem__", "ds.py"), py("fetch", "torch/utils/data/_utils/fetch.py"),
      py("_next_data", "torch/utils/data/dataloader.py")], True, "dataloader_fetch", "dataset"),
    ([py("Condition.wait", "threading.py"), py("Event.wait", "threading.py"), py("main", "train.py")],
     False, "lock_wait", "wait"),
    ([py("_store_based_barrier", "torch/distributed/distributed_c10d.py")], False, "init", "init_process_group"),
    ([py("load_file", "safetensors/torch.py"), py("main", "train.py")], False, "io", "safetensors"),
    ([py("forward", "model.py")], True, "python", ""),
    ([py("forward", "model.py")], False, "unknown", ""),
    ([], None, "idle", ""),
])
def test_classifier_precedence(frames, active, state, op):
    v = ss.classify(frames, active)
    assert (v.state, v.op) == (state, op)


# -----------------------------------------------------------------------------------------------
# cross-rank analysis on the captured jobs


def test_groups_majority_outliers_and_splits():
    st = stacks_facts(needs(EV / "extra_collective"))["stacks"]
    assert st["n_ranks"] == 4 and st["majority_state"] == "collective" and st["majority_op"] == "all_reduce"
    g0, g1 = st["groups"]
    assert (g0["ranks"], g0["op"], g0["majority"], g0["share"]) == ([0, 2, 3], "all_reduce", True, 0.75)
    assert (g1["ranks"], g1["op"], g1["majority"]) == ([1], "barrier", False)
    assert st["outliers"] == [1] and st["by_rank"]["1"]["group"] == g1["id"]
    assert [s["ranks"] for s in st["collective_splits"]] == [[0, 2, 3], [1]]
    assert st["progress"] == "unknown" and st["snapshots"] == 1


def test_single_rank_dump_still_gives_a_state():
    st = stacks_facts(needs(EV / "checkpoint_io" / "pyspy-rank2.txt"))["stacks"]
    assert st["by_rank"] == {"2": st["by_rank"]["2"]} and st["by_rank"]["2"]["state"] == "io"
    assert st["n_ranks"] == 1 and st["outliers"] == []


def test_snapshots_frozen_and_moving():
    st = stacks_facts(needs(ST / "snapshots_extra_collective"))["stacks"]
    assert st["snapshots"] == 2 and st["frozen"] == [0, 1, 2, 3] and st["progress"] == "frozen"
    st = stacks_facts(needs(ST / "snapshots_rank0_exclusive"))["stacks"]
    assert st["progress"] == "frozen" and 0 in st["moving"] and st["frozen"] == [1, 2, 3]


def test_native_dump_explains_a_plain_later_snapshot():
    st = stacks_facts(needs(ST / "gpu_cuda_hang"))["stacks"]
    assert st["by_rank"]["1"]["state"] == "cuda_sync" and st["by_rank"]["1"]["frozen"]


def test_lock_holders_and_workers():
    st = stacks_facts(needs(EV / "lock_self"))["stacks"]
    assert st["by_rank"]["1"]["state"] == "lock_wait"
    assert [(h["rank"], h["thread"], h["state"]) for h in st["lock_holders"]] == [(1, "metrics-pusher", "io")]
    st = stacks_facts(needs(EV / "dataloader_hang"))["stacks"]
    assert st["workers"]["3"]["blocked"] == 2 and st["workers_blocked"] == [3]
    st = stacks_facts(needs(ST / "subprocesses_healthy"))["stacks"]
    assert st["workers_blocked"] == [] and all(w["waiting"] == 2 for w in st["workers"].values())


def test_analysis_is_linear_in_ranks():
    """Replicated real dumps at 4 and 4096 ranks: the same groups, shares and op."""
    base = [p.data for r in range(4) for p in parse(needs(EV / "extra_collective" / f"pyspy-rank{r}.txt"))]

    def replicate(n):
        out = []
        for i in range(n):
            d = base[i % 4]
            out.append(S.ProcDump(pid=i + 100, rank=i, role="rank", fmt=d.fmt, native=d.native,
                                  snapshot=0, main=d.main, others=d.others))
        return out
    small = S.analyze(replicate(4), [], 4, [])
    big = S.analyze(replicate(4096), [], 4096, [])
    assert [g["share"] for g in small["groups"]] == [g["share"] for g in big["groups"]]
    assert big["outliers"] == list(range(1, 4096, 4)) and big["majority_op"] == "all_reduce"


# -----------------------------------------------------------------------------------------------
# live collection


def test_collect_dumps_ranks_in_parallel_and_reports_failures(target, tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    not_python = Proc(["sleep", "60"], wait_ready=False)
    try:
        bundle = Bundle.create(tmp_path / "b")
        procs = [RankProcess(pid=target.pid, rank=0, host="h"), RankProcess(pid=gone.pid, rank=1, host="h"),
                 RankProcess(pid=not_python.pid, rank=2, host="h")]
        ctx = CollectContext(bundle=bundle, host="h", procs=procs, timeout=30, probe_name="stacks",
                             options={"snapshot": 3, "native": True})
        summary = PROBE.collect(ctx)
        bundle.save()
    finally:
        not_python.kill()
    assert summary == {"dumped": 1, "failed": 2, "snapshot": 3, "native": True}
    arts = {a["path"].rsplit("/", 1)[-1]: a for a in bundle.manifest["artifacts"]}
    ok = arts["pyspy-rank0-snap3.json"]
    assert ok["rank"] == 0 and ok["pid"] == target.pid and 0 < ok["meta"]["pause_s"] < 30
    assert "--native" in ok["meta"]["command"]
    kinds = {n: json.loads((tmp_path / "b" / a["path"]).read_text())["mldoctor_stack_error"]["kind"]
             for n, a in arts.items() if n.endswith(".error.json")}
    assert kinds == {"pyspy-rank1-snap3.error.json": "gone", "pyspy-rank2-snap3.error.json": "unsupported"}
    facts, _ = facts_mod.build(facts_mod.items_from_bundle(Bundle.load(tmp_path / "b")), "bundle")
    st = facts["stacks"]
    assert st["by_rank"]["0"]["state"] == "lock_wait" and st["gone_ranks"] == [1]
    assert st["snapshots"] == 1 and st["native"] is True
    assert {e["kind"] for e in st["dump_errors"]} == {"gone", "unsupported"}
    assert os.path.exists(f"/proc/{target.pid}")  # the job was dumped, never signalled


DATALOADER_TARGET = r'''
import threading, torch
from torch.utils.data import DataLoader, Dataset
lock = threading.Lock()
class DS(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        with lock:
            return torch.zeros(2)
held = threading.Event()
def hold():
    with lock:
        held.set()
        threading.Event().wait()
threading.Thread(target=hold, name="cache", daemon=True).start()
held.wait()
it = iter(DataLoader(DS(), num_workers=2))  # forks while "cache" holds the lock
print("ready", flush=True)
next(it)
'''


def _children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(c) for c in (task / "children").read_text().split()]
    return kids


def test_collect_workers_of_a_real_deadlocked_dataloader(tmp_path):
    pytest.importorskip("torch")
    proc = Proc([sys.executable, "-c", DATALOADER_TARGET])
    try:
        deadline = time.monotonic() + 30
        while len(_children(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = _children(proc.pid)
        assert len(workers) >= 2
        bundle = Bundle.create(tmp_path / "b")
        procs = [RankProcess(pid=proc.pid, rank=0, host="h")] + [
            RankProcess(pid=w, rank=None, host="h", role="worker", parent=proc.pid) for w in workers]
        # the workers block at once; poll until their stacks show it (a deadline, not a sleep)
        while time.monotonic() < deadline:
            PROBE.collect(CollectContext(bundle=bundle, host="h", procs=procs, probe_name="stacks",
                                         options={"workers": True}, timeout=30))
            bundle.save()
            facts, _ = facts_mod.build(facts_mod.items_from_bundle(Bundle.load(tmp_path / "b")), "bundle")
            st = facts["stacks"]
            if st["workers"].get("0", {}).get("blocked") == len(workers):
                break
            time.sleep(0.2)
    finally:
        proc.kill()
    assert st["by_rank"]["0"]["state"] == "dataloader_wait" and st["workers_blocked"] == [0]
    names = sorted(a["path"].rsplit("/", 1)[-1] for a in bundle.manifest["artifacts"])
    assert names == sorted([f"pyspy-worker{w}-of-rank0-snap0.json" for w in workers] + ["pyspy-rank0-snap0.json"])


def test_collect_skips_and_fails_with_reasons(tmp_path):
    bundle = Bundle.create(tmp_path / "b")
    with pytest.raises(ProbeSkipped):
        PROBE.collect(CollectContext(bundle=bundle, host="h", procs=[], probe_name="stacks"))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with pytest.raises(ProbeFailed) as exc:
        PROBE.collect(CollectContext(bundle=bundle, host="h", probe_name="stacks",
                                     procs=[RankProcess(pid=gone.pid, rank=0)]))
    assert "no longer exists" in str(exc.value)


def test_failure_messages_become_advice():
    msg = "Permission Denied: Try running again with elevated permissions by going 'sudo env \"PATH=$PATH\" !!'"
    assert S.classify_failure(1, msg, os.getpid())[0] == "permission"
    assert "CAP_SYS_PTRACE" in live._ADVICE["permission"] and "ptrace_scope" in live._ADVICE["permission"]
    assert S.classify_failure(1, "Error: Failed to find python version from target process",
                              os.getpid())[0] == "unsupported"


# -----------------------------------------------------------------------------------------------
# the diagnosis


CASES = {  # scenario -> (cause, ranks) that stacks alone must lead to
    "extra_collective": ("collective_mismatch", [1]),
    "checkpoint_io": ("rank_stuck_in_io", [2]),
    "dataloader_hang": ("dataloader_worker_deadlock", [3]),
    "lock_self": ("rank_stuck_in_lock", [1]),
    "init_hang": ("init_hang", [3]),
    "rank0_exclusive": ("rank_outside_collective", [0]),
}


@pytest.mark.parametrize("scenario", sorted(CASES))
def test_diagnose_from_stacks_names_cause_and_ranks(scenario, tmp_path):
    src = needs(EV / scenario)
    dumps = sorted(src.glob("pyspy-*"))
    if not dumps:
        pytest.skip(f"{scenario}: no stack dumps captured yet")
    for f in dumps:
        shutil.copy(f, tmp_path / f.name)
    report = diagnose_json(tmp_path)
    cause, ranks = CASES[scenario]
    top = report["findings"][0]
    assert (top["cause"], top["ranks"]) == (cause, ranks), [(f["cause"], f["ranks"]) for f in report["findings"]]
    # with every other kind of evidence of the capture too (in-process: same code as the CLI),
    # the stacks finding is still there
    from doctor.engine.diagnose import diagnose_path

    full = diagnose_path(src)
    assert any(f.cause == cause and f.ranks == ranks for f in full.findings), \
        [(f.cause, f.ranks) for f in full.findings]


def test_healthy_job_stacks_raise_no_hang_finding():
    report = diagnose_json(needs(EV / "healthy"))
    assert not [f for f in report["findings"] if f["rule"].startswith("HANG0")]
