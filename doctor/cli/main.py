"""The ``mldoctor`` command line.

Heavy imports (the CEL library, pandas, textual, torch) happen inside the commands that need
them, so ``mldoctor --help`` stays fast. User errors become one line on stderr and exit code 2.

Exit codes: 0 healthy, 1 a problem was found, 2 bad usage or bad input (one line naming the
file), 3 not enough evidence for a verdict, 4 internal error (a bug in mldoctor: please report
it; MLDOCTOR_DEBUG=1 shows the traceback), 130 interrupted (a live run prints the report of
what it collected first), 143 terminated (SIGTERM; temporary folders are removed on the way out).
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from doctor.evidence.errors import RuleError, UserError

if TYPE_CHECKING:
    from doctor.engine.report import Report

#: A bug in mldoctor, as opposed to bad input (2): scripts can tell "fix your input" from "report this".
EXIT_INTERNAL = 4

app = typer.Typer(
    name="mldoctor",
    help="Diagnose hung, slow, crashed and diverging PyTorch jobs, live or from saved evidence. "
         "Exit codes: 0 healthy, 1 problem found, 2 bad input or usage, 3 not enough evidence, "
         "4 internal error (a bug in mldoctor).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help: typer's rich help renderer costs ~0.1 s of imports on every `--help`.
    rich_markup_mode=None,
)
rules_app = typer.Typer(help="List, test and lint the YAML rules.", no_args_is_help=True)
app.add_typer(rules_app, name="rules")


class Symptom(str, Enum):
    hang = "hang"
    slow = "slow"
    crash = "crash"
    diverge = "diverge"


class Format(str, Enum):
    md = "md"
    html = "html"
    json = "json"
    term = "term"


#: A paste on stdin larger than this is refused: a log archive belongs in a file.
MAX_PASTE = 256 * 2**20


def _paste_file(from_: Path | None) -> Path | None:
    """``--from -``: the paste on stdin (a ticket, a log, a dump), kept for the run in a private
    temporary file (removed at exit) so it is read exactly as a file given by path would be."""
    if from_ is None or str(from_) != "-":
        return from_
    import atexit
    import shutil
    import tempfile

    data = sys.stdin.buffer.read(MAX_PASTE + 1)
    if not data.strip():
        raise UserError("--from -: nothing was given on stdin")
    if len(data) > MAX_PASTE:
        raise UserError(f"--from -: more than {MAX_PASTE >> 20} MiB on stdin; save it to a file and pass its path")
    folder = Path(tempfile.mkdtemp(prefix="mldoctor-paste-"))
    atexit.register(shutil.rmtree, folder, True)
    path = folder / "stdin"
    path.write_bytes(data)
    return path


def _fail(msg: str, code: int = 2) -> None:
    typer.echo(f"mldoctor: {msg}", err=True)
    raise typer.Exit(code)


def _emit(report, as_json: bool, verbose: bool = False) -> None:  # noqa: ANN001
    if as_json:
        sys.stdout.write(json.dumps(report.to_json(), indent=1) + "\n")
    else:
        from doctor.render.terminal import render

        render(report, verbose=verbose)


def _progress(quiet: bool, as_json: bool):  # noqa: ANN202 - Callable[[str], None] | None
    """Live progress on stderr (rich), one line per step, so a person waiting sees which probe
    and snapshot the run is at. Never on stdout; off with -q, and off with --json when stdout is
    not a terminal (a script is reading the JSON and its stderr is often a log)."""
    if quiet or (as_json and not sys.stdout.isatty()):
        return None
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    return lambda text: console.print(f"[dim]mldoctor:[/dim] {text}", markup=True, soft_wrap=True)


def _diagnose_live(pids: list[int] | None, slurm_job: str | None, symptom: str | None,
                   logs: list[Path] | None, rules: list[Path] | None, budget: float, duration: float,
                   job: str | None, out: Path | None, redact_hosts: bool, progress=None,  # noqa: ANN001
                   debug_server: str | None = None) -> Report:
    """A SLURM job through its own engine (srun --overlap), else the job on this host."""
    if slurm_job:
        from doctor.live import slurm

        report = slurm.diagnose_slurm_job(slurm_job, symptom=symptom, rules_dirs=rules, budget=budget,
                                          out=out, redact_hosts=redact_hosts, duration=duration)
    else:
        from doctor.live import agent

        report = agent.diagnose_live(pids=pids, symptom=symptom, logs=logs, rules_dirs=rules, budget=budget,
                                     duration=duration, job=job, out=out, redact_hosts=redact_hosts,
                                     progress=progress, debug_server=debug_server)
    _say_where(report, out)
    return report


def _say_where(report: Report, out: Path | None) -> None:
    """A live --out whose names were taken wrote into a new run folder: say which."""
    where = Path(report.source.get("bundle") or ".").parent
    if out is not None and report.source.get("bundle") and where != out:
        typer.echo(f"mldoctor: {out} already holds a bundle or report files; wrote into {where}", err=True)


@app.command()
def diagnose(
    from_: Optional[Path] = typer.Option(None, "--from", help="A bundle (dir or .tar.gz), a folder of loose evidence files, a ticket (.md/.txt), or - for a paste on stdin."),
    pid: list[int] = typer.Option([], "--pid", help="Diagnose these processes (repeatable)."),
    slurm_job: Optional[str] = typer.Option(None, "--slurm-job", help="Every node of this SLURM job, through srun --overlap."),
    symptom: Optional[Symptom] = typer.Option(None, "--symptom", help="Optional hint; default: find out."),
    logs: list[Path] = typer.Option([], "--logs", help="Extra log files or folders of the job to read."),
    as_json: bool = typer.Option(False, "--json", help="Only the JSON report (mldoctor.report/1) on stdout."),
    out: Optional[Path] = typer.Option(None, "--out", help="Also write the bundle and reports to this folder."),
    rules: list[Path] = typer.Option([], "--rules", help="Extra rule files or folders."),
    budget: float = typer.Option(30.0, "--budget", help="Seconds the live agent may spend."),
    duration: float = typer.Option(10.0, "--duration", help="Sampling window (s) for --symptom slow."),
    job: Optional[str] = typer.Option(None, "--job", help="Which job on this host (launcher PID), when several run."),
    redact_hosts: bool = typer.Option(False, "--redact-hosts", help="Replace host names and IPs in what is written."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Show the trace and the rules that could not be evaluated."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="Live: no progress lines on stderr."),
    debug_server: Optional[str] = typer.Option(None, "--debug-server", help="Live: url of the job's torch debug server (torch.distributed.debug; default http://localhost:25999)."),
) -> None:
    """Diagnose a job: live on this host (default), given PIDs, a SLURM job, or saved evidence."""
    try:
        from_ = _paste_file(from_)
        if from_ is not None:
            from doctor.engine.diagnose import diagnose_path

            report = diagnose_path(from_, symptom.value if symptom else None, logs, rules)
        else:
            report = _diagnose_live(pid, slurm_job, symptom.value if symptom else None, logs, rules,
                                    budget, duration, job, out, redact_hosts, _progress(quiet, as_json),
                                    debug_server=debug_server)
        if out is not None and from_ is not None:
            from doctor.render.output import write_outputs

            written = write_outputs(report, out, from_path=from_, redact_hosts=redact_hosts, logs=logs)
            if written["md"].parent != out:
                typer.echo(f"mldoctor: {out} already holds report files; wrote into {written['md'].parent}", err=True)
    except (UserError, RuleError) as exc:
        _fail(str(exc))
        return
    except KeyboardInterrupt as exc:  # Ctrl-C in a live run: what was found, then 130
        partial = getattr(exc, "report", None)
        if partial is None:
            raise
        _say_where(partial, out)
        _emit(partial, as_json, verbose)
        typer.echo("mldoctor: interrupted; the report above holds what was collected until then", err=True)
        raise typer.Exit(130) from None
    _emit(report, as_json, verbose)
    raise typer.Exit(report.exit_code)


@app.command()
def explain(cause: str = typer.Argument(..., help="A cause id, e.g. collective_mismatch.")) -> None:
    """Print the playbook of a cause: what it means, how to confirm it, how to fix it."""
    from doctor.engine import playbook as playbooks
    from doctor.engine import taxonomy
    from doctor.render.playbook import render_playbook

    pb = playbooks.get(cause)
    if pb is None:
        close = [c for c in taxonomy.causes() if cause.lower() in c]
        _fail(f"unknown cause {cause!r}" + (f"; did you mean {', '.join(close[:5])}?" if close else "; `mldoctor rules list` shows the causes"))
    render_playbook(pb)


@app.command()
def facts(
    from_: Optional[Path] = typer.Option(None, "--from", help="Print the facts built from this evidence."),
    schema: bool = typer.Option(False, "--schema", help="Print the facts reference (Markdown)."),
) -> None:
    """Show the facts document the rules see, or its schema."""
    from doctor.engine import facts as facts_mod

    if schema or from_ is None:
        typer.echo(facts_mod.schema_markdown())
        return
    from doctor.engine.diagnose import gather_items

    try:
        items, source, runs, _ = gather_items(_paste_file(from_))
    except UserError as exc:
        _fail(str(exc))
        return
    doc, _ = facts_mod.build(items, source["type"], None, runs)
    typer.echo(json.dumps(doc, indent=1))


@app.command()
def report(
    path: Path = typer.Argument(..., help="A bundle (dir or .tar.gz), a folder of loose evidence, or a report.json."),
    fmt: Format = typer.Option(Format.md, "--format", help="md (tickets), html (one self-contained file), json (mldoctor.report/1)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write to this file (mode 0600) instead of stdout."),
) -> None:
    """Render the report of saved evidence (diagnosed again, offline) or of a report.json."""
    from doctor.render.output import load_for_report, render_as, sanitize_report, write_file

    try:
        rep, bundle_name = load_for_report(path)
        if fmt is Format.term:
            from doctor.render.terminal import render

            render(sanitize_report(rep))
            return
        if out is None and fmt is Format.md and sys.stdout.isatty():
            from rich.console import Console
            from rich.markdown import Markdown

            from doctor.render.markdown import render_markdown

            Console().print(Markdown(render_markdown(sanitize_report(rep), bundle_name=bundle_name, html=False)))
            return
        text = render_as(rep, fmt.value, bundle_name)
        if out is not None:
            write_file(out, text)
            typer.echo(f"wrote {out}", err=True)
        else:
            sys.stdout.write(text)
    except (UserError, RuleError) as exc:
        _fail(str(exc))


@rules_app.command("list")
def rules_list(rules: list[Path] = typer.Option([], "--rules")) -> None:
    """List every rule with its cause and severity."""
    from rich.console import Console
    from rich.table import Table

    rs = _ruleset(rules)
    t = Table("id", "name", "cause", "severity", "conf", "requires")
    for r in rs.rules:
        t.add_row(r.id, r.name, r.cause, r.severity, f"{r.confidence:.2f}", ", ".join(r.requires))
    Console().print(t)


@rules_app.command("test")
def rules_test(
    rule: Optional[str] = typer.Argument(None, help="Only this rule id, name or cause."),
    rules: list[Path] = typer.Option([], "--rules"),
) -> None:
    """Run every rule's cases (must fire / must not fire / not evaluable)."""
    from doctor.engine.ruletest import run_rule_tests

    try:
        results = run_rule_tests(_ruleset(rules), rule)
    except RuleError as exc:
        _fail(str(exc))
        return
    failed = [r for r in results if not r.ok]
    for r in failed:
        typer.echo(f"FAIL {r.rule} {r.name}: {r.detail} ({r.where})")
    typer.echo(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    raise typer.Exit(1 if failed else 0)


@rules_app.command("lint")
def rules_lint(rules: list[Path] = typer.Option([], "--rules")) -> None:
    """Check every rule compiles, names known facts and causes, has cases and a playbook."""
    from doctor.engine.ruletest import lint

    rs = _ruleset(rules)
    problems = lint(rs)
    for p in problems:
        typer.echo(p)
    typer.echo(f"{len(rs.rules)} rules, {len(problems)} problem(s)")
    raise typer.Exit(1 if problems else 0)


@rules_app.command("coverage")
def rules_coverage(
    as_json: bool = typer.Option(False, "--json", help="Rows as JSON, with the uncovered templates."),
    missing: bool = typer.Option(False, "--missing", help="Also list the uncovered templates."),
) -> None:
    """How many of each family's harvested upstream message templates a signature recognizes."""
    from doctor.evidence import plugins

    rows = [row for p in plugins.probes() for row in p.coverage()]
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    typer.echo(coverage_table(rows))
    if missing:
        for r in rows:
            for u in r.get("uncovered", []):
                typer.echo(f"{r['family']}: {u['template']!r} ({u['source']})")


def coverage_table(rows: list[dict]) -> str:
    """The Markdown table ``rules coverage`` prints (also pasted in docs/benchmarks.md)."""
    out = ["| family | templates harvested | fault templates | with a signature | coverage |",
           "| --- | ---: | ---: | ---: | ---: |"]
    tot_t = tot_f = tot_c = 0
    for r in rows:
        tot_t, tot_f, tot_c = tot_t + r["templates"], tot_f + r["fault_templates"], tot_c + r["covered"]
        pct = f"{100 * r['coverage']:.0f} %" if r["fault_templates"] else "- (no fault templates)"
        out.append(f"| {r['family']} | {r['templates']} | {r['fault_templates']} | {r['covered']} | {pct} |")
    if rows:
        pct = f"{100 * tot_c / tot_f:.0f} %" if tot_f else "-"
        out.append(f"| **all** | {tot_t} | {tot_f} | {tot_c} | {pct} |")
    sigs = {r.get("probe", ""): r.get("signatures", 0) for r in rows}
    out += ["", "; ".join(f"{n} signatures in the {p} library" for p, n in sorted(sigs.items()))]
    return "\n".join(out)


@app.command()
def demo(
    scenario: str = typer.Argument("extra_collective", help="Fault to inject (mldoctor demo --list)."),
    list_: bool = typer.Option(False, "--list", help="List the scenarios."),
    nproc: Optional[int] = typer.Option(None, "--nproc", help="Ranks to start (default per scenario, 4)."),
    as_json: bool = typer.Option(False, "--json", help="Only the JSON report on stdout."),
    out: Optional[Path] = typer.Option(None, "--out", help="Also write the bundle and reports here."),
) -> None:
    """Start a small real PyTorch job with a fault, diagnose it live, and clean up."""
    from doctor.scenarios import SCENARIOS

    if list_:
        for name, sc in SCENARIOS.items():
            typer.echo(f"{name:18} {sc.description}")
        return
    from doctor.live.demo import run_demo

    if not as_json:
        typer.echo(f"mldoctor demo: starting scenario {scenario!r} (a real torchrun job on the CPU)...", err=True)
    try:
        report, verdict_line = run_demo(scenario, nproc, out=out)
    except UserError as exc:
        _fail(str(exc))
        return
    _emit(report, as_json)
    if not as_json:
        typer.echo(verdict_line)
    raise typer.Exit(report.exit_code)


@app.command()
def check(
    full: bool = typer.Option(False, "--full/--quick", help="--quick (default, under 30 s): short searches and sweeps; --full: wide MAMF shape search, long sweeps."),
    as_json: bool = typer.Option(False, "--json", help="Only the JSON report (mldoctor.report/1) on stdout."),
    out: Optional[Path] = typer.Option(None, "--out", help="Also write the bundle and reports to this folder."),
    path: Optional[Path] = typer.Option(None, "--path", help="Also measure read/write throughput of this folder (checkpoint or data location)."),
    gpu: list[int] = typer.Option([], "--gpu", help="Only this GPU index (repeatable); default every GPU."),
    nprocs: Optional[int] = typer.Option(None, "--nprocs", help="Ranks of the communication check (default: one per GPU, else 2 on CPU)."),
    no_gpu: bool = typer.Option(False, "--no-gpu", help="Skip the GPU checks (they load the GPUs: never run them beside a busy job)."),
    no_comm: bool = typer.Option(False, "--no-comm", help="Skip the communication checks."),
    slurm_job: Optional[str] = typer.Option(None, "--slurm-job", help="Every node of this running SLURM job (one held for checking), through srun --overlap; one merged report."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Show the trace and the rules that could not be evaluated."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress line on stderr."),
) -> None:
    """Measure this node (host limits, GPU health and throughput, rank-to-rank communication); a check that cannot run is skipped, never passed."""
    from doctor.live import check as checks

    level = "full" if full else "quick"
    try:
        if slurm_job:
            report = checks.check_slurm_job(slurm_job, level, path=path, out=out, skip_gpu=no_gpu, skip_comm=no_comm)
        else:
            report = checks.run_check(level, path=path, gpus=gpu or None, nprocs=nprocs, out=out, skip_gpu=no_gpu,
                                      skip_comm=no_comm, progress=_progress(quiet, as_json))
        if report is None:  # --out -: the fragment went to stdout
            return
    except (UserError, RuleError) as exc:
        _fail(str(exc))
        return
    _say_where(report, out)
    _emit(report, as_json, verbose)
    raise typer.Exit(report.exit_code)


@app.command()
def collect(
    pid: list[int] = typer.Option([], "--pid", help="Collect these processes (default: the job on this host)."),
    slurm_job: Optional[str] = typer.Option(None, "--slurm-job", help="Only processes of this SLURM job."),
    job: Optional[str] = typer.Option(None, "--job", help="Which job on this host, when several run."),
    out: Path = typer.Option(..., "--out", help="Bundle folder to write, or - for a .tar.gz on stdout."),
    logs: list[Path] = typer.Option([], "--logs", help="Extra log files or folders to include."),
    symptom: Optional[Symptom] = typer.Option(None, "--symptom", help="slow: also record a sampling window of every rank."),
    duration: float = typer.Option(10.0, "--duration", help="Sampling window (s) for --symptom slow."),
) -> None:
    """Only collect evidence on this host into a bundle (what srun runs on each node)."""
    from doctor.live.node import collect_local

    try:
        collect_local(pids=pid, slurm_job=slurm_job, job=job, out=out, logs=logs,
                      symptom=symptom.value if symptom else None, duration=duration)
    except UserError as exc:
        _fail(str(exc))


@app.command()
def tui(
    path: Optional[Path] = typer.Argument(None, help="A bundle (dir or .tar.gz) or a folder of loose evidence, as --from; default: the job on this host, live."),
    pid: list[int] = typer.Option([], "--pid", help="Live: these processes (repeatable)."),
    symptom: Optional[Symptom] = typer.Option(None, "--symptom", help="Skip the first question; default: the walkthrough asks."),
    logs: list[Path] = typer.Option([], "--logs", help="Extra log files or folders of the job to read."),
    rules: list[Path] = typer.Option([], "--rules", help="Extra rule files or folders."),
    budget: float = typer.Option(30.0, "--budget", help="Seconds the live agent may spend per run."),
    job: Optional[str] = typer.Option(None, "--job", help="Which job on this host (launcher PID), when several run."),
) -> None:
    """Walk through a diagnosis and browse the evidence in a terminal UI (keyboard and mouse)."""
    if path is not None and not path.exists():
        _fail(f"{path}: no such file or folder")
    try:
        from doctor.tui.app import run_tui  # textual is imported here only: --help stays fast
    except ImportError as exc:
        _fail(f"the TUI needs textual ({exc}); pip install 'textual>=0.80'")
        return
    raise typer.Exit(run_tui(path=path, pids=pid, symptom=symptom.value if symptom else None, logs=logs,
                             rules_dirs=rules, budget=budget, job=job))


@app.command()
def mcp(
    allow_live: bool = typer.Option(False, "--allow-live", help="Also offer diagnose_live, which attaches to this host's processes (py-spy); off unless the user opts in."),
) -> None:
    """Serve mldoctor's read-only tools to coding agents over MCP (stdio); `docs/agents.md` shows the client setup."""
    try:
        import mcp as _sdk  # noqa: F401  (the optional extra: say how to get it, in one line)
    except ImportError:
        _fail("the MCP server needs the MCP SDK: pip install 'ml-doctor[mcp]' (or pip install mcp)")
        return
    from doctor.mcp.server import serve

    serve(allow_live=allow_live)


def _ruleset(rules: list[Path]):  # noqa: ANN202
    from doctor.engine.ruleset import load_ruleset

    try:
        return load_ruleset(rules)
    except RuleError as exc:
        _fail(str(exc))


def _on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C, so every ``finally`` removes its temporary folder."""
    raise SystemExit(128 + signum)


def main() -> None:
    import signal

    try:
        signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread (embedded use): keep the default
        pass
    try:
        app()
    except (UserError, RuleError) as exc:
        typer.echo(f"mldoctor: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        typer.echo("mldoctor: interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # a bug: one line by default, the traceback on request
        import os

        if os.environ.get("MLDOCTOR_DEBUG"):
            raise
        typer.echo(f"mldoctor: internal error: {type(exc).__name__}: {exc} "
                   "(set MLDOCTOR_DEBUG=1 for the traceback, and please report it)", err=True)
        sys.exit(EXIT_INTERNAL)


if __name__ == "__main__":
    main()
