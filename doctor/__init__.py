"""mldoctor: diagnose hung, slow, crashed and diverging PyTorch jobs.

The package is split along the design's one-way flow: probes collect and parse evidence
(``doctor.probes``), the engine turns it into facts, YAML rules with CEL conditions turn facts
into findings, and playbooks say what to do. Nothing here imports torch, pandas or textual at
module level, so the CLI starts fast.
"""

__version__ = "0.1.0"
