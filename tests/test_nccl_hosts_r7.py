"""Which host an NCCL_DEBUG line speaks for when a collecting tool put its own tag first.

pdsh and clush prefix every output line with "<host>: ", mpirun --timestamp-output with a date and
"[job,rank]<stdout>:"; NCCL's own "host:pid:tid [dev]" prefix then no longer starts the line. The
host must still land in logs.nccl.hosts (and on the line's event), and a tag alone must never be
taken for a host. Lines are NCCL's format (src/debug.cc ncclDebugLog) with made-up names.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest
from doctor.probes.logs import scan as S

from doctor.engine import facts as facts_mod


def _scan(tmp_path: Path, lines: list[str], reference: bool = False) -> S.Scan:
    p = tmp_path / "nccl.log"
    p.write_text("\n".join(lines) + "\n")
    return S.scan_file(p, p.name, reference=reference)


PDSH = [
    "gpu-a01: gpu-a01:4211:4211 [0] NCCL INFO Bootstrap : Using ib0:10.1.0.11<0>",
    "gpu-a02: gpu-a02:5120:5120 [0] NCCL INFO Bootstrap : Using ib0:10.1.0.12<0>",
    "gpu-a01: gpu-a01:4211:4290 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.1.0.11<0>",
    "gpu-a02: gpu-a02:5120:5199 [0] transport/net_ib.cc:1200 NCCL WARN NET/IB : Got completion "
    "from peer 10.1.0.11<40233> with status=12 opcode=0 len=0 vendor err 129 (Recv)",
]


@pytest.mark.parametrize("reference", [False, True])
def test_pdsh_prefixed_lines_name_their_hosts(tmp_path: Path, reference: bool) -> None:
    sc = _scan(tmp_path, PDSH, reference)
    assert sc.nccl_hosts == {"gpu-a01", "gpu-a02"}


def test_clush_and_mpirun_timestamp_tags(tmp_path: Path) -> None:
    sc = _scan(tmp_path, [
        "node7.cluster: node7.cluster:812:812 [3] NCCL INFO cudaDriverVersion 12040",
        "Fri Aug 11 12:31:45 2023[1,0]<stdout>:tomte4:18503:18813 [0] transport.cc:154 NCCL WARN "
        "Cuda failure 'invalid argument'",
        "[worker-1|0]:hostx:77:77 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
    ])
    assert sc.nccl_hosts == {"node7.cluster", "tomte4", "hostx"}


def test_plain_prefix_still_read_and_tags_are_not_hosts(tmp_path: Path) -> None:
    sc = _scan(tmp_path, [
        "h1:10:10 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>",
        "h2: RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error",
        "Fri Aug 11 12:31:45 2023 NCCL INFO nothing with a host here",
        "h3: NCCL WARN no NCCL prefix on this line",
    ])
    assert sc.nccl_hosts == {"h1"}


def test_hosts_reach_the_facts(tmp_path: Path) -> None:
    d = tmp_path / "ev"
    d.mkdir()
    (d / "pdsh.log").write_text("\n".join(PDSH) + "\n")
    facts, _ = facts_mod.build(facts_mod.items_from_folder(d), "loose")
    assert facts["logs"]["nccl"]["hosts"] == ["gpu-a01", "gpu-a02"]


def test_long_tagged_lines_stay_fast(tmp_path: Path) -> None:
    # a line whose " NCCL " sits far in is not searched for a prefix; one near the start is
    # searched only up to the level word, whatever follows
    long_head = "x:" * 200_000 + " NCCL INFO tail"
    long_tail = "a: a:1:1 [0] NCCL INFO " + "b:" * 200_000
    t0 = time.perf_counter()
    sc = _scan(tmp_path, [long_head, long_tail] * 5)
    assert time.perf_counter() - t0 < 5.0
    assert "a" in sc.nccl_hosts
