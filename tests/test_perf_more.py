"""Performance evidence in pasted tickets (probes/logs/patterns/perf_more.yaml,
probes/symptoms/patterns/perf_prose.yaml) read end to end: NCCL's socket fallback is context,
not an InfiniBand fault, and the PERF024+/SYM131+ rules name the slow cause."""

from __future__ import annotations

from pathlib import Path

from doctor.engine import facts as F

_SOCKET_TICKET = """# Distributed training is slower on 2 machines than on 1

Training on 2 machines is slower than on 1 machine. With NCCL_DEBUG=INFO I get:

```
node1:91:91 [0] misc/ibvwrap.cu:63 NCCL WARN Failed to open libibverbs.so[.1]
node1:91:91 [0] NCCL INFO Using internal Network Socket
node1:91:91 [0] NCCL INFO NET/Socket : 1 interfaces found
NCCL version 2.3.7+cuda9.0
node1:91:91 [0] NCCL INFO rank 0 nranks 4
```
"""

_PROGRESS_TICKET = """# Training very slow on 8 GPUs

```
Epoch: [0][  10/5005]\tTime  2.873 ( 3.120)\tData  2.641 ( 2.880)\tLoss 6.9301e+00 (6.9412e+00)
Epoch: [0][  20/5005]\tTime  2.902 ( 3.010)\tData  2.675 ( 2.790)\tLoss 6.9170e+00 (6.9330e+00)
```
"""


def _facts(tmp_path: Path, text: str) -> dict:
    (tmp_path / "issue.md").write_text(text)
    facts, _ = F.build(F.items_from_folder(tmp_path), "loose")
    return facts


def test_missing_libibverbs_is_no_infiniband_fault(tmp_path: Path) -> None:
    counts = _facts(tmp_path, _SOCKET_TICKET)["logs"]["counts"]
    assert counts.get("nccl_ib_absent") == 1 and counts.get("nccl_net_socket") == 2
    assert "gdr_error" not in counts and "ib_error" not in counts


def test_progress_lines_give_step_and_data_time(tmp_path: Path) -> None:
    events = [e for e in _facts(tmp_path, _PROGRESS_TICKET)["logs"]["events"] if e["kind"] == "step_data_time"]
    assert [(e["fields"]["step_s"], e["fields"]["data_s"]) for e in events] == [("2.873", "2.641"), ("2.902", "2.675")]


def test_prose_comparison_reads_as_slow_and_topics(tmp_path: Path) -> None:
    s = _facts(tmp_path, "# Question\n\nThe training time is very longer than when I use a single node. "
                         "The profiler shows 60% of training time is consumed by DataLoader.\n")["symptoms"]
    assert "slow" in s["states"] and "dataloader_starvation" in s["topics"]
