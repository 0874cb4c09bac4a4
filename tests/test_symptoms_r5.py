"""Ticket prose, round 5: Chinese posts, template placeholders and side sections, quiet exits.

Why these cases: on a corpus of public first posts about multi-GPU training and serving, most
posts that got no state were Chinese ("卡住", "报错", "显存不足", "loss为nan"), were bug-report
templates whose placeholder text ("Reproduce this error with a file ...") read as a crash, or used
words such as "exits without any information" and "cannot be exited". The sentences below are
short paraphrases of such posts (their shape, not their text), plus the near misses that must give
nothing: a Chinese negation ("不报错": no error), a question, what the reporter expected.
"""

from __future__ import annotations

import pytest
from doctor.probes.symptoms import read


def _asserted(text: str, fact: str = "states") -> list[str]:
    return [p.value for p in read.phrases(text) if p.fact == fact and p.asserted]


@pytest.mark.parametrize("text,state", [
    ("# 多机多卡在训练的时候卡住", "hang"),
    ("单机多卡训练时，跑完10个epochs后代码卡住了，只有一个gpu利用率100", "hang"),
    ("多卡训练之后，就会一直停留在一个batch不动", "hang"),
    ("单机多卡训练出现卡死，不报错也没日志输出", "hang"),
    ("用train.py训练就出现报错：Segmentation fault (core dumped)。", "crash"),
    ("训练报错显存不足，batchsize已经改成8。", "oom"),
    ("开启FP16训练后loss一直为nan。", "diverge"),
    ("多卡训练的速度并没有比单卡快很多。", "slow"),
    ("After the distributed training is finished, the program cannot be exited normally.", "hang"),
    ("The server stops returning tokens after a few hours.", "hang"),
    ("The training program exits at this line without any information.", "crash"),
    ("Process finished with exit code -9", "crash"),
    ("The training loss suddenly spikes up after resuming.", "diverge"),
    ("The speed of training will drop significantly after 15 epochs.", "slow"),
])
def test_state_read(text: str, state: str) -> None:
    assert state in _asserted(text)


@pytest.mark.parametrize("text", [
    "不报错也不继续训练",          # "no error": only the hang counts
    "程序没有报错，只是很慢。",      # "no error", then slow
    "Process finished with exit code 0",
    "单卡在跑的时候一切正常。",       # "单卡在" is "one GPU is", not "stuck at"
])
def test_no_false_crash_or_hang(text: str) -> None:
    got = _asserted(text)
    assert "crash" not in got
    if "卡在" not in text and "继续" not in text:
        assert "hang" not in got


def test_chinese_question_only_asks_its_last_clause() -> None:
    # the full-width question mark closes a question; the hang before the comma is still reported
    assert _asserted("我在多机多卡训练的时候，会在这一步卡住，请问是什么原因？") == ["hang"]
    assert "crash" not in _asserted("请问这个会报错吗？")


def test_template_placeholder_adds_nothing() -> None:
    text = ("## Describe the bug\nA clear and concise description of what the bug is.\n\n"
            "## Minimal Reproduce\n\nReproduce this error with a file or several lines of code.\n")
    assert _asserted(text) == []


def test_expected_behavior_section_asserts_nothing() -> None:
    text = ("### Describe the bug\n\nTraining hangs at step 100 on two nodes.\n\n"
            "### Expected behavior\n\nTraining should not crash or run out of memory.\n\n"
            "### System Info\n\nerror_handling: raise\n")
    assert _asserted(text) == ["hang"]
    set_aside = {p.why_not for p in read.phrases(text) if p.fact == "states" and not p.asserted}
    assert set_aside <= {"expected", "negated"}
    # a heading that is not a side section ends one
    text2 = "### Expected behavior\n\nNo crash.\n\n### Actual behavior\n\nThe job crashes at step 3.\n"
    assert _asserted(text2) == ["crash"]


def test_where_and_when_in_chinese() -> None:
    text = "单卡正常，多机训练跑完10个epochs后卡住，保存模型的时候也会卡住。"
    assert "single_gpu_works" in _asserted(text, "where")
    assert "multi_node" in _asserted(text, "where")
    assert {"after_steps", "checkpoint"} <= set(_asserted(text, "when"))


def test_init_glued_to_chinese_text() -> None:
    # no word boundary between "group" and "之" (both word characters): init is still read
    assert "init" in _asserted("单机多卡训练卡在了dist.init_process_group之后", "when")
