"""The sealed split stays sealed: nothing outside bench/cases cites a sealed case, and the first
answer recorded for each is never edited (bench/sealed.py says why)."""

from __future__ import annotations

import sys

import yaml

from .conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import sealed  # noqa: E402  (a bench script, imported by file name)


def test_no_sealed_case_is_cited_outside_bench_cases():
    assert sealed.leaks() == []


def test_every_sealed_case_has_its_first_run_unchanged():
    problems = [p for case in sealed.sealed_cases() for p in sealed.first_run_problems(case)]
    assert problems == []


def _plant(root, url="https://github.com/example/trainer/issues/4242"):
    case = root / "bench" / "cases" / "sealed-t1-01"
    case.mkdir(parents=True)
    line = ("[rank3]:[E1203 10:42:01.123] ProcessGroupNCCL.cpp:616 Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=77, OpType=ALLREDUCE, NumelIn=4096) ran for 600012 milliseconds")
    (case / "train.log").write_text("starting\n" + line + "\n")
    (case / "truth.yaml").write_text(yaml.safe_dump({"source": url, "cause": "timeout_too_short"}))
    return url, line


def test_the_leak_check_finds_a_cited_thread_and_a_copied_line(tmp_path):
    url, line = _plant(tmp_path)
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "ok.yaml").write_text("id: fine\nsource: https://github.com/example/trainer/issues/42\n")
    assert sealed.leaks(tmp_path) == []
    (tmp_path / "rules" / "cites.yaml").write_text(f"source: {url}/\n")
    # the same line, other timestamp and spacing, pasted as a signature example
    (tmp_path / "probes").mkdir()
    copied = line.replace("10:42:01.123", "23:59:59.999").replace(" ran for", "   ran for")
    (tmp_path / "probes" / "sig.yaml").write_text(f"examples: ['{copied}']\n")
    assert sealed.leaks(tmp_path) == [
        "probes/sig.yaml cites sealed case sealed-t1-01 (a line of its evidence)",
        "rules/cites.yaml cites sealed case sealed-t1-01 (its thread)",
    ]


def test_a_case_without_a_first_run_is_refused(tmp_path):
    _plant(tmp_path)
    (case,) = sealed.sealed_cases(tmp_path / "bench" / "cases")
    assert sealed.first_run_problems(case, tmp_path) == [
        "sealed-t1-01: no first_run block (record it before any change: bench/evaluate.py --record-first-run)"]


def test_first_run_is_recorded_once_and_the_label_kept_verbatim(tmp_path):
    import evaluate

    folder = tmp_path / "sealed-t1-02"
    folder.mkdir()
    src = ROOT / "bench" / "cases" / "public-nccl-1405-ib-completion"
    (folder / "nccl.log").write_bytes((src / "nccl.log").read_bytes())
    label = (src / "truth.yaml").read_text().replace("expect_pass: true", "expect_pass: true\nbatch: t1")
    (folder / "truth.yaml").write_text(label)
    case = evaluate.Case(folder.name, folder, yaml.safe_load(label))
    assert evaluate.record_first_run([case]).startswith("recorded 1 first runs: top-1 1/1")
    text = (folder / "truth.yaml").read_text()
    assert text.startswith(label.rstrip("\n"))
    first = yaml.safe_load(text)["first_run"]
    assert first["top"][0] == "nccl_ib_fault" and first["top1"] is True and first["right"] is True
    assert set(sealed.FIRST_RUN_KEYS) <= set(first)
    again = evaluate.Case(folder.name, folder, yaml.safe_load(text))
    assert evaluate.record_first_run([again]).startswith("recorded 0 first runs")
    assert (folder / "truth.yaml").read_text() == text
