"""Tickets against the same evidence as files: is a pasted issue read as well as its attachments?

Run: python bench/ticket_parity.py [--cases 'sealed-*' ...] [--json F]

For every case kept as the whole ticket (``ticket: true`` in its truth.yaml), two runs:

- the ticket as posted (``issue.md``: prose and blocks), as bench/evaluate.py runs it;
- its fenced code blocks alone, each written to its own file (``block-01.txt``, ...), which is
  what the engineer would have attached had they not pasted a ticket: the same machine evidence
  without the prose.

The blocks are cut here with a plain fence scanner written for this script, not with mldoctor's
ticket splitter, so a splitter bug cannot hide in both sides. A ticket with no fenced block has
no files version and is counted apart ("prose only"). The prose is extra evidence, so the
ticket side should score at least as well; where it scores lower, the splitter or the prose
reader lost something the files gave.

Sealed cases are reported in aggregate only (bench/sealed.py), like everywhere else.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import evaluate as ev  # noqa: E402
import sealed  # noqa: E402

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})[^\n]*$")


def fenced_blocks(text: str) -> list[str]:
    """The bodies of the fenced code blocks of a Markdown document (CommonMark fences; a fence
    left open runs to the end). Quoted lines (``> ``) are unquoted first, as a reader would."""
    lines = [re.sub(r"^(?:>\s?)+", "", ln) for ln in text.splitlines()]
    out: list[str] = []
    cur: list[str] | None = None
    opener = ""
    for ln in lines:
        m = _FENCE.match(ln)
        if cur is None:
            if m:
                cur, opener = [], m.group("fence")
            continue
        if m and m.group("fence")[0] == opener[0] and len(m.group("fence")) >= len(opener) \
                and not ln.strip()[len(m.group("fence")):].strip():
            out.append("\n".join(cur))
            cur = None
            continue
        cur.append(ln)
    if cur:
        out.append("\n".join(cur))
    return [b for b in out if b.strip()]


def _documents(case: ev.Case) -> list[Path]:
    ev_path = case.evidence
    files = [ev_path] if ev_path.is_file() else sorted(p for p in ev_path.rglob("*") if p.is_file())
    return [p for p in files if p.suffix.lower() in (".md", ".markdown", ".txt") and p.name not in ev.NOT_EVIDENCE]


def files_version(case: ev.Case, dest: Path) -> Path | None:
    """The case's non-ticket files plus each fenced block of its Markdown documents as a file."""
    dest.mkdir(parents=True, exist_ok=True)
    n = 0
    src = case.evidence
    for p in ([src] if src.is_file() else sorted(q for q in src.rglob("*") if q.is_file())):
        if p.name in ("truth.yaml", "README.md"):
            continue
        if p.suffix.lower() in (".md", ".markdown"):
            for block in fenced_blocks(p.read_text(errors="replace")):
                n += 1
                (dest / f"block-{n:02d}.txt").write_text(block + "\n")
        else:
            (dest / p.name).write_bytes(p.read_bytes())
    return dest if any(dest.iterdir()) and n else None


def run(patterns: list[str] | None) -> list[dict[str, Any]]:
    rows = []
    for case in ev.load_cases(patterns=patterns):
        if not case.truth.get("ticket") or case.cause is None:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            t_out = ev.diagnose_inprocess(ev.stage(case, Path(tmp) / "ticket"))
            fdir = files_version(case, Path(tmp) / "files")
            f_out = ev.diagnose_inprocess(fdir) if fdir else None
        rows.append({"case": case.name, "sealed": sealed.is_sealed(case.name),
                     "ticket": ev.score(case, t_out), "files": ev.score(case, f_out) if f_out else None})
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    paired = [r for r in rows if r["files"] is not None]
    def count(side: str, key: str) -> int:
        return sum(bool(r[side][key]) for r in paired)
    return {
        "tickets": len(rows), "prose_only": len(rows) - len(paired), "paired": len(paired),
        "ticket_top1": count("ticket", "top1"), "files_top1": count("files", "top1"),
        "ticket_top3": count("ticket", "top3"), "files_top3": count("files", "top3"),
        "ticket_only_right": sum(bool(r["ticket"]["top1"]) and not r["files"]["top1"] for r in paired),
        "files_only_right": sum(bool(r["files"]["top1"]) and not r["ticket"]["top1"] for r in paired),
        "prose_only_top1": sum(bool(r["ticket"]["top1"]) for r in rows if r["files"] is None),
    }


def _line(name: str, s: dict[str, Any]) -> str:
    p = s["paired"] or 1
    return (f"{name}: {s['tickets']} ticket cases, {s['paired']} with fenced blocks: top-1 as the ticket "
            f"{s['ticket_top1']}/{s['paired']} ({100 * s['ticket_top1'] // p} %), the blocks as files "
            f"{s['files_top1']}/{s['paired']} ({100 * s['files_top1'] // p} %); top-3 {s['ticket_top3']} vs "
            f"{s['files_top3']}; right only as the ticket {s['ticket_only_right']}, only as files "
            f"{s['files_only_right']}; prose-only tickets {s['prose_only']} (top-1 {s['prose_only_top1']})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="*", help="case folder glob patterns (default: all)")
    ap.add_argument("--json", type=Path, help="write the aggregate (and dev rows) here")
    args = ap.parse_args(argv)
    rows = run(args.cases)
    dev = [r for r in rows if not r["sealed"]]
    sea = [r for r in rows if r["sealed"]]
    out = {"dev": summarize(dev), "sealed": summarize(sea)}
    print(_line("dev", out["dev"]))
    print(_line("sealed", out["sealed"]))
    for r in dev:
        if r["files"] is not None and bool(r["files"]["top1"]) and not r["ticket"]["top1"]:
            print(f"  dev case right only as files: {r['case']}")
    if args.json:
        args.json.write_text(json.dumps({"summary": out, "dev_rows": dev}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
