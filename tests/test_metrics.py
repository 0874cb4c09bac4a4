"""Training-metric ingestion, stability detectors, facts, rules and charts.

The runs under tests/fixtures/metrics/ are real CPU trainings (make_runs.py beside them); the
format variants below are made by rewriting those real logs (blanking cells, splitting ranks,
repeating a header), never by inventing loss curves.
"""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from doctor.probes import metrics as M
from doctor.probes.metrics.detect import Params
from doctor.probes.metrics.readers import csv as metrics_csv

from doctor.engine import facts as facts_mod
from doctor.evidence.contract import Hints, Sample
from doctor.evidence.errors import EvidenceError
from doctor.render.charts import loss_chart_svg

FIX = Path(__file__).parent / "fixtures" / "metrics"
RUNS = ["stable", "lr_jump", "fp16_overflow", "spike", "divergence", "resume", "stable_fp16"]
ACTIONABLE = {"critical", "high", "medium"}


def metrics_of(path: Path | str, **opts) -> dict:
    return M.analyze(str(path), options=opts or None)


# -- end to end: the CLI on each real run -------------------------------------------------------

@pytest.fixture(scope="module")
def diagnosed() -> dict[str, dict]:
    procs = {run: subprocess.Popen([sys.executable, "-m", "doctor.cli", "diagnose", "--from", str(FIX / run), "--json"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for run in RUNS}
    out = {}
    for run, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert stdout.strip(), stderr[-2000:]
        out[run] = json.loads(stdout)
        out[run]["_rc"] = proc.returncode
    return out


@pytest.mark.parametrize("run,cause,step", [
    ("lr_jump", "loss_nan", 306),
    ("fp16_overflow", "fp16_overflow", 374),
    ("spike", "loss_spike", 400),
    ("divergence", "loss_divergence", 301),
])
def test_cli_names_cause_and_step(diagnosed: dict, run: str, cause: str, step: int) -> None:
    rep = diagnosed[run]
    top = rep["findings"][0]
    assert top["cause"] == cause, [f["cause"] for f in rep["findings"]]
    text = top["summary"] + " " + " ".join(top["evidence"])
    assert re.search(rf"\bstep {step}\b", text), text
    assert rep["_rc"] == 1
    assert top["fix"], "the playbook's fix steps ride along"


def test_cli_context_explains_lr_jump(diagnosed: dict) -> None:
    ev = " ".join(diagnosed["lr_jump"]["findings"][0]["evidence"])
    assert "learning rate jumped 100x" in ev and "step 300" in ev
    assert "grad norm exploded at step 301" in ev
    causes = [f["cause"] for f in diagnosed["lr_jump"]["findings"]]
    assert "grad_explosion" in causes and "loss_spike" not in causes  # the NaN hides the blow-up spike


@pytest.mark.parametrize("run", ["stable", "stable_fp16", "resume"])
def test_cli_no_false_alarm(diagnosed: dict, run: str) -> None:
    rep = diagnosed[run]
    assert not [f for f in rep["findings"] if f["severity"] in ACTIONABLE], rep["findings"]
    assert rep["verdict"]["state"] == "healthy"


def test_fp16_collapse_outranks_its_nan(diagnosed: dict) -> None:
    causes = [f["cause"] for f in diagnosed["fp16_overflow"]["findings"]]
    assert causes[0] == "fp16_overflow" and "loss_nan" not in causes


# -- readers ------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw,want", [
    ("train/loss", ("loss", 1.0)), ("lm loss", ("loss", 1.0)), ("Loss/train", ("loss", 1.0)),
    ("reduced_train_loss", ("loss", 1.0)), ("train_loss_step", ("loss", 1.0)),
    ("eval/loss", None), ("val_loss", None), ("train_loss_epoch", None), ("loss__MIN", None),
    ("grad_norm", ("grad_norm", 1.0)), ("global_grad_norm", ("grad_norm", 1.0)),
    ("params norm", None), ("learning rate", ("lr", 1.0)), ("lr-AdamW", ("lr", 1.0)),
    ("loss scale", ("loss_scale", 1.0)), ("trainer/global_step", ("step", 1.0)), ("_step", ("step", 1.0)),
    ("iteration", ("step", 1.0)), ("elapsed time per iteration (ms)", ("step_time", 0.001)),
    ("data_time", ("data_time", 1.0)), ("number of skipped iterations", ("skipped", 1.0)),
])
def test_canonical_names(raw: str, want) -> None:
    assert M.canonical(raw) == want


