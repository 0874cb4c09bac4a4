"""Where an NCCL_DEBUG=INFO log stops (probes/logs/nccl_progress.py) and the rules that read it
(NET014-NET021, HANG030). Fixtures: tests/fixtures/nccl_progress, assembled from NCCL's message
templates (make_logs.py cites each), and the real CPU/gloo and NCCL logs of tests/fixtures/logs
for the negative side."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from doctor.probes.logs.nccl_progress import STAGES, TAIL_SLACK, never_started, progress_facts

from doctor.engine.facts import build, items_from_folder
from doctor.engine.ruleset import evaluate_all, load_ruleset

FIX = Path(__file__).parent / "fixtures"
OURS = {"NET014", "NET015", "NET016", "NET017", "NET018", "NET019", "NET020", "NET021", "HANG030"}
HANG = {"symptoms": {"sources": ["issue.md prose"], "states": ["hang"], "firm_states": ["hang"], "state": "hang",
                     "healthy": False, "when": [], "where": [], "changed": [], "fixes": [], "tried": [], "topics": [],
                     "context": [], "after_steps": None, "phrases": []}}


def _facts(path: Path, hang: bool = False) -> dict[str, Any]:
    facts = build(items_from_folder(path), str(path))[0]
    if hang:
        facts["symptoms"] = dict(HANG["symptoms"])
    return facts


def _fired(facts: dict[str, Any]) -> set[str]:
    results, _ = evaluate_all(load_ruleset(), facts)
    return {r.rule.id for r in results if r.status == "fired"}


def _ev(line: int, kind: str, host: str = "h", pid: int = 1, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "line": line, "host": host, "pid": pid, "rank": None, "file": "a.log",
            "text": f"{kind} line", "fields": fields}


def _scan(events: list[dict[str, Any]], lines: int, transports: tuple[str, ...] = (), **kw: Any) -> dict[str, Any]:
    return {"path": "a.log", "lines": lines, "events": events, "transports": list(transports),
            "nccl_hosts": kw.get("hosts", ["h"]), "nets": kw.get("nets", []), "comm_inits": kw.get("comm_inits", {})}


# -- the stage and the tail ---------------------------------------------------------------------

@pytest.mark.parametrize(("kinds", "stage"), [
    (["nccl_bootstrap"], "bootstrap"),
    (["nccl_bootstrap", "nccl_init_start"], "init_start"),
    (["nccl_init_start", "nccl_transport"], "channels"),
    (["nccl_transport", "nccl_connected"], "connected"),
    (["nccl_connected", "nccl_init_complete", "nccl_init_timings"], "complete"),
    (["nccl_init_complete", "nccl_comm_end"], "teardown"),
])
def test_stage_is_the_furthest_line_of_the_process(kinds: list[str], stage: str) -> None:
    evs = [_ev(i + 1, k) for i, k in enumerate(kinds)]
    f = progress_facts([_scan(evs, len(kinds))])
    assert f["stage"] == stage == f["top_stage"]
    assert f["stopped"] is (stage != "teardown")


def test_stage_is_the_least_advanced_process_and_top_the_most() -> None:
    evs = [_ev(1, "nccl_init_start", pid=1), _ev(2, "nccl_init_complete", pid=1, comm_rank=0),
           _ev(3, "nccl_init_start", pid=2, comm_rank=1)]
    f = progress_facts([_scan(evs, 3)])
    assert (f["stage"], f["top_stage"]) == ("init_start", "complete")
    assert f["ranks_by_stage"] == {"complete": [0], "init_start": [1]}


@pytest.mark.parametrize("after", [0, TAIL_SLACK, TAIL_SLACK + 1, 40])
def test_lines_after_the_last_nccl_line_mean_the_job_went_on(after: int) -> None:
    evs = [_ev(1, "nccl_init_start"), _ev(2, "nccl_transport"), _ev(3, "nccl_init_complete")]
    f = progress_facts([_scan(evs, 3 + after)])
    assert f["tail_lines"] == after
    assert f["stopped"] is (after <= TAIL_SLACK)


def test_a_file_that_goes_on_keeps_the_whole_log_from_stopping() -> None:
    a = _scan([_ev(1, "nccl_init_complete")], 1)
    b = _scan([_ev(1, "nccl_init_complete", host="g")], 50)
    assert progress_facts([a])["stopped"] and not progress_facts([a, b])["stopped"]


def test_training_steps_in_another_file_mean_the_job_went_on() -> None:
    a = _scan([_ev(1, "nccl_init_complete")], 1)
    b = {**_scan([_ev(4, "train_progress")], 4), "path": "stderr.log"}
    c = {**_scan([_ev(4, "watchdog_timeout")], 4), "path": "launcher.log"}
    assert not progress_facts([a, b])["stopped"] and progress_facts([a, b])["progress_lines"] == 1
    assert progress_facts([a, c])["stopped"]


def test_no_nccl_lines_say_nothing() -> None:
    f = progress_facts([_scan([_ev(1, "watchdog_timeout")], 10)])
    assert f["procs"] == 0 and not f["stopped"] and f["stage"] == STAGES[0]


@pytest.mark.parametrize(("transports", "hosts", "nodes"), [
    (("P2P/IPC",), ["h"], 1), (("SHM/direct",), ["h"], 1), (("P2P/IPC", "NET/IB"), ["h"], 2),
    (("P2P/IPC",), ["h", "g"], 2), ((), ["h"], 0),
])
def test_nodes_from_transports_and_hosts_when_no_topology_line(transports: tuple[str, ...], hosts: list[str],
                                                                nodes: int) -> None:
    f = progress_facts([_scan([_ev(1, "nccl_init_complete")], 1, transports, hosts=hosts)])
    assert f["nodes"] == nodes and f["single_node"] is (nodes == 1)


def test_topology_line_overrides_the_guess_and_drivers_compare_per_host() -> None:
    evs = [_ev(1, "nccl_topology", nnodes="3"), _ev(2, "nccl_driver", host="h", driver="12040"),
           _ev(3, "nccl_driver", host="g", pid=2, driver="12020")]
    f = progress_facts([_scan(evs, 3, ("P2P/IPC",))])
    assert f["nodes"] == 3 and f["driver_differ"] and f["driver_versions"] == [12020, 12040]


@pytest.mark.parametrize(("seen", "n", "missing"), [
    ({0, 1, 2}, 4, [3]), ({0, 1}, 4, []), (set(range(15)), 16, [15]), (set(range(8)), 16, []), ({0}, 2, [1]),
])
def test_never_started_only_when_few_are_missing(seen: set[int], n: int, missing: list[int]) -> None:
    inits = {f"h:{r}:0x{r}": [r, n, "0xabc", False] for r in seen}
    assert never_started([{"comm_inits": inits}]) == missing


def test_never_started_is_silent_once_the_communicator_completed() -> None:
    inits = {"h:0:0x1": [0, 4, "0xabc", True], "h:1:0x2": [1, 4, "0xabc", False], "h:2:0x3": [2, 4, "0xabc", False]}
    assert never_started([{"comm_inits": inits}]) == []


# -- the rules on the fixtures -----------------------------------------------------------------

@pytest.mark.parametrize(("name", "hang", "rule"), [
    ("p2p_stop", True, "NET014"), ("p2p_cumem_stop", True, "NET014"), ("p2p_stop", False, "NET015"),
    ("bootstrap_stop", True, "NET016"), ("ib_connect_stop", True, "NET017"), ("ib_stop", True, "NET018"),
    ("driver_differ_stop", False, "NET019"), ("shm_stop", True, "NET020"), ("rank_never_started", False, "HANG030"),
    ("socket_ib_disabled", False, "NET021"),
])
def test_each_shape_names_its_lead(name: str, hang: bool, rule: str) -> None:
    fired = _fired(_facts(FIX / "nccl_progress" / name, hang)) & OURS
    assert rule in fired
    # one shape, one lead of this family (NET019's driver mismatch may join another)
    assert len(fired - {"NET019", "NET021"}) <= 1


def test_ticket_prose_supplies_the_hang() -> None:
    assert "NET014" in _fired(_facts(FIX / "nccl_progress" / "tickets" / "p2p_hang.md"))


@pytest.mark.parametrize("name", ["p2p_trains", "ib_trains", "socket_ib_disabled"])
@pytest.mark.parametrize("hang", [False, True])
def test_a_job_that_trains_after_init_fires_no_stop_lead(name: str, hang: bool) -> None:
    # NET021 reads the transport, not where the log stops: it may speak for a job that trains
    assert not _fired(_facts(FIX / "nccl_progress" / name, hang)) & (OURS - {"NET021"})


REAL = sorted(p for p in (FIX / "logs").iterdir() if p.is_dir())


@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_real_logs_fire_none_even_when_said_to_hang(path: Path) -> None:
    assert not _fired(_facts(path, hang=True)) & OURS


# -- IB fault lines the job got past, and advertised addresses (ib_fault_facts, address_facts) --

def test_ib_line_followed_by_init_complete_of_the_same_process_is_passed() -> None:
    events = [_ev(3, "ib_error"), _ev(8, "nccl_init_complete", comm_rank=0)]
    p = progress_facts([_scan(events, 8)])
    assert (p["ib_faults"], p["ib_faults_passed"]) == (0, 1)


def test_ib_line_after_init_or_of_another_process_stays_a_fault() -> None:
    events = [_ev(3, "nccl_init_complete", comm_rank=0), _ev(5, "ib_error"),
              _ev(6, "ib_error", pid=2), _ev(9, "nccl_init_complete", pid=3, comm_rank=1)]
    p = progress_facts([_scan(events, 9)])
    assert (p["ib_faults"], p["ib_faults_passed"]) == (2, 0)


def test_ib_line_the_job_trained_past_is_passed() -> None:
    ev = _ev(5, "ib_error")
    ev["survived"] = True
    p = progress_facts([_scan([_ev(1, "nccl_bootstrap", iface="eth0", addr="10.0.0.1"), ev], 9)])
    assert (p["ib_faults"], p["ib_faults_passed"]) == (0, 1)


def test_same_address_on_two_hosts_and_loopback_on_a_multi_host_job() -> None:
    events = [_ev(1, "nccl_bootstrap", host="a", iface="eth0", addr="172.17.0.2"),
              _ev(2, "nccl_bootstrap", host="b", pid=2, iface="eth0", addr="172.17.0.2"),
              _ev(3, "nccl_net", host="c", pid=3, net="Socket", devices="[0]lo:127.0.0.1<0>")]
    p = progress_facts([_scan(events, 3)])
    assert p["shared_addrs"] == ["172.17.0.2"] and p["shared_addr_hosts"] == ["a", "b"]
    assert p["loopback_hosts"] == ["c"]
    assert "NET024" in _fired({"logs": {"files": 1, "nccl_progress": p}})


def test_own_addresses_per_host_raise_nothing() -> None:
    events = [_ev(1, "nccl_bootstrap", host="a", iface="eth0", addr="10.0.0.1"),
              _ev(2, "nccl_bootstrap", host="b", pid=2, iface="eth0", addr="10.0.0.2"),
              _ev(3, "nccl_bootstrap", host="a", pid=4, iface="lo", addr="127.0.0.1")]
    p = progress_facts([_scan(events, 3)])
    assert p["shared_addrs"] == [] and p["loopback_hosts"] == ["a"]
    single = progress_facts([_scan([_ev(1, "nccl_bootstrap", iface="lo", addr="127.0.0.1")], 1)])
    assert single["loopback_hosts"] == []


def test_host_local_interface_in_the_socket_list_counts_only_when_sockets_carry_data() -> None:
    sock = _ev(1, "nccl_net", host="a", net="Socket", devices="[0]eth0:10.0.0.1<0> [1]docker0:172.17.0.1<0>")
    other = _ev(2, "nccl_bootstrap", host="b", pid=2, iface="eth0", addr="10.0.0.2")
    p = progress_facts([_scan([sock, other, _ev(3, "nccl_network", host="a", net="Socket")], 3)])
    assert p["local_ifaces"] == ["a: docker0"]
    over_ib = progress_facts([_scan([sock, other, _ev(3, "nccl_network", host="a", net="IB")], 3)])
    assert over_ib["local_ifaces"] == []


def test_ib_device_discovery_lines_are_skipped_not_faults() -> None:
    opened = _ev(2, "ib_error", device="mlx5_3")
    opened["sig"] = "nccl_ibv_failed"
    reg = _ev(3, "ib_error", call="reg_mr")
    reg["sig"] = "nccl_ibv_failed"
    p = progress_facts([_scan([opened, reg], 3)])
    assert (p["ib_faults"], p["ib_faults_passed"], p["ib_devices_skipped"]) == (1, 0, 1)
