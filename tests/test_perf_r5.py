"""Slow-job tickets read end to end (round 5, performance area): probes/logs/patterns/perf_r5.yaml
and probes/symptoms/patterns/perf_r5.yaml feed the PERF030-PERF033 rules.

Why: these are the shapes that were said as the wrong cause or said nothing: NCCL staging GPU
traffic through host memory read as input starvation, a DataLoader that starts more workers than
the CPUs it may use, sync-debug warnings, a reporter who names sockets or P2P in their own words
(in English or Chinese). Each ticket here is written for the test from upstream templates; a
healthy control checks that none of them makes a medium finding out of a job that runs fine.
"""

from __future__ import annotations

from pathlib import Path

from doctor.engine.diagnose import diagnose_path

_P2P_OFF = """# DDP on 4 GPUs is slower than one GPU

Training with DDP on our 4-GPU workstation is slower than on a single GPU. NCCL_DEBUG=INFO prints:

```
ws:4120:4188 [0] NCCL INFO P2P is disabled between connected GPUs 0 and 1. You can repress this message with NCCL_IGNORE_DISABLED_P2P=1.
ws:4121:4189 [1] NCCL INFO P2P is disabled between connected GPUs 1 and 0. You can repress this message with NCCL_IGNORE_DISABLED_P2P=1.
ws:4120:4188 [0] NCCL INFO Channel 00/02 : 0[0] -> 1[1] via SHM/direct/direct
```
"""

_P2P_OLD = """# Multi-GPU training is slow

The training is very slow with 4 GPUs.

```
box:17019:17335 [0] NCCL INFO Could not enable P2P between dev 0(=1b0) and dev 3(=1e0)
box:17102:17338 [1] NCCL INFO Could not enable P2P between dev 1(=1c0) and dev 0(=1b0)
```
"""

_WORKERS = """# Training got very slow in the container

Each epoch takes three times longer than on my workstation.

```
/usr/lib/python3.10/site-packages/torch/utils/data/dataloader.py:558: UserWarning: This DataLoader will create 16 worker processes in total. Our suggested max number of worker in current system is 4, which is smaller than what this DataLoader is going to create. Please be aware that excessive worker creation might get DataLoader running slow or even freeze, lower the worker number to avoid potential slowness/freeze if necessary.
```
"""

_SYNCS = """# Training loop is slow

The loop runs much slower than expected. With torch.cuda.set_sync_debug_mode("warn") I see:

```
train.py:88: UserWarning: called a synchronizing CUDA operation (Triggered internally at ../c10/cuda/CUDAFunctions.cpp:148.)
train.py:91: UserWarning: called a synchronizing CUDA operation (Triggered internally at ../c10/cuda/CUDAFunctions.cpp:148.)
train.py:88: UserWarning: called a synchronizing CUDA operation (Triggered internally at ../c10/cuda/CUDAFunctions.cpp:148.)
train.py:91: UserWarning: called a synchronizing CUDA operation (Triggered internally at ../c10/cuda/CUDAFunctions.cpp:148.)
```
"""

_ZH_SOCKET = """# 多机训练比单机慢很多

两个节点训练比单机训练还慢。NCCL 走的是 socket，机器之间没有 IB 网卡，只有万兆以太网。
"""

_P2P_PROSE = """# Communication overhead on an 8-GPU PCIe server

We train on one server with 8 GPUs over PCIe and see a significant communication overhead.
P2P is not supported between the GPUs on this board.
"""

_HEALTHY = """# Question about an NCCL message

Everything runs fine and the throughput is as expected, I only wonder about this line:

```
ws:4120:4188 [0] NCCL INFO P2P is disabled between connected GPUs 0 and 1. You can repress this message with NCCL_IGNORE_DISABLED_P2P=1.
```
"""


def _top(tmp_path: Path, text: str) -> tuple[str | None, str | None]:
    """The first finding's cause and rule for a ticket written to issue.md."""
    (tmp_path / "issue.md").write_text(text)
    findings = diagnose_path(tmp_path / "issue.md").findings
    return (findings[0].cause, findings[0].rule) if findings else (None, None)


def test_nccl_p2p_disabled_line_in_a_slow_job(tmp_path: Path) -> None:
    assert _top(tmp_path, _P2P_OFF)[0] == "nccl_slow_transport"


def test_older_nccl_p2p_line_in_a_slow_job(tmp_path: Path) -> None:
    assert _top(tmp_path, _P2P_OLD) == ("nccl_slow_transport", "PERF031")


def test_loader_worker_warning_in_a_slow_job(tmp_path: Path) -> None:
    assert _top(tmp_path, _WORKERS) == ("cpu_oversubscription", "PERF032")


def test_sync_debug_warnings_in_a_slow_job(tmp_path: Path) -> None:
    assert _top(tmp_path, _SYNCS) == ("host_sync_in_loop", "PERF033")


def test_chinese_prose_socket_between_nodes(tmp_path: Path) -> None:
    assert _top(tmp_path, _ZH_SOCKET)[0] == "nccl_slow_transport"


def test_p2p_unavailable_with_communication_cost_is_a_slow_transport(tmp_path: Path) -> None:
    assert _top(tmp_path, _P2P_PROSE) == ("nccl_slow_transport", "PERF030")


def test_healthy_job_with_the_p2p_line_gets_no_medium_finding(tmp_path: Path) -> None:
    (tmp_path / "issue.md").write_text(_HEALTHY)
    report = diagnose_path(tmp_path / "issue.md")
    assert not [f for f in report.findings if f.severity in ("medium", "high", "critical")]