def test_tensorboard_reader_matches_tensorboard() -> None:
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    path = next((FIX / "spike").glob("events.out.tfevents.*"))
    (s,) = M.read_tfevents(path, path.name, Hints())
    acc = ea_mod.EventAccumulator(str(path))
    acc.Reload()
    ref = acc.Scalars("train/loss")
    assert [e.step for e in ref] == s.step.tolist()
    assert [e.value for e in ref] == pytest.approx(s.cols["loss"].tolist(), rel=0, abs=0)
    assert [e.value for e in acc.Scalars("train/grad_norm")] == pytest.approx(s.cols["grad_norm"].tolist())


def test_tensorboard_truncated_and_garbage(tmp_path: Path) -> None:
    path = next((FIX / "spike").glob("events.out.tfevents.*"))
    raw = path.read_bytes()
    cut = tmp_path / "events.out.tfevents.cut"
    cut.write_bytes(raw[: len(raw) // 2])  # a writer killed mid-record
    (s,) = M.read_tfevents(cut, cut.name, Hints())
    assert 0 < s.rows < 700 and "truncated" in s.meta["note"]
    bad = tmp_path / "events.out.tfevents.bad"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00garbage-garbage-garbage")
    assert not M.PROBE.sniff(Sample.read(bad))
    with pytest.raises(EvidenceError):
        M.read_tfevents(bad, bad.name, Hints())


def _stable_rows() -> list[list[str]]:
    with open(FIX / "stable" / "metrics.csv") as fh:
        return list(csv.reader(fh))


def test_csv_blank_cells_are_missing_but_nan_text_is_nan(tmp_path: Path) -> None:
    rows = _stable_rows()
    head, body = rows[0], rows[1:]
    li = head.index("loss")
    for r in body[100:300:7]:
        r[li] = ""  # rows where the loss was not logged (another cadence)
    p = tmp_path / "blank.csv"
    p.write_text("\n".join(",".join(r) for r in [head] + body) + "\n")
    m = metrics_of(p)
    assert m["first_nan_step"] == -1 and not m["spikes"]
    for r in body[450:]:
        r[li] = "nan"  # the run diverged from step 451
    p.write_text("\n".join(",".join(r) for r in [head] + body) + "\n")
    m = metrics_of(p)
    assert m["first_nan_step"] == 451 and m["nan"]["last_finite_step"] == 450
    for r in body[450:]:
        r[li] = ""  # pandas' to_csv writes NaN as an empty cell: a trailing run still reads as NaN
    p.write_text("\n".join(",".join(r) for r in [head] + body) + "\n")
    assert metrics_of(p)["first_nan_step"] == 451


def test_csv_appended_after_resume_with_repeated_header(tmp_path: Path) -> None:
    text = (FIX / "resume" / "metrics.csv").read_text().splitlines()
    head = text[0]
    at = next(i for i, ln in enumerate(text[1:], 1) if ln.startswith("251,") and i > 260)
    p = tmp_path / "metrics.csv"
    p.write_text("\n".join(text[:at] + [head] + text[at:]) + "\n")
    m = metrics_of(p)
    assert [(r["kind"], r["step"], r["from_step"]) for r in m["restarts"]] == [("resume", 251, 330)]
    assert m["loss"]["rows"] == len(text) - 1


def test_csv_ranks_and_wandb_runs_are_kept_apart(tmp_path: Path) -> None:
    stable = _stable_rows()
    div = [json.loads(ln) for ln in (FIX / "divergence" / "metrics.jsonl").read_text().splitlines()]
    # A rank column: rank 0 is the stable run, rank 1 the diverging one.
    p = tmp_path / "ranks.csv"
    lines = ["rank,step,loss,grad_norm"]
    lines += [f"0,{r[0]},{r[1]},{r[2]}" for r in stable[1:]]
    lines += [f"1,{d['_step']},{d['train/loss']},{d['train/grad_norm']}" for d in div]
    p.write_text("\n".join(lines) + "\n")
    m = metrics_of(p)
    assert m["n_series"] == 2
    assert m["by_rank"]["0"]["diverged"] is False and m["by_rank"]["1"]["diverged"] is True
    assert m["divergence"]["series"].endswith("rank1")
    # A W&B export: one column per run.
    p = tmp_path / "wandb.csv"
    lines = ["Step,good - train/loss,good - train/loss__MIN,bad - train/loss"]
    lines += [f"{i + 1},{stable[i + 1][1]},{stable[i + 1][1]},{div[i]['train/loss']}" for i in range(600)]
    p.write_text("\n".join(lines) + "\n")
    m = metrics_of(p)
    assert sorted(s["run"] for s in m["series"]) == ["bad", "good"]
    assert m["divergence"]["detected"] and ":bad" in m["divergence"]["series"]


def test_hf_trainer_state_json(tmp_path: Path) -> None:
    hist = []
    for i, ln in enumerate(ln for ln in (FIX / "lr_jump" / "train.log").read_text().splitlines() if ln.startswith("{'loss'")):
        vals = dict(re.findall(r"'(\w+)': ([^,}]+)", ln))
        hist.append({"step": i + 1, "loss": float(vals["loss"]), "grad_norm": float(vals["grad_norm"]),
                     "learning_rate": float(vals["learning_rate"]), "epoch": float(vals["epoch"])})
    hist.append({"step": 400, "eval_loss": 9.9, "epoch": 1.0})
    p = tmp_path / "trainer_state.json"
    p.write_text(json.dumps({"global_step": 400, "log_history": hist}))  # json writes NaN as NaN
    m = metrics_of(p)
    assert m["first_nan_step"] == 306 and m["series"][0]["format"] == "json:trainer_state"


def test_hf_log_steps_come_from_epoch() -> None:
    (s,) = M.read_text(FIX / "lr_jump" / "train.log", "train.log", Hints())
    assert s.step_from == "epoch" and s.step[0] == 1 and s.step[-1] == 400
    assert "train_runtime" not in (FIX / "lr_jump" / "train.log").read_text().split("\n")[0]
    assert s.rows == 400  # the end-of-training summary dict is not a step


def test_megatron_lines_and_nan_iterations() -> None:
    (s,) = M.read_text(FIX / "fp16_overflow" / "megatron.log", "megatron.log", Hints())
    i = int((s.step == 374).nonzero()[0][0])
    assert math.isnan(s.cols["loss"][i]) and s.nan_logged["loss"][i]  # Megatron drops it; nan iterations: 1
    assert s.cols["skipped"][i] == 1 and s.cols["loss_scale"][i] == 2048.0
    assert s.cols["step_time"][0] < 5  # "(ms)" converted to seconds


def test_deepspeed_overflow_messages(tmp_path: Path) -> None:
    # The exact message formats of deepspeed/runtime/fp16/loss_scaler.py and fused_optimizer.py,
    # filled with a halving sequence as the dynamic scaler produces it.
    lines, scale = [], 65536.0
    for it in range(1, 41):
        lines.append(f"step {it}: loss {2.5 - it * 0.01:.4f}")
        if it >= 20:
            lines.append(f"[2024-09-15 00:13:28,261] [INFO] [fused_optimizer.py:347:_update_scale] Grad overflow on iteration {it}")
            lines.append(f"[2024-09-15 00:13:28,261] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 "
                         f"Skipping step. Attempted loss scale: {scale:g}, reducing to {scale / 2:g}")
            scale /= 2
    lines.append("Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.")
    p = tmp_path / "ds.log"
    p.write_text("\n".join(lines) + "\n")
    m = metrics_of(p)
    ls = m["loss_scale"]
    assert ls["collapsed"] and ls["skipped_steps"] == 21 and ls["first_skip_step"] == 20
    assert ls["min"] == pytest.approx(65536.0 / 2**20)


def test_lightning_progress_bar_and_rank_prefixes(tmp_path: Path) -> None:
    rows = _stable_rows()[1:]
    bar = "".join(f"\rEpoch {(i) // 300}:  50%|#####     | {i % 300 + 1}/300 [00:10<00:10, 29.1it/s, v_num=0, "
                  f"train_loss_step={float(r[1]):.3f}, train_loss_epoch=2.500]" for i, r in enumerate(rows))
    p = tmp_path / "lightning.log"
    p.write_text(bar + "\n")
    m = metrics_of(p)
    assert m["loss"]["rows"] == 600 and m["series"][0]["format"] == "log:lightning"
    # A real 4-rank torchrun log of another fixture: "rank N | step S | loss X" lines per rank.
    src = Path(__file__).parent / "fixtures" / "evidence" / "slow_rank" / "torchrun.log"
    if src.exists():
        series = M.read_text(src, "torchrun.log", Hints())
        assert sorted(s.rank for s in series) == [0, 1, 2, 3]


def test_jsonl_nested_and_ranks(tmp_path: Path) -> None:
    recs = [json.loads(ln) for ln in (FIX / "divergence" / "metrics.jsonl").read_text().splitlines()]
    p = tmp_path / "nested.jsonl"
    p.write_text("\n".join(json.dumps({"iteration": r["_step"], "rank": 3, "metrics": {"lm_loss": r["train/loss"]}})
                           for r in recs) + "\nnot json\n")
    m = metrics_of(p)
    assert m["divergence"]["detected"] and m["series"][0]["rank"] == 3


def test_run_names_are_scrubbed(tmp_path: Path) -> None:
    recs = [json.loads(ln) for ln in (FIX / "divergence" / "metrics.jsonl").read_text().splitlines()[:200]]
    secret = "ghp_abcdefghijklmnopqrstuvwxyz0123456789"
    p = tmp_path / "m.jsonl"
    p.write_text("\n".join(json.dumps({"step": r["_step"], "loss": r["train/loss"], "run_name": f"exp-{secret}"})
                           for r in recs) + "\n")
    m = metrics_of(p)
    assert secret not in json.dumps(m) and "REDACTED" in m["series"][0]["run"]


def test_bad_input_is_one_line_and_the_rest_is_used(tmp_path: Path) -> None:
    shutil.copy(FIX / "stable" / "metrics.csv", tmp_path / "metrics.csv")
    (tmp_path / "empty.csv").write_text("step,loss,grad_norm\nabc,def,ghi\nxyz,uvw,rst\n")
    (tmp_path / "events.out.tfevents.1.host").write_bytes(
        (FIX / "spike").glob("events.out.tfevents.*").__next__().read_bytes()[:40])
    facts, _ = facts_mod.build(facts_mod.items_from_folder(tmp_path), "loose")
    errs = facts["evidence"]["errors"]
    assert any(e.startswith("empty.csv:") for e in errs), errs
    assert all("\n" not in e and "Traceback" not in e for e in errs)
    assert facts["metrics"]["loss"]["rows"] == 600


def test_trainer_log_is_read_by_logs_and_metrics() -> None:
    facts, _ = facts_mod.build(facts_mod.items_from_folder(FIX / "lr_jump"), "loose")
    assert "metrics" in facts["evidence"]["kinds"]
    assert facts["metrics"]["first_nan_step"] == 306
    assert facts["evidence"]["files"] == 1


# -- detectors and facts -------------------------------------------------------------------------

def test_params_override_by_env_and_options(monkeypatch: pytest.MonkeyPatch) -> None:
    assert metrics_of(FIX / "spike")["spikes"]
    monkeypatch.setenv("MLDOCTOR_METRICS_SPIKE_Z", "50")
    assert Params.from_env().spike_z == 50.0
    assert not metrics_of(FIX / "spike")["spikes"]
    assert metrics_of(FIX / "spike", spike_z=7)["spikes"]  # options win over the environment
    monkeypatch.setenv("MLDOCTOR_METRICS_WINDOW", "not-a-number")
    assert Params.from_env().window == 100


def test_spike_facts_and_recovery() -> None:
    m = metrics_of(FIX / "spike")
    (sp,) = m["spikes"]
    assert sp["step"] == 400 and sp["recovered"] and sp["zscore"] >= 7
    assert not m["grad_norm"]["explosion"]  # a one-step grad spike from one bad batch


def test_divergence_and_lr_jump_correlated() -> None:
    m = metrics_of(FIX / "divergence")
    d = m["divergence"]
    assert d["detected"] and 300 <= d["step"] <= 303 and d["ratio"] > 1.15
    assert any("learning rate jumped 25x" in c for c in d["context"])
    assert [j["step"] for j in m["lr_jumps"]] == [300]


def test_loss_scale_facts_for_healthy_and_collapsed_runs() -> None:
    ok = metrics_of(FIX / "stable_fp16")["loss_scale"]
    assert not ok["collapsed"] and not ok["many_skipped"] and ok["skipped_steps"] <= 5
    bad = metrics_of(FIX / "fp16_overflow")["loss_scale"]
    assert bad["collapsed"] and bad["collapse_step"] == 374 and bad["floor_step"] == 385
    assert bad["skips_before_nan"] >= 3 and bad["first_skip_after_calibration"] < 374


def test_step_time_and_data_time_share() -> None:
    m = metrics_of(FIX / "stable")
    st = m["step_time"]
    assert 0 < st["median"] <= st["p90"] and st["unit"] == "s" and st["n"] == 600
    assert 0 <= m["data_time_share"] < 0.5


def test_every_metrics_fact_is_documented() -> None:
    """Each key the probe writes is in facts_schema, or named in its parent's documentation."""
    schema = M.PROBE.facts_schema

    def documented(path: str) -> bool:
        if path in schema or path.removesuffix("[]") in schema:
            return True
        parent, _, leaf = path.rpartition(".")
        while parent:
            doc = schema.get(parent) or schema.get(parent.removesuffix("[]"))
            if doc is not None:
                return doc.startswith(("map<", "any")) or re.search(rf"\b{re.escape(leaf)}\b", doc) is not None
            parent = parent.rpartition(".")[0]
        return False

    def walk(value, path: str) -> list[str]:
        bad = [] if documented(path) else [path]
        doc = schema.get(path, "")
        if isinstance(value, dict) and not doc.startswith(("map<", "any")):
            for k, v in value.items():
                bad += walk(v, f"{path}.{k}")
        elif isinstance(value, list):
            for item in value[:3]:
                if isinstance(item, dict):
                    bad += walk(item, f"{path}[]")
        return bad

    for run in RUNS:
        m = metrics_of(FIX / run)
        problems = [p for k, v in m.items() for p in walk(v, f"metrics.{k}")]
        assert not problems, (run, problems)
        json.dumps(m, allow_nan=True)


def test_table_round_trip_and_sniff_leaves_other_kinds_alone() -> None:
    t = M.load_table([FIX / "lr_jump", FIX / "spike"])
    assert {"series", "step", "loss", "grad_norm", "lr"} <= set(t.columns)
    assert "nan_loss" in t.columns  # logged NaNs are flagged, missing cells are not
    m = M.analyze(t)
    assert m["first_nan_step"] == 306 and m["spikes"]
    for other in (Path(__file__).parent / "fixtures").rglob("*"):
        if other.is_file() and FIX not in other.parents and other.suffix in (".txt", ".json", ".yaml", ""):
            assert not M.PROBE.sniff(Sample.read(other)), other


# -- charts ----------------------------------------------------------------------------------------

def test_chart_marks_events() -> None:
    svg = loss_chart_svg(metrics_of(FIX / "lr_jump"))
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg")
    assert "NAN @ 306" in svg and "(log y)" in svg  # a blow-up to 6e12 needs a log axis
    assert "learning rate jumped 100x" in svg  # the LR jump line carries its tooltip
    svg = loss_chart_svg(metrics_of(FIX / "spike"))
    assert "<circle" in svg and "step 400" in svg
    svg = loss_chart_svg(M.analyze(M.load_table([FIX / "divergence"])))
    assert "fill-opacity" in svg  # divergence shaded
    assert "no loss values" in loss_chart_svg({})


def test_csv_read_in_parallel_ranges_equals_one_range(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Byte ranges parsed on several threads give the very series one range gives, across a
    repeated header, a blank line, text in a number column, a step cell that is not a number and a
    last line without newline (each can fall at a range edge when ranges are 2 KiB)."""
    text = (FIX / "resume" / "metrics.csv").read_text().splitlines()
    head = text[0]
    at = next(i for i, ln in enumerate(text[1:], 1) if ln.startswith("251,") and i > 260)
    body = text[1:at] + [head] + text[at:]
    body[40] = ""  # a blank line
    f = body[90].split(",")
    body[90] = ",".join(f[:2] + ["garbage"] + f[3:])  # text in the loss column: read as not a number
    body[120] = "x" + body[120][body[120].index(","):]  # a step that is not a number
    p = tmp_path / "metrics.csv"
    p.write_text("\n".join([head] + body))  # no newline at the end
    monkeypatch.setattr(metrics_csv, "CSV_RANGE_BYTES", 2048)
    assert len(metrics_csv._csv_ranges(p, len(head) + 1, p.stat().st_size)) > 8
    many = M.read_csv(p, "metrics.csv", Hints())
    monkeypatch.setattr(metrics_csv, "CSV_RANGE_BYTES", 2**40)
    one = M.read_csv(p, "metrics.csv", Hints())
    assert len(many) == len(one) == 1
    a, b = many[0], one[0]
    assert a.rows == b.rows == len(text) - 1 - 2  # the blanked and the step-less rows are gone
    assert (a.step == b.step).all() and a.cols.keys() == b.cols.keys()
    for m in a.cols:
        assert ((a.cols[m] == b.cols[m]) | (np.isnan(a.cols[m]) & np.isnan(b.cols[m]))).all(), m
    assert int(b.step[-1]) == int(text[-1].split(",")[0])


@pytest.mark.parametrize("run", ["lr_jump", "spike", "divergence", "stable", "resume"])
def test_long_csv_values_kept_as_float32_give_the_same_diagnosis(run, tmp_path, monkeypatch):
    """Past CSV_FLOAT32_ROWS rows loss-like columns are stored as float32 (clocks stay float64);
    the real runs, read that way, must give the same events at the same steps."""
    src = next(p for p in sorted((FIX / run).iterdir()) if p.name != "README.md")
    if src.suffix != ".csv":  # a CSV of the same real run (log, JSONL, TensorBoard): the table writer's own output
        M.to_table(M.load_series([src])).to_csv(tmp_path / "metrics.csv", index=False)
        src = tmp_path / "metrics.csv"
    full = metrics_of(src)
    monkeypatch.setattr(metrics_csv, "CSV_FLOAT32_ROWS", 10)
    series = M.read_csv(src, src.name, Hints())
    assert all(s.cols["loss"].dtype == np.float32 for s in series if "loss" in s.cols)
    assert all(s.cols[m].dtype == np.float64 for s in series for m in ("step_time", "data_time") if m in s.cols)
    compact = metrics_of(src)
    assert compact["first_nan_step"] == full["first_nan_step"]
    assert [(e["kind"], e["step"]) for e in compact["events"]] == [(e["kind"], e["step"]) for e in full["events"]]
