"""Host checks: /dev/shm, per-process limits, CPU frequency governor, free memory, a folder's
read/write throughput, and whether each GPU's NUMA-local CPUs are usable by this process.

Each reads what the kernel says now (statvfs, getrlimit, sysfs, /proc/meminfo) and compares it
with a floor taken from practice (NCCL's and the ml-engineering book's advice, quoted in the
playbooks). The floors are module constants so a site can reason about them in one place.
"""

from __future__ import annotations

import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from doctor.probes.check.result import FAILED, PASSED, GiB, MiB, result, skipped

from doctor.evidence import procfs

#: NCCL's shared-memory transport and DataLoader workers; the book asks for at least 1 GiB.
SHM_MIN = 1 * GiB
#: Soft limits below these break multi-worker data loading (open files), NCCL/IB memory
#: registration (locked memory) and thread- or process-heavy jobs (processes).
NOFILE_MIN = 32768
MEMLOCK_MIN = 1 * GiB
NPROC_MIN = 4096
#: Less than this share of RAM (or this many bytes) available leaves no room for a job's workers.
MEM_AVAILABLE_SHARE = 0.10
MEM_AVAILABLE_MIN = 4 * GiB
#: Checkpoint or data folders slower than this (either direction) stall steps noticeably.
IO_MIN_BPS = 200 * 1000 ** 2

SYS_CPU = Path("/sys/devices/system/cpu")
SYS_PCI = Path("/sys/bus/pci/devices")


def shm(path: str = "/dev/shm") -> list[dict[str, Any]]:
    title = "/dev/shm size"
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return [skipped("host.shm", "host", title, f"statvfs {path}: {exc.strerror or exc}")]
    size = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    value = {"bytes": size, "free_bytes": free, "min_bytes": SHM_MIN}
    if size < SHM_MIN:
        return [result("host.shm", "host", title, FAILED,
                       f"{path} is {size / MiB:.0f} MiB, below the {SHM_MIN / GiB:.0f} GiB NCCL and DataLoader workers need",
                       cause="shm_too_small", value=value)]
    return [result("host.shm", "host", title, PASSED, f"{path} is {size / GiB:.1f} GiB ({free / GiB:.1f} GiB free)",
                   value=value)]


def _limits() -> dict[str, int]:
    """Soft limits of this process (-1: unlimited); a job started from the same shell inherits them."""
    out = {}
    for key, which in (("nofile", resource.RLIMIT_NOFILE), ("memlock", resource.RLIMIT_MEMLOCK),
                       ("nproc", resource.RLIMIT_NPROC)):
        soft, _hard = resource.getrlimit(which)
        out[key] = -1 if soft == resource.RLIM_INFINITY else int(soft)
    return out


def ulimits() -> list[dict[str, Any]]:
    floors = {"nofile": NOFILE_MIN, "memlock": MEMLOCK_MIN, "nproc": NPROC_MIN}
    lim = _limits()
    out = []
    for key, floor in floors.items():
        have = lim.get(key)
        title = f"ulimit {key}"
        if have is None:
            out.append(skipped(f"host.ulimit.{key}", "host", title, "limit not readable"))
            continue
        shown = "unlimited" if have < 0 else (f"{have / MiB:.0f} MiB" if key == "memlock" else str(have))
        want = f"{floor / GiB:.0f} GiB" if key == "memlock" else str(floor)
        value = {"soft": have, "min": floor}
        if 0 <= have < floor:
            out.append(result(f"host.ulimit.{key}", "host", title, FAILED,
                              f"soft {key} limit is {shown}, below {want}", cause="resource_limit", value=value))
        else:
            out.append(result(f"host.ulimit.{key}", "host", title, PASSED, f"soft {key} limit is {shown}", value=value))
    return out


def governor(root: Path = SYS_CPU) -> list[dict[str, Any]]:
    title = "CPU frequency governor"
    found: dict[str, int] = {}
    for f in sorted(root.glob("cpu[0-9]*/cpufreq/scaling_governor")):
        try:
            g = f.read_text().strip()
        except OSError:
            continue
        found[g] = found.get(g, 0) + 1
    if not found:
        return [skipped("host.governor", "host", title,
                        "no cpufreq interface in /sys (a VM or container that hides CPU frequency control)")]
    value = {"governors": found}
    slow = {g: n for g, n in found.items() if g != "performance"}
    if slow:
        what = ", ".join(f"{n} CPU(s) on {g}" for g, n in sorted(slow.items()))
        return [result("host.governor", "host", title, FAILED, f"{what}, not 'performance'",
                       cause="cpu_frequency_scaling", value=value)]
    return [result("host.governor", "host", title, PASSED, f"all {sum(found.values())} CPUs on 'performance'",
                   value=value)]


