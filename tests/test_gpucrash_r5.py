"""Round 5 GPU hardware, crash and divergence readers, end to end on short template tickets.

Each ticket is written for this test in the shapes reporters use (a fragment of nvidia-smi, a
bare CUDA error string, key=value loss prints, a sentence about where the processes sit), so the
claims are about the general wording, not about one thread: the log signatures of
probes/logs/patterns/gpu_r5.yaml and stab_r5.yaml, the phrases of
probes/symptoms/patterns/gpucrash_r5.yaml and the rules GPU020-GPU022, CRASH035, STAB014-015 and
CRASH003's stand-back for an OOM told only in prose.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from doctor.engine.diagnose import diagnose_path

CASES: list[tuple[str, str, str]] = [
    ("smi_err_row", "After the crash nvidia-smi shows this for one card:\n\n```\n"
     "|   3  NVIDIA A100-SXM4-80GB  On   | 00000000:4E:00.0 Off |                  ERR! |\n"
     "| ERR!   ERR!  ERR!    ERR! / ERR! |      0MiB / 81920MiB |    ERR!      Default |\n```\n",
     "gpu_hardware_fault"),
    ("bare_insufficient_driver", "deviceQuery prints:\n\n```\ncudaGetDeviceCount returned 35\n"
     "-> CUDA driver version is insufficient for CUDA runtime version\n```\n", "cuda_setup_mismatch"),
    ("kv_nan_losses", "```\nINFO Epoch[2] Batch[40] Speed: 512.3 samples/sec\taccuracy=0.120\tce-loss=nan,\n"
     "INFO Epoch[2] Batch[41] Speed: 511.0 samples/sec\taccuracy=0.100\tce-loss=nan,\n```\n", "loss_nan"),
    ("launch_failure_follows_node", "After about 9 hours of training one rank fails with\n\n```\n"
     "RuntimeError: CUDA error: unspecified launch failure\n```\n\n"
     "It happens at a different step every time, and always on the same node.\n", "gpu_hardware_fault"),
    ("launch_failure_alone", "```\nRuntimeError: CUDA error: unspecified launch failure\n```\n", "cuda_kernel_fault"),
    ("smi_rows_on_gpu0", "I launch with torchrun --nproc_per_node=4 on a 4-GPU node and nvidia-smi shows:\n\n```\n"
     "|    0   N/A  N/A     11201      C   python                          9021MiB |\n"
     "|    0   N/A  N/A     11202      C   python                          9019MiB |\n"
     "|    0   N/A  N/A     11203      C   python                          9019MiB |\n"
     "|    0   N/A  N/A     11204      C   python                          9021MiB |\n```\n", "duplicate_gpu"),
    ("worker_exit_in_docker", "```\nRuntimeError: DataLoader worker (pid(s) 2345) exited unexpectedly\n```\n\n"
     "We start the job with docker run --gpus all.\n", "shm_too_small"),
    ("gpu0_memory_for_every_rank", "Each of my DDP processes also takes memory on GPU 0, so GPU 0 runs out of "
     "memory first (an OOM) while the other cards are half empty.\n", "duplicate_gpu"),
    ("loss_spike_with_numbers", "Around step 12k the loss jumps from 2.1 to 7.5 and then recovers over the "
     "next 500 steps.\n", "loss_spike"),
]


@pytest.mark.parametrize("name,text,cause", CASES, ids=[c[0] for c in CASES])
def test_template_ticket_names_the_cause_first(tmp_path: Path, name: str, text: str, cause: str) -> None:
    note = tmp_path / f"{name}.md"
    note.write_text("# Problem\n\n" + text)
    findings = diagnose_path(note).findings
    assert findings, f"{name}: nothing found"
    assert findings[0].cause == cause, [(f.cause, f.rule) for f in findings]


def test_launch_failure_that_follows_the_node_hides_the_kernel_fault(tmp_path: Path) -> None:
    """GPU021 suppresses CRASH010: a kernel-fault finding would send the reporter after correct code."""
    note = tmp_path / "ulf.md"
    note.write_text("# Problem\n\n" + dict((c[0], c[1]) for c in CASES)["launch_failure_follows_node"])
    assert "cuda_kernel_fault" not in {f.cause for f in diagnose_path(note).findings}


def test_an_oom_told_only_in_a_sentence_is_not_crash003(tmp_path: Path) -> None:
    """The reporter's aside about an old, solved OOM is weighed by the SYM rules, not by CRASH003."""
    note = tmp_path / "aside.md"
    note.write_text("# LR scheduler\n\nMy question is about the learning-rate scheduler: the LR does not decay "
                    "after epoch 5. (Earlier I also saw a CUDA out of memory once with batch size 64, but with 32 "
                    "it works.)\n\n```\nEpoch 5 lr=0.001\nEpoch 6 lr=0.001\n```\n")
    assert "CRASH003" not in {f.rule for f in diagnose_path(note).findings}
