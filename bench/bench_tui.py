"""How fast `mldoctor tui` shows findings (target: under 1 s on a saved bundle).

Run: python bench/bench_tui.py
Prints medians of 5; nothing is asserted.

Measured: from App start (the app constructed and started headless at 80x24, imports done) to
the first findings listed on the Guide tab, and to the re-checked findings (this install's
rules run over the evidence). A saved bundle (written by `mldoctor diagnose --out`) carries the
report made at collection time, so its findings show before the engine has loaded; a loose
folder has none and waits for the engine. "cold" runs each open in a fresh process (the
engine loads its rules, the CEL library and the parsers on first use); "warm" opens again in
one process. The evidence is the real hung 4-rank job in tests/fixtures/evidence/extra_collective.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOOSE = ROOT / "tests" / "fixtures" / "evidence" / "extra_collective"
N = 5


async def _open(path: Path) -> dict[str, float]:
    from textual.widgets import OptionList

    from doctor.tui.app import DoctorApp
    from doctor.tui.session import Session

    t0 = time.perf_counter()
    app = DoctorApp(Session(path))
    out: dict[str, float] = {}
    async with app.run_test(size=(80, 24)) as pilot:
        deadline = time.monotonic() + 120
        lst = app.query_one("#guide-findings", OptionList)
        while time.monotonic() < deadline:
            if "first" not in out and lst.option_count:
                out["first"] = time.perf_counter() - t0
            if app.session.report is not None and not app.running:
                out["rechecked"] = time.perf_counter() - t0
                break
            await pilot.pause(0.01)
        out.setdefault("first", float("nan"))
    return out


def child(path: str) -> None:
    t0 = time.perf_counter()
    import doctor.tui.app  # noqa: F401 - the import is part of what a user waits for

    t_import = time.perf_counter() - t0
    res = asyncio.run(_open(Path(path)))
    print(json.dumps({"import": t_import, **res}))


def cold(path: Path) -> list[dict[str, float]]:
    runs = []
    for _ in range(N):
        p = subprocess.run([sys.executable, __file__, "--child", str(path)], capture_output=True, text=True,
                           check=False, cwd=ROOT)
        if p.returncode != 0:
            raise SystemExit(f"child run failed:\n{p.stderr[-3000:]}")
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    return runs


def warm(path: Path) -> list[dict[str, float]]:
    asyncio.run(_open(path))  # loads the engine once
    return [asyncio.run(_open(path)) for _ in range(N)]


def med(runs: list[dict[str, float]], key: str) -> str:
    vals = [r[key] for r in runs if key in r]
    return f"{statistics.median(vals):6.3f}s" if vals else "   n/a"


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-tui-") as tmp:
        made = subprocess.run([sys.executable, "-m", "doctor.cli", "diagnose", "--from", str(LOOSE), "--out", tmp],
                              capture_output=True, text=True, cwd=ROOT, check=False)
        archive = next(Path(tmp).glob("*.tar.gz"), None)
        if archive is None:
            raise SystemExit(f"`mldoctor diagnose --out` wrote no bundle:\n{made.stderr[-3000:]}")
        print(f"mldoctor tui open times, median of {N} (80x24 headless; from App start)")
        print(f"{'evidence':<26}{'mode':<6}{'import':>9}{'findings shown':>16}{'re-checked':>12}")
        for name, path in (("saved bundle (.tar.gz)", archive), ("loose folder", LOOSE)):
            c = cold(path)
            print(f"{name:<26}{'cold':<6}{med(c, 'import'):>9}{med(c, 'first'):>16}{med(c, 'rechecked'):>12}")
            w = warm(path)
            print(f"{name:<26}{'warm':<6}{'':>9}{med(w, 'first'):>16}{med(w, 'rechecked'):>12}")
    print("target: findings shown < 1 s on a saved bundle")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        main()
