"""torch's distributed debug server as evidence (issue #19): its periodic dumps and route pages
offline, its frontend live, and the flight-recorder dump discovery it sits beside.

The offline cases read the real captures in tests/fixtures/debug_server (README there); the live
test starts one short 4-rank gloo job with the server and reuses it for every assertion.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from doctor.probes.common.debug_pages import is_page, rank_answers
from doctor.probes.debug_server import live, parse_dump
from doctor.probes.flight_recorder import dump_prefixes
from doctor.probes.stacks.formats import parse_text

from doctor.engine.diagnose import diagnose_path
from doctor.evidence.bundle import Bundle
from doctor.evidence.contract import CollectContext, Sample
from doctor.evidence.plugins import probe

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "debug_server"
MISMATCH_DUMP = FIX / "mismatch" / "dumps" / "stacks_20261203_133032.txt"
GONE_DUMP = FIX / "gone" / "dumps" / "stacks_20261203_133204.txt"


def _diagnose(path: Path) -> tuple[str, list[tuple[str, list[int]]], dict[str, Any]]:
    report = diagnose_path(path)
    return report.verdict["state"], [(f.cause, list(f.ranks)) for f in report.findings], report.facts


# -- offline ---------------------------------------------------------------------------------------

def test_periodic_dump_sections_name_the_ranks() -> None:
    d = parse_dump(MISMATCH_DUMP.read_text(), MISMATCH_DUMP.name)
    assert (d.route, d.form, d.stamp, d.answered, d.failures) == ("stacks", "dump", "2026-12-03 13:30:32", [0, 1, 2, 3], [])
    procs, notes = parse_text(MISMATCH_DUMP.read_text())
    assert sorted(p.rank for p in procs) == [0, 1, 2, 3]
    assert not notes  # no final newline is how the server writes, not a cut file


def test_a_rank_that_did_not_answer_is_a_failure_not_a_stack() -> None:
    d = parse_dump(GONE_DUMP.read_text(), GONE_DUMP.name)
    assert d.answered == [0, 1, 2] and d.world_size == 4
    [f] = d.failures
    assert (f.rank, f.status, f.kind) == (3, 503, "refused") and "Cannot connect" in f.reason
    assert sorted(p.rank for p in parse_text(GONE_DUMP.read_text())[0]) == [0, 1, 2]


@pytest.mark.parametrize("page", ["stacks", "pyspy_dump", "wait_counters", "fr_trace_json"])
def test_route_pages_read_like_the_dumps(page: str) -> None:
    d = parse_dump((FIX / "gone" / "routes" / f"{page}.html").read_text(), f"{page}.html")
    assert (d.route, d.form, d.answered, [f.rank for f in d.failures]) == (page, "html", [0, 1, 2], [3])


def test_fr_tables_dump_is_owned_and_its_partial_line_read() -> None:
    """The periodic fr_trace dump (torch's tabulated summary) could not be captured on gloo (torch's
    build_db fails there, see the fixture README); this is its head as _debug_handlers.py writes it."""
    text = ("PARTIAL DATA: 1/2 workers responded\n  Rank 1: TimeoutError: \n\n=== FR Trace ===\n"
            "--- Groups ---\nid    desc    size\n")
    assert probe("debug_server").sniff(Sample(Path("fr_trace_20261203_000000.txt"), "fr_trace_20261203_000000.txt", text.encode(), len(text)))
    d = parse_dump(text, "fr_trace_20261203_000000.txt")
    assert (d.route, d.world_size, d.answered) == ("fr_trace", 2, [0])
    assert [(f.rank, f.kind) for f in d.failures] == [(1, "timeout")]


def test_store_lists_the_workers() -> None:
    d = parse_dump((FIX / "mismatch" / "routes" / "tcpstore.html").read_text(), "tcpstore.html")
    assert d.route == "tcpstore" and sorted(d.urls) == [0, 1, 2, 3] and d.urls[0].startswith("http://")


def test_the_debug_server_kind_claims_its_files_ahead_of_stacks() -> None:
    from doctor.engine.facts import dispatch
    from doctor.evidence import plugins

    owner, extra = dispatch(Sample.read(MISMATCH_DUMP), plugins.probes())
    assert owner is probe("debug_server") and probe("stacks") in extra
    owner, extra = dispatch(Sample.read(FIX / "mismatch" / "routes" / "fr_trace_json.html"), plugins.probes())
    assert owner is probe("debug_server") and probe("flight_recorder") in extra
    owner, extra = dispatch(Sample.read(FIX / "mismatch" / "dumps" / "wait_counters_20261203_133032.txt"), plugins.probes())
    assert owner is probe("debug_server") and probe("stacks") not in extra


@pytest.mark.parametrize(("evidence", "state", "finding"), [
    (MISMATCH_DUMP, "hung", ("collective_mismatch", [2])),
    (FIX / "mismatch" / "routes", "hung", ("collective_mismatch", [2])),
    (GONE_DUMP, "hung", ("rank_process_dead", [3])),
    (FIX / "healthy" / "dumps", "healthy", None),
])
def test_verdicts_from_the_captures(evidence: Path, state: str, finding: tuple[str, list[int]] | None) -> None:
    got_state, findings, facts = _diagnose(evidence)
    assert got_state == state
    assert (findings[0] if findings else None) == finding
    assert facts["job"]["world_size"] == 4


def test_flight_recorder_reads_the_pages_dumps() -> None:
    _, _, facts = _diagnose(FIX / "mismatch" / "routes" / "fr_trace_json.html")
    fr = facts["flight_recorder"]
    assert fr["ranks"] == [0, 1, 2, 3] and fr["backends"] == ["gloo"]
    assert any(2 in m["culprits"] for m in fr["mismatches"])


def test_page_split_keeps_failed_ranks_apart() -> None:
    text = (FIX / "gone" / "routes" / "fr_trace_json.html").read_text()
    assert is_page(text, "fr_trace_json") and not is_page(text, "dump_traceback")
    answers = rank_answers(text)
    assert [(a.rank, a.status) for a in answers] == [(0, 200), (1, 200), (2, 200), (3, 503)]
    assert answers[0].text.startswith("{") and "Cannot connect" in answers[3].text


def test_blank_indented_line_in_a_pyspy_dump() -> None:
    procs, _ = parse_text('Thread 7 (idle): "MainThread"\n    f (a.py:1)\n    \n    g (b.py:2)\n')
    assert [fr[0] for fr in procs[0].threads[0].frames] == ["f", "g"]


# -- flight-recorder dump discovery (item 3) ------------------------------------------------------

def test_fr_dump_prefixes() -> None:
    assert dump_prefixes({"TORCH_FR_DUMP_TEMP_FILE": "/x/fr_"}, "/home/u") == ["/x/fr_"]
    assert dump_prefixes({"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/y/t_"}, "/home/u") == ["/y/t_"]
    got = dump_prefixes({}, "/home/u")
    assert got[0] == "/home/u/.cache/torch/comm_lib_trace_rank_" and "/tmp/nccl_trace_rank_" in got
    assert dump_prefixes({}, None)[0] == "/tmp/.cache/torch/comm_lib_trace_rank_"


def test_fr_collect_finds_the_newer_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank with no TORCH_FR_DUMP_TEMP_FILE: its dump under $HOME/.cache/torch is found."""
    from doctor.probes import flight_recorder as fr_mod

    from doctor.evidence.contract import RankProcess

    cache = tmp_path / ".cache" / "torch"
    cache.mkdir(parents=True)
    src = next((ROOT / "tests" / "fixtures" / "fr" / "gloo").glob("*/fr_trace_rank0.json"))
    (cache / "comm_lib_trace_rank_0").write_bytes(src.read_bytes())
    monkeypatch.setattr(fr_mod, "_job_home", lambda pid: str(tmp_path))
    bundle = Bundle.create(tmp_path / "bundle", {"type": "test"})
    ctx = CollectContext(bundle, "h", [RankProcess(pid=os.getpid(), rank=0)], probe_name="flight_recorder")
    assert fr_mod.PROBE.collect(ctx)["dumps"] == 1


