"""The full human benchmark run: every part of bench/evaluate.py, then the other bench scripts.

    . /tmp/venv/bin/activate && python bench/run_all.py [--repeat 3]

Regenerates docs/benchmarks.md with: accuracy on every case (in-process and through the real CLI,
with py-spy stack counts and torchfrtrace side by side), the live scenarios and the 4/8/16-rank
time to verdict, the 1k/4k/16k-rank stacks and 1k-rank flight-recorder scale runs with memory
peaks, and the printed output of the other bench/*.py scripts (bench_ticket.py among them: a 1 MB
Markdown ticket read against the same content as a plain log). Takes tens of minutes; run it on a
quiet machine (timings are medians but a busy machine still skews them). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import evaluate  # noqa: E402  (bench/evaluate.py, beside this file)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement (medians)")
    args = ap.parse_args()
    return evaluate.main(["--cli", "--repeat", str(args.repeat), "--cli-repeat", "1", "--live", "--scale", "--other"])


if __name__ == "__main__":
    raise SystemExit(main())
