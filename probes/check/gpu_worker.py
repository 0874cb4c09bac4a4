"""Matmul and memory-bandwidth measurement on one GPU, run by ``doctor.probes.check.gpu`` as a
plain script (``python gpu_worker.py INDEX quick|full``); imports torch, prints one JSON line.

Matmul follows the MAMF idea (maximum achievable matmul FLOPS): the peak on a spec sheet is not
reachable, and which shapes come closest depends on the GPU and the library, so search a set of
shapes and report the best, per dtype. Data are random normal (zeros draw less power and run
faster than real data). Each shape: warm-ups, then timed products between CUDA events.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from typing import Any


def _time(fn: Any, iters: int, torch: Any) -> float:
    """Mean seconds of ``fn`` over ``iters`` runs, after two warm-ups, from CUDA events."""
    for _ in range(2):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000.0 / iters


def matmul(torch: Any, dtype: str, dims: list[int], iters: int, budget_s: float) -> dict[str, Any]:
    dev = torch.device("cuda")
    best: dict[str, Any] = {"tflops": 0.0, "shape": None, "tried": 0}
    t_end = time.perf_counter() + budget_s
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    for m, n, k in itertools.product(dims, dims, dims):
        if time.perf_counter() > t_end:
            best["note"] = "search cut short by its time budget"
            break
        if dtype == "fp8":
            a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
            b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
            one = torch.tensor(1.0, device=dev)

            def fn(a: Any = a, b: Any = b, one: Any = one) -> Any:
                return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        else:
            dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32}[dtype]
            a = torch.randn(m, k, device=dev, dtype=dt)
            b = torch.randn(k, n, device=dev, dtype=dt)

            def fn(a: Any = a, b: Any = b) -> Any:
                return a @ b
        t = _time(fn, iters, torch)
        tflops = 2.0 * m * n * k / t / 1e12
        best["tried"] += 1
        if tflops > best["tflops"]:
            best.update({"tflops": round(tflops, 1), "shape": [m, n, k]})
        del a, b
    return best


def membw(torch: Any, nbytes: int, iters: int) -> dict[str, Any]:
    """Device-to-device copy; bytes moved count the read and the write."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").normal_()
    dst = torch.empty_like(src)
    t = _time(lambda: dst.copy_(src), iters, torch)
    return {"Bps": round(2 * nbytes / t), "bytes": nbytes}


def main(argv: list[str]) -> int:
    import torch

    index, mode = int(argv[0]), argv[1]
    torch.cuda.set_device(index)
    props = torch.cuda.get_device_properties(index)
    quick = mode == "quick"
    dims = [4096, 6144, 8192] if quick else list(range(2048, 16385, 2048))
    iters = 10 if quick else 30
    out: dict[str, Any] = {"index": index, "name": props.name, "cc": f"{props.major}.{props.minor}",
                           "torch": torch.__version__, "matmul": {}, "errors": {}}
    dtypes = ["bf16", "fp16", "tf32"] + (["fp8"] if (props.major, props.minor) >= (8, 9) else [])
    for dtype in dtypes:
        try:
            out["matmul"][dtype] = matmul(torch, dtype, dims, iters, 6.0 if quick else 90.0)
        except Exception as exc:  # one dtype the build cannot do must not hide the others
            out["errors"][dtype] = f"{type(exc).__name__}: {str(exc)[:200]}"
        torch.cuda.empty_cache()
    try:
        out["membw"] = membw(torch, (2 if quick else 8) * 1024 ** 3, 10 if quick else 50)
    except Exception as exc:
        out["errors"]["membw"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
