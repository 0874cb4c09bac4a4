"""Published peak figures of the GPU models the checks compare against.

NVIDIA's spec sheets give tensor-core throughput *with 2:4 sparsity*; a dense matmul can reach at
most half of it, so the table keeps the dense figure (sheet value / 2). Memory bandwidth is the
sheet's HBM figure. A model missing here is compared with its peers only.
"""

from __future__ import annotations

from typing import Any

#: name fragment (as NVML reports it, lower case) -> dense TFLOPS per dtype, bandwidth, source.
#: Order matters: the first fragment found in the device name wins ("h200 nvl" before "h200").
SPECS: list[tuple[str, dict[str, Any]]] = [
    ("h200 nvl", {"model": "H200 NVL", "tflops": {"tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
                  "mem_Bps": 4.8e12, "source": "https://www.nvidia.com/en-us/data-center/h200/"}),
    ("h200", {"model": "H200 SXM", "tflops": {"tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0},
              "mem_Bps": 4.8e12, "source": "https://www.nvidia.com/en-us/data-center/h200/"}),
    ("h100 pcie", {"model": "H100 PCIe", "tflops": {"tf32": 378.0, "bf16": 756.5, "fp16": 756.5, "fp8": 1513.0},
                   "mem_Bps": 2.0e12, "source": "https://www.nvidia.com/en-us/data-center/h100/"}),
    ("h100", {"model": "H100 SXM", "tflops": {"tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0},
              "mem_Bps": 3.35e12, "source": "https://www.nvidia.com/en-us/data-center/h100/"}),
    ("a100", {"model": "A100 SXM 80GB", "tflops": {"tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
              "mem_Bps": 2.039e12, "source": "https://www.nvidia.com/en-us/data-center/a100/"}),
]

#: A best-of-search matmul below this share of the dense peak is a finding. MAMF on healthy
#: Hopper parts lands near 75-80 % of it for bf16 (the ml-engineering book's table), so 60 %
#: leaves room for the quick search's coarse shapes and still catches a capped or sick GPU.
SPEC_MIN_SHARE = 0.60
#: A device-to-device copy reaches about 90 % of the HBM figure on a healthy H200 (4.3 of 4.8 TB/s).
MEM_MIN_SHARE = 0.70
#: A GPU this far below the median of the node's other GPUs of the same model is a finding.
PEER_MAX_GAP = 0.10


def lookup(name: str | None) -> dict[str, Any] | None:
    low = (name or "").lower()
    for frag, spec in SPECS:
        if frag in low:
            return spec
    return None
