"""Job states said in roundabout words (probes/symptoms/patterns/prose_more.yaml).

Reporters rarely write "slow", "hangs" or "diverges": they write "2 GPUs are no faster than 1",
"no response", "the loss goes up", "mAP = 0", "Error when saving". Each sentence below is a title or
first sentence of a public issue (URL beside it, read for the dev corpus of this change); the
reader must give the state the reporter describes, and the near misses none.
"""

from __future__ import annotations

import pytest
from doctor.probes.symptoms import read


def _states(text: str) -> list[str]:
    return [p.value for p in read.phrases(text) if p.fact == "states" and p.asserted]


#: sentences quoted from public issues (source above each)
QUOTED_STATES = [
    # https://github.com/pyg-team/pytorch_geometric/issues/7116
    ("DataParallel with Multi GPUs doesn't speed up with large graph data.", "slow"),
    # https://github.com/w86763777/pytorch-ddpm/issues/24
    ("Adding gpus but without improvement of training speed.", "slow"),
    # https://github.com/WongKinYiu/PyTorch_YOLOv4/issues/394
    ("Multi GPU takes longer.", "slow"),
    # https://github.com/Lightning-AI/pytorch-lightning/issues/5276
    ("The speed of each iteration halves with two GPUs.", "slow"),
    # https://github.com/speechbrain/speechbrain/issues/1096
    ("Instead of speeding up, it took longer to train one epoch.", "slow"),
    # https://github.com/dbolya/yolact/issues/438
    ("I'm training resnet50 on 4 GPUs. The utilization is very low.", "slow"),
    # https://github.com/OpenBMB/MiniCPM-V/issues/570
    ("GPU utilization does not consistently remain at 10%, but fluctuates between 0% and 10%.", "slow"),
    # https://github.com/marian-nmt/marian/issues/251
    ("After reserving memory on gpu1, the training can not receive any response.", "hang"),
    # https://github.com/lm-sys/FastChat/issues/2868
    ("The vllm worker becomes unresponsive after running for a long time.", "hang"),
    # https://github.com/LalehSeyyed/CheXclusion/issues/4
    ("I waited about 10 hours but there is no output.", "hang"),
    # https://github.com/huggingface/accelerate/issues/2960
    ("Error when saving ckpt on slurm", "crash"),
    # https://github.com/deepmodeling/dpgen/issues/713
    ("# RuntimeError", "crash"),
    # https://github.com/zhangzjn/ADer/issues/36
    ("hi, I have trained the model, but the process was killed when I want to test. do you know why?", "crash"),
    # https://github.com/deepinsight/insightface/issues/2116
    ("I meet that the loss increased within each epoch, what is the reason for this?", "diverge"),
    # https://github.com/BVLC/caffe/issues/2731
    ("Why training loss doesn't decrease in my network?", "diverge"),
    # https://github.com/Media-Smart/vedadet/issues/91
    ("mAP = 0 after training", "diverge"),
    # https://github.com/ultralytics/yolov5/issues/2037
    ("Why P, R and mAP all suddenly drop to zero during training?", "diverge"),
    # https://github.com/haotian-liu/LLaVA/issues/1474
    ("Pre-training went well but fine-tuning it further gives garbled/random outputs.", "diverge"),
    # https://github.com/layer6ai-labs/T-Fixup/issues/3
    ("Gradient exploding when training deep models with FP16.", "diverge"),
    # https://github.com/EleutherAI/gpt-neox/issues/947
    ("When llama uses bf16 training, there is an abnormal loss.", "diverge"),
]


