"""Ticket reading speed: a 1 MB Markdown issue against the same evidence as a plain log.

Run: python bench/bench_ticket.py [--mib 1] [--runs 5]
Prints medians; nothing is asserted (target: a 1 MB ticket turned into facts in < 1 s).

The ticket is built from real captured evidence (tests/fixtures: a watchdog-timeout launcher
log, py-spy dumps, nvidia-smi output) wrapped the way people post it: a sentence or two, then
fenced, <details>-folded and quoted blocks, repeated until the size is reached. The plain log
holds exactly the text of the ticket's blocks, one after the other, so the ratio is the price of
the splitting (and of reading the prose), not of more evidence.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from doctor.engine import facts as facts_mod  # noqa: E402

FIX = ROOT / "tests" / "fixtures"


def build_ticket(mib: float, log_kib: int = 0) -> tuple[str, str]:
    """(ticket text, the same block contents as one plain log).

    Each section is a sentence, a launcher log in a fence, a py-spy dump under "rank 1:", an
    nvidia-smi table in a <details> fold and a quoted reply quoting the log. ``log_kib`` makes
    each section's log that long (real logs appended one after the other): few large blocks,
    as most tickets are; 0 keeps one real log per section: many small blocks, the worst case
    for the splitter. Every block is made unique by a last line of its own (a real trainer step
    line for logs, a note elsewhere): a verbatim repeat is read once, and the measure is of
    reading 1 MB, not of skipping copies.
    """
    logs = [f.read_text() for f in sorted((FIX / "logs").glob("*/torchrun.log"))]
    dumps = [f.read_text() for f in sorted((FIX / "evidence").glob("*/pyspy-rank*.txt"))]
    smi = (FIX / "gpu/h200/stuck/nvidia-smi.txt").read_text()
    parts, plain = ["## Job hangs after evaluation, only multi-node\n\n"], []
    size, i, k = 0, 0, 0
    while size < mib * 2**20:
        log = logs[k % len(logs)]
        k += 1
        while len(log) < log_kib * 1024:
            log += logs[k % len(logs)]
            k += 1
        log += f"[default0]:rank 0 | step {1000 + i} | loss 0.7033\n"
        dump = dumps[i % len(dumps)] + f"\n# dump {i}\n"
        table = smi + f"\n# snapshot {i}\n"
        excerpt = "".join(log.splitlines(keepends=True)[-40:]) + f"[default1]:rank 1 | step {i} | loss 0.7\n"
        quoted = "".join("> " + ln + "\n" for ln in excerpt.splitlines())
        section = (f"Update {i}: it hangs again after 2k steps, works with NCCL_P2P_DISABLE=1.\n\n"
                   f"```text\n{log}```\n\nrank 1:\n\n```\n{dump}```\n\n"
                   f"<details><summary>nvidia-smi</summary>\n\n```\n{table}```\n</details>\n\n"
                   f"> quoting the first report:\n>\n> ```\n{quoted}> ```\n\n")
        parts.append(section)
        plain += [log, dump, table, excerpt]
        size += len(section)
        i += 1
    return "".join(parts), "".join(plain)


def timed(path: Path, runs: int) -> tuple[float, float, dict]:
    """(median wall seconds, median CPU seconds of this process, the facts).

    CPU time is printed besides wall time because the machines this runs on are shared: under
    load the wall time mostly measures the others, and only the ratio taken in one run (and the
    CPU time) compares across runs."""
    times, cpu, facts = [], [], {}
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        facts, _ = facts_mod.build(facts_mod.items_from_folder(path), "loose")
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(times), statistics.median(cpu), facts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=float, default=1.0, help="ticket size in MiB")
    ap.add_argument("--runs", type=int, default=5, help="runs per measurement (median)")
    args = ap.parse_args()
    for shape, log_kib in (("few large blocks (64 KiB logs)", 64), ("many small blocks (one real log each)", 0)):
        ticket, plain = build_ticket(args.mib, log_kib)
        with tempfile.TemporaryDirectory(prefix="mldoctor-bench-ticket-") as tmp:
            doc, log = Path(tmp) / "issue.md", Path(tmp) / "same-content.log"
            doc.write_text(ticket)
            log.write_text(plain)
            timed(doc, 1)  # warm the probes' caches (pattern libraries) for both
            t_doc, c_doc, facts = timed(doc, args.runs)
            t_log, c_log, _ = timed(log, args.runs)
        pieces = len(facts["evidence"].get("documents") or [])
        print(f"{shape}: ticket {len(ticket) / 2**20:.2f} MiB, {pieces} pieces read as "
              f"{', '.join(facts['evidence']['kinds'])}: median {t_doc:.3f} s (CPU {c_doc:.3f} s) over "
              f"{args.runs} runs (target < 1 s); the same block text as one plain log "
              f"({len(plain) / 2**20:.2f} MiB): {t_log:.3f} s (CPU {c_log:.3f} s); "
              f"ratio {t_doc / t_log:.1f}x (CPU {c_doc / c_log:.1f}x)")


if __name__ == "__main__":
    main()
