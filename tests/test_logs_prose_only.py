"""logs.prose_only_kinds: an event the reporter only paraphrased stands apart from a quoted message.

GPU008 and CRASH003 read this one fact instead of each carrying the same text test; here the
fact is built from real ticket text through the same path `diagnose --from issue.md` takes."""

from __future__ import annotations

from pathlib import Path

from doctor.engine import facts as facts_mod
from probes.logs.facts import prose_only_kinds

LOG = ("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
       "GPU 0 has a total capacity of 79.15 GiB of which 1.10 GiB is free.\n")


def _facts(tmp_path: Path, text: str) -> dict:
    (tmp_path / "issue.md").write_text(text)
    facts, _ = facts_mod.build(facts_mod.items_from_folder(tmp_path), "loose")
    return facts.get("logs") or {}


def test_a_paraphrase_in_the_prose_is_prose_only(tmp_path: Path) -> None:
    text = ("# Training hangs at step 200 on 8 GPUs\n\nThe job hangs after step 200 and never recovers. "
            "Earlier I also saw a CUDA out of memory once with batch size 64, but with 32 it works.\n")
    logs = _facts(tmp_path, text)
    assert logs["counts"].get("gpu_oom")  # the paraphrase is read as an OOM line...
    assert "gpu_oom" in logs["prose_only_kinds"]  # ...but only as the reporter's word


def test_a_pasted_message_is_not_prose_only(tmp_path: Path) -> None:
    logs = _facts(tmp_path, "# OOM at step 3\n\nIt crashes with this:\n\n```\n" + LOG + "```\n")
    assert logs["counts"].get("gpu_oom")
    assert "gpu_oom" not in logs["prose_only_kinds"]


def test_one_machine_hit_is_enough_to_keep_a_kind() -> None:
    events = [{"kind": "gpu_oom", "file": "issue.md prose", "text": "it ran out of GPU memory once"},
              {"kind": "gpu_oom", "file": "issue.md block 2", "text": LOG.strip()},
              {"kind": "loss_nonfinite", "file": "issue.md prose", "text": "the loss is nan after a while"},
              {"kind": "xid", "file": "issue.md prose", "text": "dmesg said NVRM: Xid 79, GPU has fallen off the bus"}]
    assert prose_only_kinds(events) == ["loss_nonfinite", "xid"]


def test_a_quoted_exception_name_in_a_sentence_is_the_machine_s() -> None:
    events = [{"kind": "gpu_oom", "file": "issue.md prose",
               "text": "We get torch.OutOfMemoryError: CUDA out of memory when the batch is 64."}]
    assert prose_only_kinds(events) == []
