"""Collectives reached through framework wrappers (accelerate, Lightning, torchmetrics, transformers,
Megatron, Horovod, DeepSpeed ZeRO, DCP, DTensor) are read as collectives with their op, Windows
paths match the library tables, and a Ctrl-C traceback behind torch's ``[rankN]:`` prefix is read
as a stack. Why: the deciding evidence between collective_mismatch and rank_outside_collective
is whether the odd ranks sit in a collective, and those frames were read as plain user code.
"""

from __future__ import annotations

import pytest
from doctor.probes.stacks import classify as ss


def _py(name: str, file: str, line: int = 1) -> tuple[str, str, int, bool]:
    return (name, file, line, False)


USER = _py("main", "train.py", 10)


@pytest.mark.parametrize(("name", "file", "op"), [
    ("Accelerator.wait_for_everyone", "accelerate/accelerator.py", "barrier"),
    ("PartialState._goes_first", "accelerate/state.py", "barrier"),
    ("gather.<locals>._gpu_gather_one", "accelerate/utils/operations.py", "all_gather"),
    ("Accelerator.gather_for_metrics", "accelerate/accelerator.py", "all_gather"),
    ("reduce.<locals>._reduce_across_processes", "accelerate/utils/operations.py", "all_reduce"),
    ("broadcast_object_list", "accelerate/utils/operations.py", "broadcast"),
    ("_sync_ddp", "lightning/fabric/utilities/distributed.py", "all_reduce"),
    ("DDPStrategy.barrier", "lightning/pytorch/strategies/ddp.py", "barrier"),
    ("DDPStrategy.broadcast", "pytorch_lightning/strategies/ddp.py", "broadcast"),
    ("gather_all_tensors", "torchmetrics/utilities/distributed.py", "all_gather"),
    ("distributed_concat", "transformers/trainer_pt_utils.py", "all_gather"),
    ("Trainer._nested_gather", "transformers/trainer.py", "all_gather"),
    ("TrainingArguments.main_process_first", "transformers/training_args.py", "barrier"),
    ("_reduce", "megatron/core/tensor_parallel/mappings.py", "all_reduce"),
    ("Timers._get_elapsed_time_all_ranks", "megatron/core/timers.py", "all_gather"),
    ("allreduce", "horovod/torch/mpi_ops.py", "all_reduce"),
    ("broadcast_parameters", "horovod/torch/functions.py", "broadcast"),
    ("join", "horovod/torch/mpi_ops.py", "barrier"),
    ("AllGatherCoalescedHandle.wait", "deepspeed/runtime/zero/partition_parameters.py", "all_gather"),
    ("reduce_scatter_coalesced", "deepspeed/runtime/comm/coalesced_collectives.py", "reduce_scatter"),
    ("_DistWrapper.gather_object", "torch/distributed/checkpoint/utils.py", "gather"),
    ("_DistWrapper.broadcast_object", "torch/distributed/checkpoint/utils.py", "broadcast"),
    ("mesh_broadcast", "torch/distributed/tensor/_collective_utils.py", "broadcast"),
])
def test_wrapper_frame_is_a_collective(name: str, file: str, op: str) -> None:
    v = ss.classify([_py(name, file), USER], active=False)
    assert (v.state, v.op) == ("collective", op)


def test_torch_frame_further_in_still_decides() -> None:
    """A full stack reaches torch's own collective: that frame (innermost) names the op."""
    frames = [_py("barrier", "torch/distributed/distributed_c10d.py"),
              _py("wrapper", "torch/distributed/c10d_logger.py"),
              _py("Accelerator.gather", "accelerate/accelerator.py"), USER]
    assert ss.classify(frames, active=False).op == "barrier"


def test_horovod_wait_takes_the_op_of_its_caller() -> None:
    frames = [_py("synchronize", "horovod/torch/mpi_ops.py"), _py("allgather", "horovod/torch/mpi_ops.py"), USER]
    assert (ss.classify(frames, active=False).state, ss.classify(frames, active=False).op) == ("collective", "all_gather")


@pytest.mark.parametrize(("name", "file"), [
    ("gather_output", "accelerate/utils/operations.py"),     # not a collective name
    ("evaluate", "train.py"),                                 # user code
    ("_DistWrapper.reduce_scatter", "torch/distributed/checkpoint/utils.py"),  # runs planner code too
    ("wait", "mylib/queue.py"),                               # a generic wait stays generic
])
def test_non_collective_frames_stay_outside(name: str, file: str) -> None:
    assert ss.classify([_py(name, file), USER], active=True).state != "collective"


def test_windows_paths_match_the_tables() -> None:
    f = r"C:\Users\me\miniconda3\envs\t\lib\site-packages\torch\distributed\distributed_c10d.py"
    assert ss.norm_file(f) == "torch/distributed/distributed_c10d.py"
    assert ss.classify([_py("all_reduce", f), _py("main", r"C:\proj\train.py")], active=False).op == "all_reduce"
    assert ss.is_library(r"C:\Python311\Lib\threading.py")
    assert not ss.is_library(r"C:\proj\train.py")