@pytest.mark.parametrize("text", [
    "DDP on 8 GPUs is much faster than one GPU.",
    "The loss decreases while accuracy increases.",
    "The loss scale increases every 2000 steps.",
    "mAP is 0.45 after 20 epochs.",
    "We raise the learning rate after the warmup.",
    # https://github.com/deepinsight/insightface/issues/663: "raise" here is a number going up
    "When I use 1 GPU to train the same one, the speed raise to 110 samples/sec.",
    "CPU utilization is low.",
    "It is not slower than on one GPU.",
    "The loss does not increase at all.",
    "There is no error when saving.",
])
def test_near_misses_give_no_state(text: str) -> None:
    assert _states(text) == [], (text, _states(text))


def test_a_question_after_a_lowercase_sentence_end_only_asks_its_own_clause() -> None:
    """The splitter keeps "... when I want to test. do you know why?" as one sentence (the second
    starts lowercase); its question mark asks "do you know why", not the report before it."""
    found = [p for p in read.phrases("the process was killed when I want to test. do you know why?")
             if p.fact == "states"]
    assert found and all(p.asserted for p in found)


def test_a_working_job_said_in_other_words_is_healthy() -> None:
    # https://github.com/alibaba/Pai-Megatron-Patch/issues/543
    found = read.phrases("Training is normal, but there is lots of unexpected nccl warnings.")
    assert [p.value for p in found if p.fact == "healthy" and p.asserted] == ["fine"]
    assert not _states("Training is normal, but there is lots of unexpected nccl warnings.")


@pytest.mark.parametrize("text,fact,value", [
    # https://github.com/huggingface/pytorch-image-models/issues/1269
    ("After couple of epochs, it randomly crashes with the following error.", "when", "epoch_end"),
    # https://github.com/zhyang2226/OPA-DPO/issues/9
    ("After saving several checkpoints, it would raise the bug in the picture.", "when", "checkpoint"),
    # https://github.com/huggingface/accelerate/issues/2960
    ("Error when saving ckpt on slurm", "when", "checkpoint"),
    # https://github.com/huggingface/accelerate/issues/1473
    ("On one GPU it runs fine, But in Multi GPU issue occurs.", "where", "single_gpu_works"),
    # https://github.com/uber-research/UPSNet/issues/63
    ("When there is only one GPU, the code works perfect, but when the number of GPU>1, it will get stuck.",
     "where", "single_gpu_works"),
])
def test_when_and_where_in_other_words(text: str, fact: str, value: str) -> None:
    got = [p.value for p in read.phrases(text) if p.fact == fact and p.asserted]
    assert value in got, (text, got)
    assert "one_rank" not in [p.value for p in read.phrases(text) if p.fact == "where"]


#: short wordings of the same states
SHORT_STATES = [
    ("The speed doesn't scale with more GPUs.", "slow"),
    ("Training on 4 GPUs takes as long as on 1 GPU.", "slow"),
    ("The GPU is idle most of the time.", "slow"),
    ("Inference latency is very high.", "slow"),
    ("CPU at 100% while training.", "slow"),
    ("GPU utilization fluctuates a lot.", "slow"),
    ("The job exits with code -9.", "crash"),
    ("The worker process exited unexpectedly.", "crash"),
    ("The script breaks after the first epoch.", "crash"),
    ("mAP 0", "diverge"),
    ("The model predicts the same class for every input.", "diverge"),
    ("Training is unstable after the warmup.", "diverge"),
    ("It keeps waiting.", "hang"),
    ("The progress bar doesn't move.", "hang"),
    ("The process never exits.", "hang"),
    ("It waits at dist.barrier() forever.", "hang"),
]


@pytest.mark.parametrize("text,state", QUOTED_STATES + SHORT_STATES)
def test_roundabout_wording_gives_the_state(text: str, state: str) -> None:
    assert _states(text)[:1] == [state], (text, _states(text))


@pytest.mark.parametrize("text", [
    "GPU usage is 100%.",
    "Thanks for your response.",
    "The learning rate does not scale with batch size.",
    "The progress bar moves fast.",
    "Please add bf16 support.",
])
def test_short_near_misses_give_no_state(text: str) -> None:
    assert _states(text) == [], (text, _states(text))
