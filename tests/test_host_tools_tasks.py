"""top/htop task counts and process tables (probes/host_tools.py ``_tasks``): how many tasks
run now and how many CPUs each listed process keeps busy, the evidence PERF026 reads."""

from __future__ import annotations

from pathlib import Path

from doctor.engine import facts as F

H200 = Path(__file__).resolve().parent / "fixtures" / "host_tools" / "h200"

_TOP = """top - 14:02:11 up 12 days,  3:10,  2 users,  load average: 61.02, 58.33, 40.12
Tasks: 512 total,  71 running, 441 sleeping,   0 stopped,   0 zombie
%Cpu(s): 97.1 us,  2.6 sy,  0.0 ni,  0.2 id,  0.0 wa,  0.0 hi,  0.1 si,  0.0 st
MiB Mem : 515896.2 total, 300112.4 free, 100231.0 used, 115552.8 buff/cache
MiB Swap:      0.0 total,      0.0 free,      0.0 used. 410022.1 avail Mem

    PID USER      PR  NI    VIRT    RES    SHR S  %CPU  %MEM     TIME+ COMMAND
 101233 alice     20   0   42.1g   9.8g   1.2g R  1590   1.9 120:11.02 python
 101234 alice     20   0   42.1g   9.7g   1.2g R  1570   1.9 119:40.55 python
 101235 alice     20   0   42.0g   9.7g   1.2g R  1560   1.9 119:02.10 python
   1502 root      20   0       0      0      0 S   0.3   0.0   0:01.20 kworker/3:1
"""

_HTOP = """    Load average: 70.11 66.02 51.90
  Tasks: 96, 3100 thr; 190 running
  Uptime: 5 days, 01:02:03

    PID USER      PRI  NI  VIRT   RES   SHR S CPU% MEM%   TIME+  Command
  2211 bob        20   0 40.1G 8112M 1022M R 3190.  1.6  9h01:11 python train.py
  2212 bob        20   0 40.1G 8100M 1020M R 3150.  1.6  9h00:52 python train.py
"""


def _facts(tmp_path: Path, name: str, text: str) -> dict:
    (tmp_path / name).write_text(text)
    facts, _ = F.build(F.items_from_folder(tmp_path), "loose")
    return facts


def test_top_process_table_counts_busy_pools(tmp_path: Path) -> None:
    h = _facts(tmp_path, "top.txt", _TOP)["host_tools"]
    assert h["running"] == 71.0 and h["procs_listed"] == 4 and h["procs_busy"] == 3
    assert h["proc_cpu_max"] == 1590.0 and h["proc_cpu_sum"] == 4720.3


def test_htop_header_gives_threads_and_running(tmp_path: Path) -> None:
    h = _facts(tmp_path, "htop.txt", _HTOP)["host_tools"]
    assert h["running"] == 190.0 and h["threads_total"] == 3100
    assert h["procs_busy"] == 2 and h["proc_cpu_max"] == 3190.0


def test_captured_top_still_reads_its_summary() -> None:
    # the real capture of an oversubscribed 16-core host: the new readings add to the old ones
    facts, _ = F.build(F.items_from_folder(H200 / "oversubscribed"), "loose")
    h = facts["host_tools"]
    assert h["cores"] == 16 and h["running"] >= 1.0
