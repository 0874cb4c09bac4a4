"""Reports: Markdown for tickets, one self-contained HTML file, JSON against its published schema.

Built from real evidence (tests/fixtures/env_capture, tests/fixtures/evidence/<scenario>, whose
stack groups come from the stacks probe). The 16k-rank size tests replicate real env values and
real py-spy frames into a facts document of that size.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import time
import zlib
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from doctor.cli import app
from doctor.engine.diagnose import diagnose_path
from doctor.engine.findings import Finding
from doctor.engine.report import Report
from doctor.render import view
from doctor.render.html import render_html
from doctor.render.markdown import LIMIT, render_markdown
from doctor.render.output import report_from_json, write_outputs

from .conftest import FIXTURES, mldoctor

SLOW_ENV = FIXTURES / "env_capture" / "slow_transport"
EVIDENCE = FIXTURES / "evidence"
SCENARIOS = sorted(p.name for p in EVIDENCE.iterdir() if p.is_dir()) if EVIDENCE.is_dir() else []
BUNDLE_NAME = "mldoctor-job-20261202T000000Z.tar.gz"
_FRAME = re.compile(r"^\s{4}(\S.*\(.*\))\s*$")


def schema() -> dict:
    return json.loads(resources.files("doctor.engine").joinpath("schemas/report.schema.json").read_text())


def validate(doc: dict) -> None:
    jsonschema.Draft202012Validator(schema()).validate(doc)


def main_thread_frames(dump: Path) -> list[str]:
    """Frames of the main thread of a real ``py-spy dump`` text (innermost first)."""
    frames: list[str] = []
    inside = False
    for line in dump.read_text(errors="replace").splitlines():
        if line.startswith("Thread "):
            if inside:
                break
            inside = '"MainThread"' in line
            continue
        if inside and (m := _FRAME.match(line)):
            frames.append(m.group(1))
    return frames


def scenario_report(name: str, tmp_path: Path) -> Report:
    """Diagnose a copy of a real scenario folder (the fixtures may be re-captured meanwhile)."""
    src = EVIDENCE / name
    dest = tmp_path / name
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("truth.yaml"))
    return diagnose_path(dest)


def scenario_with_groups(tmp_path: Path) -> tuple[str, Report]:
    for name in ("extra_collective", "rank0_exclusive", "checkpoint_io", "lock_self", "slow_rank"):
        if (EVIDENCE / name).is_dir():
            rep = scenario_report(name, tmp_path)
            if len(view.stack_groups(rep)) >= 2:
                return name, rep
    pytest.skip("no captured scenario with two stack groups yet (tests/fixtures/evidence)")


# ---------------------------------------------------------------------------------------- JSON
def test_schema_is_packaged_and_valid():
    Draft = jsonschema.Draft202012Validator
    Draft.check_schema(schema())
    assert schema()["properties"]["schema"]["const"] == "mldoctor.report/1"


@pytest.mark.parametrize("path", [SLOW_ENV, FIXTURES / "env_capture" / "default_transport",
                                  *[EVIDENCE / s for s in SCENARIOS]], ids=lambda p: p.name)
def test_json_report_matches_schema(path, tmp_path):
    report = scenario_report(path.name, tmp_path) if path.parent == EVIDENCE else diagnose_path(path)
    validate(report.to_json())
    validate(report.to_json(include_facts=True))


def test_cli_json_and_written_report_json_validate(tmp_path):
    res = mldoctor("diagnose", "--from", str(SLOW_ENV), "--json")
    validate(json.loads(res.stdout))
    write_outputs(diagnose_path(SLOW_ENV), tmp_path / "out", from_path=SLOW_ENV)
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    validate(doc)
    assert re.fullmatch(r"mldoctor-slow_transport-\d{8}T\d{6}Z\.tar\.gz", doc["bundle"]["archive"])


@pytest.mark.parametrize("mutate, where", [
    (lambda d: d["verdict"].update(state="exploded"), "state"),
    (lambda d: d["findings"][0].update(confidence=1.5), "confidence"),
    (lambda d: d["findings"][0].update(severity="apocalyptic"), "severity"),
    (lambda d: d["findings"][0].update(ranks=["zero"]), "ranks"),
    (lambda d: d.pop("verdict"), "verdict"),
    (lambda d: d.update(schema="mldoctor.report/2"), "schema"),
])
def test_schema_rejects_broken_reports(mutate, where):
    doc = diagnose_path(SLOW_ENV).to_json()
    validate(doc)
    mutate(doc)
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)


def test_report_json_round_trip_renders_the_same(tmp_path):
    name, report = scenario_with_groups(tmp_path)
    doc = json.loads(json.dumps(report.to_json(include_facts=True)))
    again = report_from_json(doc)
    assert render_markdown(again) == render_markdown(report)
    without_facts = report_from_json(json.loads(json.dumps(report.to_json())))
    assert [f.cause for f in without_facts.findings] == [f.cause for f in report.findings]
    assert view.rank_states(without_facts) == view.rank_states(report)  # rebuilt from "ranks"


# ------------------------------------------------------------------------------------ Markdown
def test_markdown_from_real_env_capture():
    report = diagnose_path(SLOW_ENV)
    md = render_markdown(report, bundle_name=BUNDLE_NAME)
    head, _, rest = md.partition("## Findings")
    assert "> **SLOW**:" in head and report.verdict["summary"] in head  # the verdict paragraph first
    assert "Most likely cause: nccl_slow_transport on ranks 0-1" in head
    assert "| 1 | `nccl_slow_transport` | medium | 0.70 | 0-1 |" in rest
    assert "- **Culprits:** ranks `0-1`" in rest
    assert "  - NCCL_P2P_DISABLE=1 in the job environment" in rest
    assert re.search(r"^  1\. Unset NCCL_P2P_DISABLE", rest, re.M)
    # environment: differing keys first and highlighted with the ranks behind each value
    env = rest[rest.index("## Environment"):]
    assert env.index("**RANK** (differs)") < env.index("| NCCL_P2P_DISABLE | `1` |")
    assert "`0` on rank 0; `1` on rank 1" in env
    assert f"mldoctor diagnose --from {BUNDLE_NAME}" in md and f"sha256sum -c {BUNDLE_NAME}.sha256" in md
    for planted in ("hf_FAKEplanted", "hunter2", "FAKEplanted/secret", "ghp_FAKEplanted", "0123456789abcdef0123"):
        assert planted not in md


def test_markdown_stack_groups_are_collapsible_and_show_the_difference(tmp_path):
    name, report = scenario_with_groups(tmp_path)
    groups = view.stack_groups(report)
    md = render_markdown(report)
    assert md.count("<details><summary>Group ") == len(groups)
    assert "<details><summary>Group 1: " in md and "(majority)" in md
    major, odd = groups[0], groups[1]
    changed = [f for f, c in view.frame_diff(odd.lines, major.lines) if c]
    assert changed, "the odd group's stack differs from the majority's"
    odd_block = md[md.index("<details><summary>Group 2: "):]
    odd_block = odd_block[: odd_block.index("</details>")]
    for frame in changed[:5]:
        assert f">> {frame}" in odd_block
    major_block = md[md.index("<details><summary>Group 1: "):]
    assert ">> " not in major_block[: major_block.index("</details>")]
    # without HTML (for terminals) the same content as plain sub-headings
    plain = render_markdown(report, html=False)
    assert "<details>" not in plain and "**Group 1: " in plain


def test_markdown_escapes_markup_from_the_evidence():
    report = diagnose_path(SLOW_ENV)
    f = report.findings[0]
    f.summary = "stuck in <module> of a|b <script>alert(1)</script>"
    f.hosts = ["node|1"]
    md = render_markdown(report)
    assert "&lt;module&gt;" in md and "<script>" not in md
    assert "node\\|1" in md  # table cell stays one cell


def big_report(n_ranks: int = 16384) -> Report:
    """A 16k-rank job: real env and py-spy frames replicated, two odd stack groups, 2048 hosts."""
    base = diagnose_path(SLOW_ENV)
    env_vars = dict(base.facts["env"]["vars"])
    dump = next((p for p in sorted(EVIDENCE.glob("*/pyspy-rank*.txt")) if main_thread_frames(p)), None)
    # rank 16383 sent nothing; 16375 and 16379 wait for a batch; 16376-16382 (but 16379) are odd
    frames = main_thread_frames(dump) if dump else [f"fn{i} (train.py:{i})" for i in range(12)]
    odd = ["_recv (torch/utils/data/dataloader.py:1200)"] + frames[1:]
    deep = frames[:2] + [f"helper{i} (model.py:{i})" for i in range(60)] + frames[2:]
    hosts = [f"node{i:04d}" for i in range(n_ranks // 8)]
    by_rank_env = {str(r): {**env_vars, "RANK": str(r), "LOCAL_RANK": str(r % 8),
                            "HOSTNAME": hosts[r // 8]} for r in range(n_ranks - 1)}
    collective = list(range(0, n_ranks - 9))  # 0-16374
    groups = [{"state": "collective", "ranks": collective, "share": len(collective) / n_ranks, "frames": frames},
              {"state": "dataloader_wait", "ranks": [n_ranks - 9, n_ranks - 5], "share": 2 / n_ranks, "frames": odd}]
    groups += [{"state": f"odd{i}", "ranks": [r], "share": 1 / n_ranks, "frames": deep}
               for i, r in enumerate(r for r in range(n_ranks - 8, n_ranks - 1) if r != n_ranks - 5)]
    facts = {
        **base.facts,
        "job": {"world_size": n_ranks, "ranks_seen": list(range(n_ranks - 1)), "n_ranks_seen": n_ranks - 1,
                "missing_ranks": [n_ranks - 1], "hosts": hosts},
        "env": {"vars": env_vars, "differing": ["RANK", "LOCAL_RANK", "HOSTNAME", "NCCL_P2P_DISABLE"],
                "values": {}, "sources": n_ranks, "by_rank": by_rank_env},
        "stacks": {"groups": groups, "by_rank": {str(r): {"state": g["state"]} for g in groups for r in g["ranks"]}},
        "gpu": {"devices": [{"host": hosts[i // 8], "index": i % 8, "name": "NVIDIA H200", "uuid": f"GPU-{i:08x}",
                             "util": 97.0, "mem_used_mb": 120_000.0, "temp": 61, "power_w": 640.5}
                            for i in range(n_ranks)]},
    }
    findings = [Finding(cause="rank_stuck_in_dataloader", rule="HANG003", rule_name="x", title="Rank stuck in its DataLoader",
                        category="hang", severity="critical", confidence=0.9, score=0.9, state="hung",
                        ranks=[n_ranks - 9, n_ranks - 5], hosts=[hosts[-2]], gpus=[], summary="2 ranks wait for a batch",
                        evidence=[f"rank {r}: waiting in _recv" for r in range(500)], fix=["step one", "step two"])]
    findings += [Finding(cause=f"cause_{i}", rule=f"R{i:03d}", rule_name="x", title=f"Finding {i}", category="hang",
                         severity="medium", confidence=0.5, score=0.3 - i / 1000, state="hung", ranks=collective,
                         hosts=hosts, gpus=[f"{h}:{g}" for h in hosts[:50] for g in range(8)],
                         summary="x" * 3000, evidence=["e" * 500] * 50, fix=["f" * 300] * 10) for i in range(40)]
    trace = [{"t": i * 0.01, "action": "follow-up", "detail": "stacks of ranks " + "0-16383 " * 20} for i in range(2000)]
    return Report(verdict={"state": "hung", "summary": "Rank stuck in its DataLoader on ranks 16375,16379: 2 ranks wait for a batch",
                           "cause": "rank_stuck_in_dataloader"},
                  findings=findings, facts=facts, source={"type": "live", "job": "bigjob"}, trace=trace)


@pytest.fixture(scope="module")
def big() -> Report:
    return big_report()


def test_markdown_16k_ranks_stays_under_github_limit(big):
    md = render_markdown(big, bundle_name=BUNDLE_NAME)
    assert len(md) <= LIMIT
    assert md.startswith("# mldoctor: HUNG - bigjob")
    assert "Rank stuck in its DataLoader on ranks 16375,16379" in md
    assert "- **Culprits:** ranks `16375,16379`" in md
    assert "... 490 more in report.json" in md  # evidence capped
    assert "more finding(s) are listed in the table above" in md  # 41 findings do not all fit
    assert "| dataloader_wait (culprit) | `16375,16379` | 2 |" in md
    assert "no evidence from rank 16383" in md
    assert "<details><summary>Group 1: 16375 rank(s) 0-16374, collective, 99.95% of ranks (majority)" in md
    assert "**LOCAL_RANK** (differs)" in md and "`3` on ranks 3,11,19," in md
    assert "Agent trace (2000 step(s))" in md and "... 1940 more step(s) in report.json" in md
    assert f"mldoctor diagnose --from {BUNDLE_NAME}" in md
    # a tighter budget: whole sections give way to a pointer, the verdict and the bundle stay
    small = render_markdown(big, bundle_name=BUNDLE_NAME, limit=20_000)
    assert len(small) <= 20_000
    assert "Left out to stay under 20,000 characters:" in small and "report.html" in small
    assert "Rank stuck in its DataLoader on ranks 16375,16379" in small
    assert f"mldoctor diagnose --from {BUNDLE_NAME}" in small


def test_html_16k_ranks_renders_every_rank_in_the_grid(big):
    page = render_html(big, bundle_name=BUNDLE_NAME)
    grid = page[page.index('id="rank-grid"'):]
    grid = grid[: grid.index("</div>")]
    assert grid.count("<i ") == 16384
    assert grid.count(' c"') == 2  # the verdict's two culprit ranks are outlined
    assert "no evidence: 1" in page  # rank 16383 sent nothing
    assert len(page) < 8 * 2**20


# ---------------------------------------------------------------------------------------- HTML
def test_html_is_self_contained_and_escaped():
    report = diagnose_path(SLOW_ENV)
    report.findings[0].summary = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    page = render_html(report, bundle_name=BUNDLE_NAME)
    assert "default-src 'none'" in page  # CSP: the browser refuses any fetch
    for needle in ("<link", "@import", "url(", "<img", "<iframe", "<object", "<embed"):
        assert needle not in page, needle
    assert not re.search(r"<[a-zA-Z][^<>]*\s(?:src|srcset|data|poster)\s*=", page)  # no tag loads anything
    assert not re.search(r"<[a-zA-Z][^<>]*\shref\s*=\s*[\"']?(?:https?:)?//", page)  # and links nowhere
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert page.count("<script>") == 1  # ours, inline


def test_html_rank_state_grid_and_stack_diff(tmp_path):
    name, report = scenario_with_groups(tmp_path)
    page = render_html(report)
    groups = view.stack_groups(report)
    states = view.rank_states(report)
    for state, _ in view.states_summary(states):
        assert f'data-state="{state}"' in page
    matrix = page[page.index('<table class="matrix">'):]
    matrix = matrix[: matrix.index("</table>")]
    for r in states:
        assert f"<th>{r}</th>" in matrix
    cols = re.split(r'<div class="group(?: majority)?">', page)[1:]
    assert len(cols) == min(len(groups), 8)
    assert 'class="diff"' not in cols[0]  # the majority group is the reference
    changed = [f for f, c in view.frame_diff(groups[1].lines, groups[0].lines) if c]
    assert cols[1].count('<li class="diff">') == len(changed) > 0


@pytest.mark.parametrize("run", ["spike", "divergence"])
def test_html_charts_the_curves_the_evidence_has(run, monkeypatch):
    folder = FIXTURES / "metrics" / run
    if not folder.is_dir():
        pytest.skip(f"no metrics fixture {run}")
    report = diagnose_path(folder)
    curves = (report.facts.get("metrics") or {}).get("curves") or {}
    if "loss" not in curves:
        pytest.skip("the metrics probe gives no loss curve for this run")
    page = render_html(report)
    charts = page[page.index('<section id="charts">'):]
    charts = charts[: charts.index("</section>")]
    assert charts.count("<svg") == sum(1 for m in ("loss", "step_time", "grad_norm", "loss_scale")
                                        if (curves.get(m) or {}).get("values"))
    assert "<figcaption>Loss</figcaption>" in charts
    assert "<polyline" in charts or "<path" in charts  # a line was drawn
    # no metrics evidence: no chart section; the charts module failing or missing: no chart either
    assert 'id="charts"' not in render_html(diagnose_path(SLOW_ENV))
    broken = type(sys)("doctor.render.charts")
    broken.loss_chart_svg = lambda *a, **k: (_ for _ in ()).throw(ValueError("bad curve"))
    monkeypatch.setitem(sys.modules, "doctor.render.charts", broken)
    assert 'id="charts"' not in render_html(report)
    monkeypatch.setitem(sys.modules, "doctor.render.charts", None)  # import fails
    assert 'id="charts"' not in render_html(report)


# ----------------------------------------------------------------------------------------- CLI
def test_report_command_formats_and_inputs(tmp_path):
    out = tmp_path / "out"
    write_outputs(diagnose_path(SLOW_ENV), out, from_path=SLOW_ENV)
    archive = next(out.glob("*.tar.gz"))
    expected = [f.cause for f in diagnose_path(SLOW_ENV).findings]
    runner = CliRunner()
    for src in (SLOW_ENV, archive, out / "report.json"):
        res = runner.invoke(app, ["report", str(src), "--format", "json"])
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout)
        validate(doc)
        assert [f["cause"] for f in doc["findings"]] == expected
        md = runner.invoke(app, ["report", str(src), "--format", "md"]).stdout
        assert "## Findings" in md and "nccl_slow_transport" in md
        if src == archive:
            assert f"mldoctor diagnose --from {archive.name}" in md
    res = mldoctor("report", str(archive), "--format", "html", "--out", str(tmp_path / "r.html"))
    assert res.returncode == 0 and (tmp_path / "r.html").stat().st_mode & 0o777 == 0o600
    assert "<!doctype html>" in (tmp_path / "r.html").read_text()


def test_report_command_bad_input_is_one_line(tmp_path):
    bad = tmp_path / "report.json"
    bad.write_text('{"schema": "mldoctor.report/1", "findings": [{"cause": 3, "confidence": "x"}')
    res = mldoctor("report", str(bad), "--format", "md")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    res = mldoctor("report", str(tmp_path / "nope"), "--format", "md")
    assert res.returncode == 2 and "no such file" in res.stderr


def test_report_md_on_a_terminal_is_rendered_rich():
    """On a TTY `--format md` is drawn by rich (tables with box lines, no raw Markdown/HTML)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "doctor.cli", "report", str(SLOW_ENV), "--format", "md"],
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.PIPE,
                            env={**os.environ, "COLUMNS": "160", "TERM": "xterm"}, start_new_session=True)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        os.close(master)
    text = re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", b"".join(chunks)).decode(errors="replace")
    assert "nccl_slow_transport" in text and "NCCL_P2P_DISABLE" in text
    assert "<details>" not in text and "| --- |" not in text
    assert "━" in text or "─" in text  # rich draws the tables