def memory() -> list[dict[str, Any]]:
    title = "free memory"
    info = procfs.meminfo()
    total, avail = info.get("MemTotal"), info.get("MemAvailable")
    if not total or avail is None:
        return [skipped("host.memory", "host", title, "/proc/meminfo has no MemTotal/MemAvailable")]
    # 10 % of RAM, and at least 4 GiB where RAM is large enough for that to mean something.
    floor = max(int(total * MEM_AVAILABLE_SHARE), min(MEM_AVAILABLE_MIN, total // 4))
    value = {"total_bytes": total, "available_bytes": avail, "min_bytes": floor}
    text = f"{avail / GiB:.1f} of {total / GiB:.1f} GiB available"
    if avail < floor:
        return [result("host.memory", "host", title, FAILED, f"only {text}: a job started here risks the OOM killer",
                       cause="host_oom", value=value)]
    return [result("host.memory", "host", title, PASSED, text, value=value)]


def folder_io(path: Path, size: int) -> list[dict[str, Any]]:
    """Write ``size`` bytes with fsync, drop them from the page cache, read them back: the
    sequential throughput a checkpoint save or a data read sees. The file is ours, under a
    fresh name, and removed afterwards; nothing else in the folder is touched."""
    title = f"read/write throughput of {path}"
    if not path.is_dir():
        return [skipped("host.io", "host", title, f"{path} is not a folder")]
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return [skipped("host.io", "host", title, f"statvfs: {exc.strerror or exc}")]
    free = st.f_bavail * st.f_frsize
    value: dict[str, Any] = {"path": str(path), "free_bytes": free, "test_bytes": size, "min_bps": IO_MIN_BPS}
    if free < 2 * size:
        return [result("host.io", "host", title, FAILED,
                       f"only {free / MiB:.0f} MiB free in {path}: no room for a {size / MiB:.0f} MiB test file, "
                       "let alone a checkpoint", cause="slow_storage", value=value)]
    block = os.urandom(4 * MiB)
    fd, name = tempfile.mkstemp(prefix=".mldoctor-check-", dir=path)
    try:
        t0 = time.perf_counter()
        written = 0
        while written < size:
            written += os.write(fd, block[: min(len(block), size - written)])
        os.fsync(fd)
        t_write = time.perf_counter() - t0
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.lseek(fd, 0, os.SEEK_SET)
        t0 = time.perf_counter()
        while os.read(fd, 4 * MiB):
            pass
        t_read = time.perf_counter() - t0
    except OSError as exc:
        return [result("host.io", "host", title, FAILED, f"writing a test file failed: {exc.strerror or exc}",
                       cause="slow_storage", value=value)]
    finally:
        os.close(fd)
        Path(name).unlink(missing_ok=True)
    w_bps, r_bps = size / max(t_write, 1e-9), size / max(t_read, 1e-9)
    value.update({"write_bps": round(w_bps), "read_bps": round(r_bps)})
    text = f"write {w_bps / 1e6:.0f} MB/s, read {r_bps / 1e6:.0f} MB/s ({size / MiB:.0f} MiB, fsync'd)"
    if min(w_bps, r_bps) < IO_MIN_BPS:
        return [result("host.io", "host", title, FAILED, f"{text}: below {IO_MIN_BPS / 1e6:.0f} MB/s",
                       cause="slow_storage", value=value)]
    return [result("host.io", "host", title, PASSED, text, value=value)]


def _cpulist(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def numa_affinity(pci_buses: list[tuple[str, str]], pci_root: Path = SYS_PCI) -> list[dict[str, Any]]:
    """For each GPU (index, PCI bus id), its NUMA node and whether this process may run on that
    node's CPUs: a rank pinned (by a cpuset, taskset or numactl) away from its GPU's node pays
    the cross-socket hop on every host-device copy."""
    title = "GPU-NUMA affinity"
    if not pci_buses:
        return [skipped("host.numa", "host", title, "no GPU found")]
    allowed = os.sched_getaffinity(0)
    rows, bad = [], []
    for index, bus in pci_buses:
        dev = pci_root / bus.lower().replace("00000000:", "0000:")
        try:
            node = int((dev / "numa_node").read_text().strip())
        except (OSError, ValueError):
            rows.append({"gpu": index, "node": None})
            continue
        local: set[int] = set()
        try:
            local = _cpulist((dev / "local_cpulist").read_text())
        except OSError:
            pass
        usable = len(local & allowed) if local else None
        rows.append({"gpu": index, "node": node, "local_cpus": len(local), "usable_local_cpus": usable})
        if local and not (local & allowed):
            bad.append(index)
    value = {"gpus": rows, "allowed_cpus": len(allowed)}
    if all(r["node"] is None or r["node"] < 0 for r in rows):
        return [skipped("host.numa", "host", title,
                        "sysfs gives the GPUs no NUMA node (-1: one memory node, or a VM that hides the topology)")]
    if bad:
        return [result("host.numa", "host", title, FAILED,
                       f"this process may not run on any CPU local to GPU(s) {', '.join(bad)}",
                       cause="gpu_numa_misaffinity", value=value, gpus=bad)]
    nodes = sorted({r["node"] for r in rows if r["node"] is not None})
    return [result("host.numa", "host", title, PASSED,
                   f"{len(rows)} GPU(s) on NUMA node(s) {', '.join(map(str, nodes))}; local CPUs usable", value=value)]