# -- live ------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server_job(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201 - a generator fixture
    """One 4-rank gloo job with the debug server, rank 2 in an extra barrier; ended by us."""
    pytest.importorskip("aiohttp")
    pytest.importorskip("jinja2")
    pytest.importorskip("tabulate")
    out = tmp_path_factory.mktemp("dbgjob")
    port = _free_port()
    env = dict(os.environ, CAP_MODE="mismatch", CAP_DUMPS=str(out / "dumps"), CAP_PORT=str(port),
               TORCH_FR_BUFFER_SIZE="2000", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-port",
           str(_free_port()), str(FIX / "capture.py"), "--rank-main"]
    log = open(out / "torchrun.log", "wb")  # noqa: SIM115 - closed in the teardown
    job = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://localhost:{port}"
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/tcpstore", timeout=5) as r:
                    if r.read().count(b"debug_server/rank") >= 4:
                        break
            except OSError:
                pass
            time.sleep(1)
        else:
            pytest.fail("the debug server did not come up: " + (out / "torchrun.log").read_text()[-2000:])
        time.sleep(4)  # rank 2 reaches its extra barrier at step 3
        yield url, out
    finally:
        os.killpg(job.pid, signal.SIGTERM)
        try:
            job.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        log.close()


@pytest.mark.live
def test_live_collect_without_ptrace(server_job: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = server_job
    bundle = Bundle.create(tmp_path / "bundle", {"type": "test"})
    ctx = CollectContext(bundle, "h", [], options={"debug_server": url}, timeout=5.0, probe_name="debug_server")
    t0 = time.perf_counter()
    info = probe("debug_server").collect(ctx)
    assert time.perf_counter() - t0 < 15
    assert info["ranks"] == 4 and info["answered"] == 4 and info["not_answering"] == []
    assert info["fr_dumps"] == 4  # each rank's recorder answer, stored for the flight-recorder kind
    bundle.save()
    state, findings, facts = _diagnose(tmp_path / "bundle")
    assert state == "hung" and findings[0] == ("collective_mismatch", [2])
    assert facts["debug_server"]["answered"] == [0, 1, 2, 3]
    assert facts["flight_recorder"]["ranks"] == [0, 1, 2, 3]


@pytest.mark.live
def test_live_rank_that_does_not_answer(server_job: tuple[str, Path]) -> None:
    """A refused worker and a silent one (accepts, never answers) are failures, within the timeout."""
    url, _ = server_job
    with urllib.request.urlopen(f"{url}/tcpstore", timeout=5) as r:
        workers = dict(parse_dump(r.read().decode(), "tcpstore.html").urls)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    workers[4] = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    workers[5] = f"http://127.0.0.1:{silent.getsockname()[1]}"
    try:
        t0 = time.perf_counter()
        answers = live.fan_out(workers, "dump_traceback", timeout=1.5)
        assert time.perf_counter() - t0 < 5
    finally:
        silent.close()
    assert [answers[r][0] for r in range(4)] == [200] * 4
    assert (answers[4][0], answers[5][0]) == (503, 408)
    d = parse_dump(live.as_dump(workers, "dump_traceback", answers), "stacks_20261203_000000.txt")
    assert d.answered == [0, 1, 2, 3]
    assert {(f.rank, f.kind) for f in d.failures} == {(4, "refused"), (5, "timeout")}


@pytest.mark.live
def test_live_no_server_is_a_skip(tmp_path: Path) -> None:
    from doctor.evidence.contract import ProbeSkipped

    bundle = Bundle.create(tmp_path / "bundle", {"type": "test"})
    ctx = CollectContext(bundle, "h", [], options={"debug_server": f"http://127.0.0.1:{_free_port()}"},
                         timeout=2.0, probe_name="debug_server")
    with pytest.raises(ProbeSkipped):
        probe("debug_server").collect(ctx)