# ------------------------------------------------------------------------------------- browser
def _png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB/RGBA PNG (what Chromium writes) with the stdlib: width, height, rows."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8 and color in (2, 6), (depth, color)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], (prev[x - bpp] if x >= bpp else 0)
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line) if bpp == 3 else bytes(v for i, v in enumerate(line) if i % 4 != 3))
        prev = line
    return width, height, rows


_PROBE = """<script>
(function () {
  var errs = [];
  function note(m) { errs.push(String(m)); document.documentElement.setAttribute("data-errors", JSON.stringify(errs)); }
  window.addEventListener("error", function (e) { note("error: " + e.message); });
  window.addEventListener("unhandledrejection", function (e) { note("rejection: " + e.reason); });
  document.addEventListener("securitypolicyviolation", function (e) { note("csp: " + e.blockedURI); });
  var orig = console.error;
  console.error = function () { note("console: " + Array.prototype.join.call(arguments, " ")); orig.apply(console, arguments); };
  window.addEventListener("load", function () {
    var b = document.querySelector(".legend button[data-cls]");
    if (b) { b.click(); }
    document.documentElement.setAttribute("data-errors", JSON.stringify(errs));
    document.documentElement.setAttribute("data-loaded", "1");
  });
})();
</script>"""


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _run_chromium(exe: str, args: list[str], profile: Path, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", "--enable-logging=stderr", "--v=0", f"--user-data-dir={profile}",
           "--virtual-time-budget=5000", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.browser
def test_html_in_headless_chromium(tmp_path):
    exe = _chromium()
    if exe is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    try:
        name, report = scenario_with_groups(tmp_path)
    except pytest.skip.Exception:
        report = diagnose_path(SLOW_ENV)
    out = tmp_path / "out"
    write_outputs(report, out, from_path=Path(report.source["path"]))
    page = (out / "report.html").read_text()
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("<head>", "<head>" + _PROBE, 1))

    dom = _run_chromium(exe, ["--dump-dom", probe.as_uri()], tmp_path / "profile1")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-loaded="1"' in dom.stdout, "the page did not finish loading"
    errs = re.search(r'data-errors="([^"]*)"', dom.stdout)
    assert errs and errs.group(1) == "[]", errs.group(1) if errs else dom.stdout[:500]
    console = [ln for ln in dom.stderr.splitlines() if ":CONSOLE" in ln]  # errors, CSP blocks, any log
    assert not console, console
    summary = report.verdict["summary"]
    import html as html_mod

    assert html_mod.escape(summary, quote=False) in dom.stdout  # the verdict text is in the DOM
    assert 'class="grid filter"' in dom.stdout or 'class="grid big filter"' in dom.stdout  # report.js ran

    png = tmp_path / "shot.png"
    shot = _run_chromium(exe, [f"--screenshot={png}", "--window-size=1280,900", "--hide-scrollbars",
                               (out / "report.html").as_uri()], tmp_path / "profile2")
    assert shot.returncode == 0 and png.is_file(), shot.stderr[-2000:]
    width, height, rows = _png_pixels(png)
    assert (width, height) == (1280, 900)
    colors = {row[i:i + 3] for row in rows[::7] for i in range(0, len(row), 21)}
    assert len(colors) > 20, "the screenshot is blank"
    banner = {"hung": b"\xa4\x0e\x26", "crashed": b"\xa4\x0e\x26", "slow": b"\x8a\x5a\x00",
              "diverging": b"\x6e\x40\xc9", "healthy": b"\x1a\x7f\x37", "unknown": b"\x42\x4a\x53"}
    state = report.verdict["state"]
    top = rows[5]
    assert top[3 * 640:3 * 641] == banner[state], "the verdict banner is not at the top of the page"
