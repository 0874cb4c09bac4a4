"""Where a thread is, from its stack: the frame-pattern tables and the classifier.

A hung rank is diagnosed by *what its main thread waits for*: peers in a collective, a batch from
its DataLoader workers, a file write, the GPU, a lock another of its threads holds. The tables
below map frames to those states. They are data (one entry per pattern, with the reason it means
what it says), not code, so a new library or a new torch version is a new line, not a new branch.

Frames come innermost first (py-spy, faulthandler and gdb all print them that way) as tuples
``(name, file, line, native)``. The classifier looks at the whole stack, not only the top frame,
because the top is often a generic wait (``Condition.wait``, ``poll``, a futex) and the frame that
says *why* the thread waits is further out (``_try_get_data`` of the DataLoader, ``all_reduce``):

1. tier 1 (specific) patterns: the innermost match decides, unless it lists states it
   ``yields`` to and a frame further out matches one of them (a CUDA event wait inside an NCCL
   collective is the collective, not a stuck GPU);
2. tier 3 (generic) patterns, used only when no tier-1 pattern matched: the innermost decides
   (``Condition.wait`` called from user code is a lock wait);
3. nothing matched: ``python`` when the thread was running (or its activity is unknown),
   ``unknown`` when it was idle inside a call the Python frames do not show (sleep, a lock, a
   socket: native frames tell), ``idle`` when it has no frames at all.

Imported by the stacks probe; no torch, no pandas.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

#: The states a thread can be in, and what each means (documented in the facts schema too).
STATES: dict[str, str] = {
    "collective": "waiting in a torch.distributed collective or point-to-point op (or its Work.wait)",
    "init": "in process-group setup: init_process_group, rendezvous, TCPStore, new_group, first communicator",
    "dataloader_wait": "waiting for the next batch from DataLoader workers (worker result queue), or starting/stopping them",
    "dataloader_fetch": "running the dataset code itself (num_workers=0, or inside a DataLoader worker)",
    "io": "in file or network I/O: torch.save/load, safetensors, checkpoint writers, shutil, sockets, HTTP",
    "cuda_sync": "waiting for the GPU: synchronize, a device-to-host copy (.item(), .cpu()), CUDA init",
    "lock_wait": "waiting on a lock, condition, event, queue or future of its own process, or for the GIL",
    "ipc_wait": "waiting on a child process, a pipe or a multiprocessing queue/pool outside the DataLoader",
    "gc": "inside Python's garbage collector",
    "sleeping": "in time.sleep (native frames only) or asyncio.sleep",
    "python": "running Python code the tables do not know (user code, model code)",
    "unknown": "idle inside a call the Python frames do not explain (native frames would)",
    "idle": "no frames at all",
}

# Collective function names (torch.distributed, functional collectives, DeepSpeed comm) and the
# op type they perform: ranks in different *types* at once cannot all finish (a mismatch).
COLLECTIVE_OPS: dict[str, str] = {
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce", "all_reduce_multigpu": "all_reduce",
    "inference_all_reduce": "all_reduce", "all_reduce_inplace": "all_reduce",
    "all_gather": "all_gather", "all_gather_into_tensor": "all_gather", "_all_gather_base": "all_gather",
    "all_gather_object": "all_gather", "all_gather_coalesced": "all_gather", "all_gather_multigpu": "all_gather",
    "all_gather_tensor": "all_gather", "all_gather_tensor_autograd": "all_gather", "allgather_fn": "all_gather",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter", "reduce_scatter_multigpu": "reduce_scatter",
    "reduce_scatter_tensor_autograd": "reduce_scatter", "reduce_scatter_fn": "reduce_scatter",
    "broadcast": "broadcast", "broadcast_object_list": "broadcast", "broadcast_multigpu": "broadcast",
    "reduce": "reduce", "reduce_multigpu": "reduce",
    "gather": "gather", "gather_object": "gather", "scatter": "scatter", "scatter_object_list": "scatter",
    "all_to_all": "all_to_all", "all_to_all_single": "all_to_all", "all_to_all_single_autograd": "all_to_all",
    "barrier": "barrier", "monitored_barrier": "barrier",
    "send": "send", "isend": "send", "send_object_list": "send",
    "recv": "recv", "irecv": "recv", "recv_object_list": "recv",
    "batch_isend_irecv": "send_recv",
    "wait_tensor": "wait", "_wait_all": "wait",
    "destroy_process_group": "destroy_process_group",
}
#: Point-to-point ops: ranks in send and recv at once are a normal pipeline, not a mismatch.
P2P_OPS = frozenset({"send", "recv", "send_recv"})
#: Ops whose type is unknown from the stack (a bare wait on a Work/tensor).
VAGUE_OPS = frozenset({"wait", "destroy_process_group"})

# Op types read from native symbols (NCCL and gloo entry points, c10d work objects).
_NATIVE_OPS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"all_?reduce", re.I), "all_reduce"),
    (re.compile(r"reduce_?scatter", re.I), "reduce_scatter"),
    (re.compile(r"all_?gather", re.I), "all_gather"),
    (re.compile(r"broadcast|bcast", re.I), "broadcast"),
    (re.compile(r"all_?to_?all", re.I), "all_to_all"),
    (re.compile(r"barrier", re.I), "barrier"),
    (re.compile(r"ncclSend|::send\b", re.I), "send"),
    (re.compile(r"ncclRecv|::recv\b", re.I), "recv"),
]

_C10D = r"(?:^|/)torch/distributed/distributed_c10d\.py$"
_COLL_NAMES = "|".join(sorted((re.escape(k) for k in COLLECTIVE_OPS), key=len, reverse=True))

# One entry per pattern. Keys: state, op ("{func}" = from COLLECTIVE_OPS by function name,
# "{native}" = from the native symbol), tier (1 specific, 3 generic), func / file (regexes searched
# in the frame's function name / file), native (True: only native frames, False: only Python
# frames, absent: both), yields (states of an outer tier-1 match that win over this one), why.
PATTERNS: list[dict[str, Any]] = [
    # --- GIL: a thread that finished a C call and waits to re-take the GIL is blocked by the
    # thread holding it, whatever the call was; innermost tier-1 match, so it beats the call.
    {"state": "lock_wait", "op": "gil", "tier": 1, "native": True,
     "func": r"^(take_gil|PyEval_RestoreThread|PyEval_AcquireThread|PyEval_AcquireLock|PyGILState_Ensure|_PyEval_ReInitThreads)$",
     "why": "CPython's GIL acquisition: the thread is runnable but another thread holds the GIL"},
    # --- garbage collection
    {"state": "gc", "op": "gc", "tier": 1, "native": True,
     "func": r"^(gc_collect_main|collect_with_callback|gc_collect_impl|_PyGC_Collect|gc_collect_generations|_Py_RunGC|gc_collect_region|gc_collect_full|gc_collect_young|_PyGC_CollectNoFail)$",
     "why": "CPython's cyclic GC entry points (libpython); a long pause here stalls every rank waiting on this one"},
    {"state": "gc", "op": "gc", "tier": 1, "func": r"^Garbage-collecting$",
     "why": "faulthandler prints this pseudo-frame while the GC runs"},
    # --- init: process-group setup and rendezvous (taxonomy init_hang)
    {"state": "init", "op": "init_process_group", "tier": 1, "native": False, "file": _C10D,
     "func": r"(^|\.)(init_process_group|_new_process_group_helper|new_group|new_subgroups|new_subgroups_by_enumeration|_store_based_barrier|_create_process_group_wrapper|split_group|_get_default_group|_init_process_groups)$",
     "why": "distributed_c10d setup functions: they block until every rank of the group has joined the store"},
    {"state": "init", "op": "rendezvous", "tier": 1, "native": False,
     "file": r"(^|/)torch/distributed/(rendezvous\.py|elastic/rendezvous/|elastic/utils/store\.py)",
     "why": "torch.distributed rendezvous handlers and store barriers (env://, tcp://, c10d/etcd rendezvous)"},
    {"state": "init", "op": "device_mesh", "tier": 1, "native": False,
     "file": r"(^|/)torch/distributed/device_mesh\.py$", "func": r"(^|\.)(init_device_mesh|_init_process_groups|__init__|_get_or_create_default_group)$",
     "why": "DeviceMesh creation builds its process groups (new_group on every rank)"},
    {"state": "init", "op": "init_process_group", "tier": 1, "native": False,
     "file": r"(^|/)deepspeed/comm/comm\.py$", "func": r"(^|\.)(init_distributed|init_deepspeed_backend)$",
     "why": "deepspeed.init_distributed wraps init_process_group"},
    {"state": "init", "op": "store", "tier": 1, "native": True,
     "func": r"c10d::(TCPStore|detail::TCPClient|detail::TCPServer|PrefixStore|Store)\b.*::(TCPStore|get|wait|doWait|doGet|connect|check|add|compareSet|multiGet|barrier)|c10d::TCPStore::TCPStore",
     "why": "the c10d TCPStore client (rendezvous, store-based barriers, NCCL unique-id exchange)"},
    {"state": "init", "op": "communicator_init", "tier": 1, "native": True,
     "func": r"ncclCommInitRank|ncclCommInitAll|ncclCommSplit|ncclCommInitRankConfig|c10d::ProcessGroupNCCL::(getNCCLComm|initNCCLComm)|c10d::ProcessGroupGloo::ProcessGroupGloo|gloo::rendezvous::|gloo::transport::tcp::Pair::connect|gloo::transport::tcp::Context::createPair|gloo::rendezvous::Context::connectFullMesh",
     "why": "communicator setup (NCCL comm init, gloo full-mesh connect): the first collective or new_group waits for all peers here"},
    # --- collectives (taxonomy collective_mismatch, rank_outside_collective)
    {"state": "collective", "op": "{func}", "tier": 1, "native": False, "file": _C10D,
     "func": rf"(^|\.)({_COLL_NAMES})$",
     "why": "the torch.distributed collective and p2p API; a thread here waits for its peers (or its Work)"},
    {"state": "collective", "op": "{func}", "tier": 1, "native": False,
     "file": r"(^|/)torch/distributed/(_functional_collectives(_impl)?\.py|_symmetric_memory/)",
     "func": rf"(^|\.)({_COLL_NAMES})$",
     "why": "functional collectives (torch.compile / DTensor / FSDP2 paths); wait_tensor waits for an issued collective"},
    {"state": "collective", "op": "{func}", "tier": 1, "native": False,
     "file": r"(^|/)deepspeed/comm/(comm|torch|ccl)\.py$", "func": rf"(^|\.)({_COLL_NAMES})$",
     "why": "DeepSpeed's comm layer forwards to torch.distributed"},
    {"state": "collective", "op": "broadcast", "tier": 1, "native": False,
     "file": r"(^|/)torch/nn/parallel/distributed\.py$",
     "func": r"(^|\.)(_sync_buffers|_sync_module_buffers|_distributed_broadcast_coalesced|_sync_params_and_buffers|_default_broadcast_coalesced)$",
     "why": "DDP broadcasts buffers from rank 0 at every forward (broadcast_buffers=True) and parameters at construction"},
    {"state": "collective", "op": "all_reduce", "tier": 1, "native": False,
     "file": r"(^|/)torch/nn/parallel/distributed\.py$",
     "func": r"(^|\.)(_match_all_reduce_for_bwd_pass|_match_unused_params_allreduce|_check_global_requires_backward_grad_sync|_check_and_sync_module_buffers)$",
     "why": "DDP's join/uneven-input and sync-check all_reduces"},
    {"state": "collective", "op": "all_gather", "tier": 1, "native": False,
     "file": r"(^|/)torch/nn/parallel/distributed\.py$", "func": r"(^|\.)_verify_param_shape_across_processes$",
     "why": "DDP construction checks parameter shapes across ranks with a collective"},
    {"state": "collective", "op": "all_gather", "tier": 1, "native": False,
     "file": r"(^|/)torch/distributed/(fsdp|_composable/fsdp)/", "func": r"(all_gather|unshard)",
     "why": "FSDP unshard: all_gather of the flat parameters before forward/backward"},
    {"state": "collective", "op": "reduce_scatter", "tier": 1, "native": False,
     "file": r"(^|/)torch/distributed/(fsdp|_composable/fsdp)/", "func": r"(reduce_scatter|foreach_reduce|_post_backward|_reduce_grad)",
     "why": "FSDP gradient reduce_scatter after backward"},
    {"state": "collective", "op": "send_recv", "tier": 1, "native": False,
     "file": r"(^|/)(torch/distributed/pipelining/|megatron/core/pipeline_parallel/p2p_communication\.py|deepspeed/runtime/pipe/p2p\.py)",
     "func": r"(p2p|send|recv|_wait)",
     "why": "pipeline-parallel point-to-point exchange between stages"},
    {"state": "collective", "op": "{native}", "tier": 1, "native": True, "yields": ["collective"],
     "func": r"c10d::(Work|ProcessGroup\w*(::\w+)*::(WorkNCCL|AsyncWork|\w*Work\w*))::(wait|synchronize|synchronizeStream)|c10d::Reducer::|c10d::ProcessGroup\w*::(allreduce|allgather|reduce_scatter|_reduce_scatter_base|_allgather_base|broadcast|barrier|alltoall|send|recv|gather|scatter)|gloo::(allreduce|allgather|broadcast|barrier|reduce|alltoall|gather|scatter)|gloo::transport::\w+::(UnboundBuffer|Pair)::(waitRecv|waitSend|recv|send)|\bnccl(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|Send|Recv|GroupEnd)\b",
     "why": "c10d Work objects, the DDP reducer, gloo algorithms and NCCL entry points: the native side of a collective (the Python frame further out, when there, names the op)"},
    # --- DataLoader (taxonomy rank_stuck_in_dataloader, dataloader_worker_deadlock)
    {"state": "dataloader_fetch", "op": "dataset", "tier": 1, "native": False,
     "file": r"(^|/)torch/utils/data/_utils/fetch\.py$",
     "why": "the fetcher calls the dataset's __getitem__/__iter__: dataset code runs here (main thread when num_workers=0)"},
    {"state": "dataloader_fetch", "op": "single_process", "tier": 1, "native": False,
     "file": r"(^|/)torch/utils/data/dataloader\.py$", "func": r"_SingleProcessDataLoaderIter\._next_data$",
     "why": "num_workers=0: the main thread loads the batch itself"},
    {"state": "dataloader_fetch", "op": "pin_memory", "tier": 1, "native": False,
     "file": r"(^|/)torch/utils/data/_utils/pin_memory\.py$", "func": r"(^|\.)pin_memory$",
     "why": "copying a batch into page-locked memory"},
    {"state": "dataloader_wait", "op": "worker_queue", "tier": 1, "native": False,
     "file": r"(^|/)torch/utils/data/dataloader\.py$",
     "func": r"(^|\.)(_try_get_data|_get_data)$|_MultiProcessingDataLoaderIter\.(_next_data|__next__)$",
     "why": "the main thread waits on the workers' result queue for the next batch"},
    {"state": "dataloader_wait", "op": "start_workers", "tier": 1, "native": False,
     "file": r"(^|/)torch/utils/data/dataloader\.py$",
     "func": r"_MultiProcessingDataLoaderIter\.(__init__|_reset)$|(^|\.)(_get_iterator|__iter__)$",
     "why": "creating the iterator forks/spawns the workers (fork after threads can deadlock them)"},
    {"state": "dataloader_wait", "op": "shutdown_workers", "tier": 1, "native": False,
     "file": r"(^|/)torch/utils/data/dataloader\.py$", "func": r"(^|\.)(_shutdown_workers|__del__)$",
     "why": "joining the workers at the end of an epoch or on deletion"},
    {"state": "dataloader_wait", "op": "next", "tier": 1, "native": False,
     "file": r"(^|/)torch/utils/data/dataloader\.py$", "func": r"(^|\.)(_next_data|__next__)$",
     "why": "DataLoader __next__ without a class name (Python < 3.11); an inner fetch.py frame means single-process fetch"},
    {"state": "dataloader_wait", "op": "fetcher", "tier": 1, "native": False,
     "file": r"(^|/)(lightning/pytorch|pytorch_lightning)/loops/fetchers\.py$",
     "why": "Lightning's batch fetcher wraps the DataLoader iterator"},
    # --- I/O (taxonomy rank_stuck_in_io, checkpoint_stall)
    {"state": "io", "op": "torch.save", "tier": 1, "native": False, "file": r"(^|/)torch/serialization\.py$",
     "func": r"(^|\.)(save|_save|_legacy_save|_open_zipfile_writer|_open_file|__exit__|write_record)$",
     "why": "torch.save writes the checkpoint (blocks on a slow, full or hung filesystem)"},
    {"state": "io", "op": "torch.load", "tier": 1, "native": False, "file": r"(^|/)torch/serialization\.py$",
     "why": "torch.load reads a checkpoint"},
    {"state": "io", "op": "torch.save", "tier": 1, "native": True,
     "func": r"caffe2::serialize::PyTorchStreamWriter|caffe2::serialize::FileAdapter|PyTorchFileWriter",
     "why": "the native zip writer under torch.save"},
    {"state": "io", "op": "torch.load", "tier": 1, "native": True,
     "func": r"caffe2::serialize::PyTorchStreamReader",
     "why": "the native zip reader under torch.load"},
    {"state": "io", "op": "safetensors", "tier": 1, "native": False, "file": r"(^|/)safetensors/",
     "why": "safetensors save/load of checkpoint files"},
    {"state": "io", "op": "dcp", "tier": 1, "native": False,
     "file": r"(^|/)torch/distributed/checkpoint/(filesystem|_fsspec_filesystem|storage)\.py$",
     "why": "torch.distributed.checkpoint storage writer/reader (the collectives of DCP are matched first when inner)"},
    {"state": "io", "op": "shutil", "tier": 1, "native": False, "file": r"(^|/)shutil\.py$",
     "why": "file copies/moves/removals (checkpoint rotation, uploads to a mounted bucket)"},
    {"state": "io", "op": "numpy", "tier": 1, "native": False,
     "file": r"(^|/)numpy/lib/(_?npyio(_impl)?|format)\.py$", "why": "numpy np.save/np.load of arrays to and from files"},
    {"state": "io", "op": "h5py", "tier": 1, "native": False, "file": r"(^|/)h5py/", "why": "HDF5 file reads and writes through h5py"},
    {"state": "io", "op": "download", "tier": 1, "native": False,
     "file": r"(^|/)huggingface_hub/|(^|/)transformers/utils/hub\.py$", "why": "model/dataset downloads from the Hub"},
    {"state": "io", "op": "remote_storage", "tier": 1, "native": False,
     "file": r"(^|/)(fsspec|s3fs|gcsfs|adlfs|botocore|boto3|s3transfer|azure/storage|google/cloud/storage)/",
     "why": "object-storage clients (S3, GCS, Azure)"},
    {"state": "io", "op": "network", "tier": 1, "native": False,
     "file": r"(^|/)(requests/|urllib3/|http/client\.py$|socket\.py$|ssl\.py$|urllib/request\.py$)",
     "why": "HTTP and socket clients (metrics/logging services, remote storage)"},
    {"state": "io", "op": "tensorboard", "tier": 1, "native": False,
     "file": r"(^|/)(torch/utils/tensorboard|tensorboard/summary/writer|tensorboardX)/", "why": "TensorBoard event-file writers flushing to disk"},
    {"state": "lock_wait", "op": "logging_lock", "tier": 1, "native": False, "file": r"(^|/)logging/__init__\.py$",
     "func": r"(^|\.)(acquire|_acquireLock|_acquire_module_lock)$",
     "why": "a logging handler's lock (inherited locked through fork, or held by a thread blocked in emit)"},
    {"state": "io", "op": "logging", "tier": 1, "native": False, "file": r"(^|/)logging/__init__\.py$",
     "func": r"(^|\.)(emit|flush)$", "why": "a logging handler writing to a stream or file (a full pipe blocks it)"},
    # --- CUDA (taxonomy rank_stuck_in_cuda)
    {"state": "cuda_sync", "op": "synchronize", "tier": 1, "native": False,
     "file": r"(^|/)torch/cuda/(__init__|streams)\.py$", "func": r"(^|\.)synchronize$",
     "why": "torch.cuda.synchronize / Stream.synchronize / Event.synchronize block until the GPU is done"},
    {"state": "cuda_sync", "op": "cuda_init", "tier": 1, "native": False,
     "file": r"(^|/)torch/cuda/__init__\.py$", "func": r"(^|\.)(_lazy_init|init|set_device|device_count)$",
     "why": "CUDA context creation (a GPU that fell off the bus hangs or fails here)"},
    {"state": "cuda_sync", "op": "{cuda}", "tier": 1, "native": True, "yields": ["collective", "init"],
     "func": r"\b(cudaDeviceSynchronize|cudaStreamSynchronize|cudaEventSynchronize|cudaMemcpy(Async|2D|Peer)?|cuStreamSynchronize|cuEventSynchronize|cuCtxSynchronize|cuMemcpy\w*|cudaFree|cuMemFree\w*|cuInit|cudaMalloc|at::native::_local_scalar_dense\w*|at::native::copy_kernel_cuda|c10::cuda::(device_synchronize|stream_synchronize)|at::cuda::stream_synchronize)\b",
     "why": "CUDA runtime/driver calls that wait for the device: .item() (_local_scalar_dense), .cpu() (copy), synchronize, cudaFree; inside an NCCL wait they are the collective"},
    {"state": "cuda_sync", "op": "kernel_launch", "tier": 1, "native": True, "yields": ["collective", "init"],
     "func": r"^(cuLaunchKernel\w*|cudaLaunchKernel\w*|cuLaunchCooperativeKernel\w*|cudaLaunchCooperativeKernel\w*)$",
     "why": "a kernel launch that does not return: the device's queue is full behind work that never ends (seen on an H200 with a spinning kernel)"},
    {"state": "cuda_sync", "op": "driver", "tier": 1, "native": True, "yields": ["collective", "init", "cuda_sync"],
     "file": r"(^|/)libcuda\.so", "why": "an unnamed frame inside the CUDA driver (a named CUDA call further out names the op)"},
    # --- generic waits (tier 3: only when nothing specific matched)
    {"state": "lock_wait", "op": "{py}", "tier": 3, "native": False, "file": r"(^|/)threading\.py$",
     "func": r"(^|\.)(wait|acquire|join|_wait_for_tstate_lock|__enter__)$",
     "why": "threading Condition/Event/Semaphore/Barrier waits and Thread.join: waiting for another thread"},
    {"state": "lock_wait", "op": "queue", "tier": 3, "native": False, "file": r"(^|/)queue\.py$",
     "func": r"(^|\.)(get|put|join)$", "why": "queue.Queue get/put: waiting for a producer/consumer thread"},
    {"state": "lock_wait", "op": "future", "tier": 3, "native": False,
     "file": r"(^|/)concurrent/futures/(_base|thread)\.py$",
     "why": "waiting for a thread-pool future (result, wait, as_completed, shutdown)"},
    {"state": "lock_wait", "op": "multiprocessing_lock", "tier": 3, "native": False,
     "file": r"(^|/)multiprocessing/synchronize\.py$", "why": "a multiprocessing Lock/Semaphore/Event shared with other processes"},
    {"state": "ipc_wait", "op": "multiprocessing", "tier": 3, "native": False,
     "file": r"(^|/)multiprocessing/(connection|queues|pool|popen_\w+|process|managers)\.py$",
     "why": "multiprocessing pipes, queues, pools and child joins outside the DataLoader"},
    {"state": "ipc_wait", "op": "subprocess", "tier": 3, "native": False, "file": r"(^|/)subprocess\.py$",
     "why": "waiting for a child process (wait, communicate, run)"},
    {"state": "ipc_wait", "op": "select", "tier": 3, "native": False, "file": r"(^|/)selectors\.py$",
     "why": "a select/poll on file descriptors (pipes, sockets)"},
    {"state": "sleeping", "op": "asyncio.sleep", "tier": 3, "native": False, "file": r"(^|/)asyncio/tasks\.py$",
     "func": r"(^|\.)sleep$", "why": "asyncio.sleep in a coroutine the main thread runs"},
    {"state": "sleeping", "op": "sleep", "tier": 3, "native": True,
     "func": r"^(time_sleep|pysleep|clock_nanosleep|__GI___clock_nanosleep|__clock_nanosleep\w*|nanosleep|__nanosleep|usleep)$",
     "why": "time.sleep and libc sleeps"},
    {"state": "lock_wait", "op": "lock", "tier": 3, "native": True,
     "func": r"^(PyThread_acquire_lock_timed|PyThread_acquire_lock|acquire_timed|lock_PyThread_acquire_lock|rlock_acquire|_PySemaphore_Wait|PyMutex_Lock|_PyMutex_LockTimed|pthread_mutex_lock|___pthread_mutex_lock|__GI___pthread_mutex_lock|__pthread_mutex_lock\w*|lll_lock_wait\w*|__lll_lock_wait\w*|sem_wait|__new_sem_wait\w*|sem_timedwait|sem_clockwait|do_futex_wait|std::mutex::lock|std::__1::mutex::lock)\b",
     "why": "native mutex/semaphore waits, including threading.Lock.acquire (PyThread_acquire_lock)"},
    {"state": "lock_wait", "op": "atexit_lock", "tier": 3, "native": True,
     "func": r"^(__internal_atexit|__cxa_atexit|__GI___cxa_atexit)$",
     "why": "glibc's atexit registration takes __exit_funcs_lock; a child forked while another thread held it waits here forever (pytorch/pytorch#130610: a DataLoader worker in __cxa_atexit)"},
    {"state": "lock_wait", "op": "condvar", "tier": 3, "native": True,
     "func": r"^(pthread_cond_wait|pthread_cond_timedwait|pthread_cond_clockwait|___pthread_cond_\w+|__pthread_cond_wait\w*|std::condition_variable::wait\w*|std::condition_variable::__wait\w*|std::__1::condition_variable::wait)\b",
     "why": "a native condition-variable wait with no more specific caller in the stack"},
    {"state": "io", "op": "socket", "tier": 3, "native": True,
     "func": r"^(sock_recv\w*|sock_send\w*|sock_call\w*|sock_accept|sock_connect\w*|internal_connect|__libc_recv\w*|recv|recvfrom|recvmsg|__libc_send\w*|send|sendto|sendmsg|accept4?|__libc_connect|connect)$",
     "why": "blocking socket calls (metrics/HTTP clients, remote storage)"},
    {"state": "io", "op": "file", "tier": 3, "native": True,
     "func": r"^(__libc_write|__GI___libc_write|write|__write_nocancel|pwrite64|__libc_pwrite\w*|writev|fsync|fdatasync|__libc_fsync|sync_file_range|__libc_read|__GI___libc_read|pread64|__libc_pread\w*|__libc_open64|open64|__open64\w*|__GI___open64\w*|openat64|__openat64\w*|_io_FileIO_\w+|_io__Buffered\w+|_bufferedwriter_\w+|_io__IOBase_flush\w*)$",
     "why": "file reads/writes/opens/fsync in libc or Python's io module"},
    {"state": "ipc_wait", "op": "poll", "tier": 3, "native": True,
     "func": r"^(poll|__poll|__GI___poll|ppoll|__ppoll\w*|select|__select|epoll_wait|__GI_epoll_wait|epoll_pwait|select_poll_poll\w*|select_select\w*)$",
     "why": "waiting on file descriptors (pipes, sockets, worker queues) with no more specific caller"},
]

# Libraries and the standard library: the first frame outside them is the user's call site.
KNOWN_LIBS = frozenset({
    "torch", "torchvision", "torchaudio", "torchdata", "functorch", "triton", "deepspeed", "lightning",
    "pytorch_lightning", "lightning_fabric", "transformers", "accelerate", "datasets", "numpy",
    "safetensors", "apex", "fsspec", "s3fs", "gcsfs", "requests", "urllib3", "huggingface_hub",
    "webdataset", "tqdm", "wandb", "tensorboard", "tensorboardX", "botocore", "boto3", "s3transfer",
    "h5py", "PIL", "pandas", "pyarrow", "megatron", "transformer_engine", "flash_attn", "xformers",
    "peft", "trl", "optimum", "timm", "einops", "pybind11", "typing_extensions", "_pytest", "pluggy",
})
_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) | {"<frozen", "<string>"}
_LIB_PATH = re.compile(r"/(site|dist)-packages/|/lib/python\d\.\d+/|^<")


def is_library(file: str) -> bool:
    """True for frames of installed libraries and the standard library (not the user's code)."""
    if _LIB_PATH.search(file):
        return True
    head = file.split("/", 1)[0]
    return head.removesuffix(".py") in KNOWN_LIBS or head.removesuffix(".py") in _STDLIB


@dataclass(frozen=True)
class _Compiled:
    state: str
    op: str
    tier: int
    func: re.Pattern[str] | None
    file: re.Pattern[str] | None
    native: bool | None
    yields: frozenset[str]


_COMPILED: list[_Compiled] = [
    _Compiled(p["state"], p["op"], int(p["tier"]),
              re.compile(p["func"]) if p.get("func") else None,
              re.compile(p["file"]) if p.get("file") else None,
              p.get("native"), frozenset(p.get("yields", ())))
    for p in PATTERNS
]


# A generic wait (tier 3: a queue, a condition, a multiprocessing pipe) inside one of these
# frames is a wait for the input pipeline: a training loop pulling its next batch from a
# prefetching iterator that a background thread or process fills (fairseq's BufferedIterator,
# Megatron/NeMo prefetchers, webdataset and torchdata pipes, hand-written loaders). Matched by
# the iterator protocol in a data-named module, so it holds for code this table never saw.
WAIT_CONTEXTS: list[dict[str, Any]] = [
    {"state": "dataloader_wait", "op": "data_iterator", "native": False,
     "file": r"(^|/)(data|datasets?|dataloaders?|data_?loading|loaders?|pipelines?)/[^/]+\.py$"
             r"|(^|/)[^/]*(data_?loader|data_?iter\w*|iterators?|prefetch\w*|loader|batch\w*)\.py$",
     "func": r"(^|\.)(__next__|__iter__|_next_data|next_batch|get_batch|_get_batch|_next|prefetch\w*)$",
     "why": "a queue or condition wait under a data iterator's __next__: the loop waits for its next batch"},
]
_CONTEXTS = [(c["state"], c["op"], re.compile(c["file"]), re.compile(c["func"])) for c in WAIT_CONTEXTS]
_GENERIC_WAITS = frozenset({"lock_wait", "ipc_wait"})


@lru_cache(maxsize=16384)
def _wait_context(name: str, file: str, native: bool) -> tuple[str, str] | None:
    if native:
        return None
    for state, op, file_rx, func_rx in _CONTEXTS:
        if file_rx.search(file) and func_rx.search(name):
            return state, op
    return None


def _native_op(name: str) -> str:
    for rx, op in _NATIVE_OPS:
        if rx.search(name):
            return op
    return "wait"


def _op_for(pat: _Compiled, name: str) -> str:
    if pat.op == "{func}":
        return COLLECTIVE_OPS.get(name.rsplit(".", 1)[-1], "wait")
    if pat.op == "{native}":
        return _native_op(name)
    if pat.op == "{cuda}":
        m = pat.func.search(name) if pat.func else None
        return m.group(1) if m else "cuda"
    if pat.op == "{py}":
        return name.rsplit(".", 1)[-1] if "." in name else name
    return pat.op


@lru_cache(maxsize=65536)
def match_frame(name: str, file: str, native: bool) -> tuple[str, str, int, frozenset[str]] | None:
    """(state, op, tier, yields) of the first pattern matching this frame, or None (cached:
    the same frames recur across ranks, so a 16k-rank job costs one regex pass per distinct frame)."""
    for pat in _COMPILED:
        if pat.native is not None and pat.native != native:
            continue
        if pat.file is not None and not pat.file.search(file):
            continue
        if pat.func is not None and not pat.func.search(name):
            continue
        return pat.state, _op_for(pat, name), pat.tier, pat.yields
    return None


Frame = tuple  # (name: str, file: str, line: int, native: bool)


@dataclass
class Verdict:
    """The classification of one thread's stack."""

    state: str
    op: str = ""
    anchor: int = -1  # index of the frame that decided, -1 when none


def classify(frames: list[Frame] | tuple[Frame, ...], active: bool | None) -> Verdict:
    """Decide what a thread is doing from its frames (innermost first) and its activity."""
    first1 = -1
    hit1: tuple[str, str, int, frozenset[str]] | None = None
    first3 = -1
    hit3: tuple[str, str, int, frozenset[str]] | None = None
    for i, fr in enumerate(frames):
        m = match_frame(fr[0], fr[1], fr[3])
        if m is None:
            continue
        if m[2] == 1:
            # the first specific match decides, unless it yields to this outer one (which may in
            # turn yield further out: CUDA wait -> native Work.wait -> Python all_reduce)
            if hit1 is None or m[0] in hit1[3]:
                hit1, first1 = m, i
                if not m[3]:
                    break
        elif hit3 is None:
            hit3, first3 = m, i
    if hit1 is not None:
        return Verdict(hit1[0], hit1[1], first1)
    if hit3 is not None:
        if hit3[0] in _GENERIC_WAITS:
            for j in range(first3 + 1, len(frames)):
                ctx = _wait_context(frames[j][0], frames[j][1], frames[j][3])
                if ctx is not None:
                    return Verdict(ctx[0], ctx[1], j)
        return Verdict(hit3[0], hit3[1], first3)
    if not frames:
        return Verdict("idle")
    if active is False:
        return Verdict("unknown")
    return Verdict("python")


def fmt_frame(fr: Frame) -> str:
    """``func (file:line)`` as py-spy prints it; native frames without a line keep ``(lib)``."""
    name = fr[0] if len(fr[0]) <= 160 else fr[0][:157] + "..."
    return f"{name} ({fr[1]}:{fr[2]})" if fr[2] else f"{name} ({fr[1]})"


def call_site(frames: list[Frame] | tuple[Frame, ...], start: int = 0) -> str:
    """The innermost frame of the user's own code at or outside ``start``: where the user called
    into the library the thread waits in (two ranks in the same op from different lines are in
    different collectives)."""
    for fr in frames[max(start, 0):]:
        if not fr[3] and not is_library(fr[1]):
            return fmt_frame(fr)
    return ""


def role_of(frames: list[Frame] | tuple[Frame, ...]) -> str:
    """What kind of process a main-thread stack belongs to: rank, worker (DataLoader), launcher."""
    for fr in frames:
        if fr[3]:
            continue
        f = fr[1]
        if f.endswith("torch/utils/data/_utils/worker.py") and fr[0].endswith("_worker_loop"):
            return "worker"
        if "torch/distributed/elastic/agent/" in f or f.endswith("torch/distributed/run.py") \
                or f.endswith("torch/distributed/launcher/api.py"):
            return "launcher"
        if "torch/_inductor/compile_worker/" in f:
            return "helper"
    return "rank"


def worker_activity(frames: list[Frame] | tuple[Frame, ...], active: bool | None) -> str:
    """A DataLoader worker: ``waiting`` for indices or to hand over a batch (its loop's queue),
    ``busy`` running dataset code, or ``blocked`` idle inside dataset/user code (a lock inherited
    through fork, I/O, a dead peer) -- the deadlock signature."""
    for fr in frames:
        if fr[3]:
            continue
        if fr[0].endswith("_worker_loop"):
            return "waiting"
        if is_library(fr[1]) and not fr[1].endswith("fetch.py"):
            # stdlib/multiprocessing internals above the loop: a queue get/put
            continue
        break
    return "busy" if active else "blocked"


def pattern_docs() -> list[dict[str, str]]:
    """The pattern table for documentation (``mldoctor facts --schema`` readers, tests)."""
    return [{"state": p["state"], "op": p["op"], "tier": str(p.get("tier", "3+")), "func": p.get("func", ""),
             "file": p.get("file", ""), "why": p["why"]} for p in PATTERNS + WAIT_CONTEXTS]


# ---------------------------------------------------------------------------------------------
# Phases of a running thread (used by the sampling profile, probes/timeshare.py).
#
# ``classify`` answers "what does this thread wait for". A sampling profile also needs "which
# part of the step is it running": a thread that ``classify`` calls ``python`` (running code the
# wait tables do not know) is in forward, backward, the optimizer step, torch.compile's compiler,
# or a logger. These patterns are kept apart from PATTERNS so the hang classifier's states do not
# change. Same keys as PATTERNS (tier unused). ``phase_of`` picks, in order: compile anywhere in
# the stack (a lazily compiled backward is compile time, not backward), logging anywhere, then the
# OUTERMOST of optimizer / backward / forward (a forward re-run inside backward for activation
# checkpointing is backward time; a module called by the optimizer is optimizer time).
PHASES: list[dict[str, Any]] = [
    {"state": "compile", "op": "dynamo", "native": False,
     "file": r"(^|/)torch/_dynamo/(convert_frame|symbolic_convert|output_graph|bytecode_transformation|variables/)",
     "why": "Dynamo converting a frame: bytecode tracing, guard building (every recompile runs here)"},
    {"state": "compile", "op": "aot_autograd", "native": False,
     "file": r"(^|/)torch/_functorch/(aot_autograd\.py|_aot_autograd/(jit_compile_runtime_wrappers|collect_metadata_analysis|graph_capture|graph_compile|autograd_cache|dispatch_and_compile_graph))",
     "why": "AOTAutograd tracing the joint forward/backward graph"},
    {"state": "compile", "op": "aot_autograd", "native": False,
     "file": r"(^|/)torch/_functorch/_aot_autograd/runtime_wrappers\.py$", "func": r"(^|\.)get_or_compile$",
     "why": "the backward graph compiled lazily at the first backward call"},
    {"state": "compile", "op": "inductor", "native": False,
     "file": r"(^|/)torch/_inductor/(compile_fx|graph|scheduler|lowering|ir|codegen/|codecache|async_compile|select_algorithm|autotune_process|fx_passes/|compile_worker/|cpp_builder)",
     "why": "Inductor lowering, code generation, C++/Triton compilation and autotuning"},
    {"state": "compile", "op": "triton", "native": False,
     "file": r"(^|/)triton/(compiler/|runtime/(jit|autotuner|build)\.py$)", "func": r"(compile|_do_compile|run|_bench|autotune|build)",
     "why": "Triton JIT compilation and autotuning (recompiled per new shape or constant)"},
    {"state": "logging", "op": "logging", "native": False, "file": r"(^|/)logging/__init__\.py$",
     "why": "the logging module formatting and emitting records"},
    {"state": "logging", "op": "tracker", "native": False,
     "file": r"(^|/)(wandb|mlflow|comet_ml|neptune|clearml|aim|swanlab|tensorboard|tensorboardX|torch/utils/tensorboard)/",
     "why": "experiment trackers and TensorBoard writers"},
    {"state": "logging", "op": "progress_bar", "native": False, "file": r"(^|/)(tqdm|rich)/",
     "why": "progress bars and console rendering"},
    {"state": "optimizer", "op": "optimizer", "native": False,
     "file": r"(^|/)(torch/optim/|torch/distributed/optim/|apex/optimizers/|bitsandbytes/optim/|deepspeed/runtime/(fp16|bf16_optimizer|zero/stage_1_and_2|zero/stage3)|transformers/optimization\.py$|torchao/optim/)",
     "why": "optimizer steps (and their lr schedulers), including mixed-precision and ZeRO optimizers"},
    {"state": "optimizer", "op": "clip_grad", "native": False, "file": r"(^|/)torch/nn/utils/clip_grad\.py$",
     "why": "gradient clipping, part of the update"},
    {"state": "backward", "op": "autograd", "native": False, "file": r"(^|/)torch/(_tensor|autograd/__init__)\.py$",
     "func": r"(^|\.)(backward|grad)$", "why": "Tensor.backward / torch.autograd.backward|grad"},
    {"state": "backward", "op": "autograd", "native": False, "file": r"(^|/)torch/autograd/graph\.py$",
     "func": r"(^|\.)_engine_run_backward$", "why": "the autograd engine running the backward graph"},
    {"state": "backward", "op": "engine", "native": False,
     "file": r"(^|/)(deepspeed/runtime/engine\.py|accelerate/accelerator\.py|lightning/pytorch/core/module\.py|pytorch_lightning/core/module\.py)$",
     "func": r"(^|\.)(backward|manual_backward)$", "why": "training frameworks' backward wrappers"},
    {"state": "backward", "op": "autograd", "native": True, "func": r"torch::autograd::Engine::(execute|thread_main|evaluate_function)",
     "why": "the native autograd engine"},
    {"state": "forward", "op": "module", "native": False, "file": r"(^|/)torch/nn/modules/module\.py$",
     "func": r"(^|\.)(_call_impl|_wrapped_call_impl|__call__)$", "why": "an nn.Module call (model forward)"},
    {"state": "forward", "op": "compiled", "native": False, "file": r"(^|/)torch/_inductor/output_code\.py$",
     "why": "running an Inductor-compiled graph"},
    {"state": "forward", "op": "compiled", "native": False, "file": r"(^|/)torch/_dynamo/eval_frame\.py$",
     "func": r"(compile_wrapper|OptimizedModule\.|_TorchDynamoContext\.)",
     "why": "calling a torch.compile'd module or function (not DisableContext, which wraps optimizer and hook code)"},
]

_PHASES_C: list[_Compiled] = [
    _Compiled(p["state"], p["op"], 0, re.compile(p["func"]) if p.get("func") else None,
              re.compile(p["file"]) if p.get("file") else None, p.get("native"), frozenset())
    for p in PHASES
]
_OUTER_PHASES = ("optimizer", "backward", "forward")


@lru_cache(maxsize=65536)
def match_phase(name: str, file: str, native: bool) -> tuple[str, str] | None:
    """(phase, op) of the first PHASES entry matching this frame, or None (cached)."""
    for pat in _PHASES_C:
        if pat.native is not None and pat.native != native:
            continue
        if pat.file is not None and not pat.file.search(file):
            continue
        if pat.func is not None and not pat.func.search(name):
            continue
        return pat.state, pat.op
    return None


def phase_of(frames: list[Frame] | tuple[Frame, ...]) -> tuple[str, str]:
    """The phase of a running stack (innermost first): compile | logging | optimizer | backward |
    forward, with the op that decided; ``("", "")`` when no phase pattern matches."""
    outer: tuple[str, str] | None = None
    logging_hit: tuple[str, str] | None = None
    for fr in frames:
        m = match_phase(fr[0], fr[1], fr[3])
        if m is None:
            continue
        if m[0] == "compile":
            return m
        if m[0] == "logging":
            logging_hit = logging_hit or m
        elif m[0] in _OUTER_PHASES:
            outer = m  # keep going: the outermost wins
    return logging_hit or outer or ("", "")
