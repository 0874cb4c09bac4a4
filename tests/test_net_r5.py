"""Round 5 network work: EFA (aws-ofi-nccl) failures, RDMA NIC kernel errors, a crash inside
libnccl, a NCCL failure a version change fixed, and the prose of probes/symptoms/patterns/net_r5.yaml.

Why these tests: each guards one of the confusions the network causes showed on unseen tickets
(an InfiniBand/EFA fault read as an interface problem, a NCCL release bug read as an init or
network problem, multi-node prose read as nothing), end to end through the real readers and
rules. The tickets are written for this test; the log lines follow upstream templates.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import diagnose_json


def _top(tmp_path: Path, name: str, text: str) -> str:
    """The first finding's cause for a ticket or log written to tmp_path ('-' when none)."""
    path = tmp_path / name
    path.write_text(text)
    findings = diagnose_json(path)["findings"]
    return findings[0]["cause"] if findings else "-"


EFA_SETUP = """# two p4d instances hang in nccl-tests

```
ip-10-0-1-5:815:864 [0] NCCL INFO NET/OFI Selected Provider is efa (found 4 nics)
ip-10-0-1-5:815:864 [0] NCCL WARN NET/OFI Couldn't open AV. RC: -22, ERROR: Invalid argument
```
"""

EFA_SECURITY_GROUP = """```
ip-10-0-1-5:2211:2290 [3] NCCL WARN NET/OFI Request 0x7f3a2c001230 (send) completed with error: err: 113, flags: 0, prov_errno: 0, strerror: No route to host, len: 0

**********************************************************************
* This error indicates that the security group on either this instance or the peer instance
* is not setup correctly.
**********************************************************************
```
"""

NCCL_SEGFAULT = """# all_reduce over RoCE crashes

Two nodes, eight GPUs each. The first all_reduce crashes every rank.

```
[worker-0:4682 :0:4682] Caught signal 11 (Segmentation fault: address not mapped to object at address (nil))
==== backtrace (tid:   4682) ====
 0 0x0000000000042520 __sigaction()  ???:0
 1 0x0000000000050dc2 pncclRedOpDestroy()  ???:0
 4 0x000000000004c818 ncclRecv()  ???:0
```
"""

TOPO_FIXED_BY_UPGRADE = """# multi-node fine-tuning fails in the new container

Since the 25.04 container the job fails on two nodes right after start:

```
node1:2211:2290 [0] graph/topo.h:230 NCCL WARN Could not find NET with id 0
```

I tried the upgrading of NCCL to the latest release, and it solved the problem.
"""


@pytest.mark.parametrize(
    ("name", "text", "cause"),
    [
        ("efa_setup.md", EFA_SETUP, "nccl_ib_fault"),
        ("efa_sg.md", EFA_SECURITY_GROUP, "nccl_network_misconfig"),
        ("segv.md", NCCL_SEGFAULT, "nccl_version_issue"),
        ("topo_fixed.md", TOPO_FIXED_BY_UPGRADE, "nccl_version_issue"),
    ],
)
def test_logs_name_the_specific_network_cause(tmp_path: Path, name: str, text: str, cause: str) -> None:
    assert _top(tmp_path, name, text) == cause


def test_the_topology_error_alone_stays_a_setup_problem(tmp_path: Path) -> None:
    # without the reporter's version fix, NET034 must not claim a NCCL release bug
    text = TOPO_FIXED_BY_UPGRADE.split("I tried")[0]
    assert _top(tmp_path, "topo.md", text) != "nccl_version_issue"


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        ("# RoCE job stops\n\nAfter twelve hours the GID index of the NIC changed from 3 to 5 and training "
         "stopped.\n", "nccl_ib_fault"),
        ("# cluster\n\nThe rendezvous hangs: every node's hostname is only resolvable on that node itself.\n",
         "nccl_network_misconfig"),
        ("# two nodes\n\nThe two nodes have different NCCL versions (2.18.1 and 2.19.3) and the job hangs "
         "at init.\n", "nccl_version_issue"),
        ("# second box\n\nIt hangs when I add a second machine; each machine alone trains fine.\n",
         "nccl_network_misconfig"),
        ("# two nodes hang\n\nThe job hangs in init_process_group on two nodes until the timeout; both machines "
         "had --node_rank=0.\n", "init_hang"),
    ],
)
def test_prose_gives_a_lead(tmp_path: Path, text: str, cause: str) -> None:
    assert _top(tmp_path, "ticket.md", text) == cause


def test_healthy_prose_with_a_version_split_gets_no_medium_finding(tmp_path: Path) -> None:
    path = tmp_path / "fine.md"
    path.write_text("# question\n\nOur nodes have different NCCL versions but training runs fine and "
                    "finishes. Is that a problem?\n")
    findings = diagnose_json(path)["findings"]
    assert all(f["severity"] in ("low", "info") for f in findings)
