"""The log scanner's and sniffer's shortcuts change nothing: same scan, same verdicts.

Why: a 1 MB ticket must be read in under a second, so the per-line step of the scanner
(``scan._line``) skips work a line cannot need (prefix stripping of a line that starts with no
"[" or digit, the traceback and failure-summary state machines when nothing is open, seams of
wrapped lines where no needle can cross the break), and the sniffer computes each line's
candidates once. A shortcut that is wrong would drop or add an event silently, so here every
text fixture, every ticket fixture's blocks and the pieces of the benchmark's generated ticket
are scanned both ways and must give identical scans, and the sniffer's signature test must
agree with its plain form.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from doctor.probes.common.text import strip_prefixes
from doctor.probes.logs import scan, sniff
from doctor.probes.logs.library import library

from doctor.evidence import ticket

FIX = Path(__file__).parent / "fixtures"
_BINARY = (".pkl", ".pt", ".gz", ".zip", ".tar", ".pickle", ".bin", ".npy")


def _text_fixtures() -> list[Path]:
    return [f for f in sorted(FIX.rglob("*")) if f.is_file() and not f.name.endswith(_BINARY)]


def _both(path: Path, **hints: object) -> tuple[dict, dict]:
    fast = scan.scan_file(path, "x.log", year=2026, **hints).to_json()  # type: ignore[arg-type]
    ref = scan.scan_file(path, "x.log", year=2026, reference=True, **hints).to_json()  # type: ignore[arg-type]
    return fast, ref


def test_every_text_fixture_scans_the_same_both_ways() -> None:
    files = _text_fixtures()
    assert len(files) > 100  # the fixtures are there: an empty glob must not pass
    differ = [str(f.relative_to(FIX)) for f in files if (lambda a, b: a != b)(*_both(f))]
    assert differ == []


def test_hints_and_events_are_kept_the_same_way() -> None:
    """With a rank and host hint (a per-rank file), and on logs that do have events."""
    logs = sorted((FIX / "logs").glob("*/*.log"))
    assert logs
    with_events = 0
    for f in logs:
        fast, ref = _both(f, rank_hint=3, host_hint="node07")
        assert fast == ref, f
        with_events += bool(fast["events"])
    assert with_events >= len(logs) // 2


def _ticket_blocks(tmp_path: Path) -> list[Path]:
    out = []
    docs = sorted((FIX / "tickets").glob("*.md")) + sorted((FIX / "tickets").glob("*.txt"))
    assert docs
    for doc in docs:
        for block in ticket.split(doc.read_text(encoding="utf-8", errors="replace")).blocks:
            f = tmp_path / f"{doc.stem}-{block.index}.log"
            f.write_text(block.text, encoding="utf-8")
            out.append(f)
    return out


def test_ticket_blocks_scan_the_same_both_ways(tmp_path: Path) -> None:
    blocks = _ticket_blocks(tmp_path)
    assert blocks
    for f in blocks:
        fast, ref = _both(f)
        assert fast == ref, f.name


def test_the_benchmark_ticket_scans_the_same_both_ways(tmp_path: Path) -> None:
    """The generated 1 MB ticket (bench/bench_ticket.py), cut small: its blocks and its plain log."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    try:
        from bench_ticket import build_ticket
    finally:
        sys.path.pop(0)
    text, plain = build_ticket(0.1, 0)
    (tmp_path / "plain.log").write_text(plain)
    fast, ref = _both(tmp_path / "plain.log")
    assert fast == ref
    assert fast["events"] and fast["tracebacks"]
    for block in ticket.split(text).blocks[:40]:
        f = tmp_path / f"b{block.index}.log"
        f.write_text(block.text)
        assert (lambda a, b: a == b)(*_both(f)), block.index


def _cut_examples() -> list[tuple[str, str]]:
    """Every signature example cut at each space inside one of its needles."""
    out = []
    for sig in library().signatures:
        for ex in sig.examples:
            low = ex.lower() if sig.ignorecase else ex
            for n in sig.needles:
                at = low.find(n)
                out += [(ex[:at + k], ex[at + k + 1:]) for k, ch in enumerate(n) if ch == " " and at >= 0]
    return out


def test_messages_wrapped_inside_a_needle_scan_the_same_both_ways(tmp_path: Path) -> None:
    """Every signature example cut in two lines at each space inside one of its needles (a
    message soft-wrapped by a terminal): the seams the shortcut must not skip."""
    lines = [ln for prev, cur in _cut_examples() for ln in (prev, cur, "")]
    f = tmp_path / "wrapped.log"
    f.write_text("\n".join(lines) + "\n", encoding="utf-8")
    fast, ref = _both(f)
    assert fast == ref
    assert len(fast["sig_counts"]) > 100  # the seams were tried and matched


def _signature_hit_plain(lines: list[str]) -> bool:
    """The sniffer's signature test with no shortcut (every candidate recomputed, every seam
    tried): what ``sniff._signature_hit`` must agree with."""
    lib = library()
    prev = ""
    for ln in lines:
        body, _ = strip_prefixes(ln)
        if any(s.regex.search(body) for s in lib.candidates(body) if s.kind not in sniff._NOT_CLAIMING):
            return True
        if prev and scan.wraps(prev, body):
            joined = prev + " " + body
            sigs = scan.seam_candidates(lib, prev, body, lib.candidates(prev) + lib.candidates(body))
            if any(sig.regex.search(joined) for sig in sigs if sig.kind not in sniff._NOT_CLAIMING):
                return True
        prev = body
    return False


def test_sniff_signature_hit_agrees_with_its_plain_form() -> None:
    hits = 0
    for f in _text_fixtures():
        lines = f.read_text(encoding="utf-8", errors="replace").splitlines()[:2000]
        got = sniff._signature_hit(lines)
        assert got == _signature_hit_plain(lines), f
        # the same lines, each one cut in two at a space: every message becomes a seam
        wrapped = [part for ln in lines for part in (ln.partition(" ")[0], ln.partition(" ")[2])]
        assert sniff._signature_hit(wrapped) == _signature_hit_plain(wrapped), f
        hits += got
    assert hits > 50
    pairs = _cut_examples()
    assert len(pairs) > 100
    for prev, cur in pairs:
        lines = ["x" * 30 + " " + prev, cur]  # long enough to be read as wrapped
        assert sniff._signature_hit(lines) == _signature_hit_plain(lines), lines


def test_may_cross_is_never_wrong_for_a_needle_cut_at_a_space() -> None:
    """may_cross may say yes too often, never no when a needle spans the break."""
    lib = library()
    cut = 0
    for sig in lib.signatures:
        for n in sig.needles:
            for i, ch in enumerate(n):
                if ch != " ":
                    continue
                before, after = n[:i], n[i + 1:]
                prev = "x" * 40 + (before.upper() if sig.ignorecase else before)
                cur = (after.upper() if sig.ignorecase else after) + " y"
                assert lib.may_cross(prev, cur), (sig.id, n, i)
                cut += 1
    assert cut > 100


@pytest.mark.parametrize("prev,cur", [("an ordinary sentence that is long enough", "and another"),
                                      ("loss 0.7033 step 1000 | lr 3e-4 | tokens/s 1234", "0.5")])
def test_may_cross_says_no_for_plain_text(prev: str, cur: str) -> None:
    """The shortcut must also work: ordinary text gives no crossing needle."""
    assert not library().may_cross(prev, cur)
