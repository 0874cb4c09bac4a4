"""``python -m doctor.probes.gpu``: the live NVML document on stdout, without a bundle.

Used to capture test fixtures on a GPU host (tests/fixtures/gpu/capture_h200.sh) and to see
what the probe would record, with no other part of mldoctor involved.
"""

from __future__ import annotations

import argparse
import json

from doctor.evidence.contract import ProbeFailed, ProbeSkipped

from .nvml import collect_document, init_nvml, load_nvml, shutdown_nvml


def main(argv: list[str] | None = None) -> int:
    """``python -m doctor.probes.gpu [--samples N] [--interval S]``: print the probe's JSON."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--samples", type=int, default=0)
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--pid-rank", action="append", default=[], help="PID=RANK, repeatable")
    ap.add_argument("--no-nvlink", action="store_true")
    args = ap.parse_args(argv)
    try:
        nv = load_nvml()
        init_nvml(nv)
    except (ProbeSkipped, ProbeFailed) as exc:
        print(json.dumps({"status": type(exc).__name__, "reason": str(exc)}))
        return 3
    ranks = {int(a.split("=")[0]): int(a.split("=")[1]) for a in args.pid_rank}
    try:
        doc = collect_document(nv, samples=args.samples, interval=args.interval, rank_of_pid=ranks,
                               nvlink=not args.no_nvlink, deadline_s=600)
    finally:
        shutdown_nvml(nv)
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
