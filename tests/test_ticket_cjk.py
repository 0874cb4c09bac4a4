"""A first post written in Chinese without any Markdown is prose, not a log.

Why: the prose test counts English function words, so a paragraph of ideographs used to be taken
for machine output and the reporter's state ("卡住": stuck, "报错": errors out) was never read; such
posts got no finding at all. The texts are short paraphrases of the shape of such posts.
"""

from __future__ import annotations

from pathlib import Path

from doctor.engine.diagnose import diagnose_path
from doctor.evidence import ticket


def test_chinese_sentences_are_prose_and_logs_stay_logs() -> None:
    assert ticket._is_prose("单机多卡训练时卡住，不报错也不继续训练")
    assert ticket._is_prose("使用 torchrun 启动 4 张卡，第一个 epoch 结束后就一直卡在那里。")
    # a log line carrying a few Chinese words stays machine output
    assert not ticket._is_prose("[rank0]: RuntimeError: 数据加载失败 /data/train/0001.jpg (errno=2) {worker_id=3}")


def test_plain_chinese_post_gives_a_hang_state(tmp_path: Path) -> None:
    post = tmp_path / "issue.md"
    post.write_text("单机多卡训练时卡住，不报错也不继续训练\n"
                    "使用 torchrun 启动 4 张卡，第一个 epoch 结束后就一直卡在那里，GPU 利用率 100%。\n",
                    encoding="utf-8")
    report = diagnose_path(post)
    assert report.verdict["state"] == "hung"
