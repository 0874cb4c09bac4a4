"""Keep secrets out of everything mldoctor writes.

Two layers, as in sos: environment values are kept only for an allowlist of keys that matter
for diagnosis, and every text that is written (artifacts, reports, logs copied in) goes through
``scrub`` which masks tokens, keys, passwords, URL credentials, private keys and JWTs.
"""

from __future__ import annotations

import re

ENV_PREFIXES = (
    "NCCL_", "TORCH_", "TORCHELASTIC_", "PYTORCH_", "CUDA_", "NVIDIA_", "OMP_", "MKL_", "GLOO_",
    "SLURM_", "MASTER_", "OPENBLAS_", "KMP_", "UCX_", "FI_", "NVTE_", "HIP_", "ROCR_", "HSA_",
    "MLDOCTOR_", "DEEPSPEED_", "ACCELERATE_",
)
ENV_KEYS = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "NODE_RANK", "PMI_RANK", "PMI_SIZE",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "HOSTNAME", "LD_PRELOAD", "PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONFAULTHANDLER",
    "TOKENIZERS_PARALLELISM", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
})
# Keys that look allowlisted by prefix but carry credentials in some stacks.
_ENV_DENY = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|PRIVATE|CREDENTIAL|_KEY$)", re.I)

MASK = "[REDACTED]"

_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    # PEM private keys, whole block.
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.S), MASK),
    # Provider tokens with recognizable shapes.
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"), MASK),                       # Hugging Face
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}\b"), MASK),                # GitHub
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}\b"), MASK),
    (re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_\-]{20,}\b"), MASK),     # OpenAI / Anthropic style
    (re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"), MASK),                 # AWS access key id
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}\b"), MASK),              # Slack
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\b"), MASK),  # JWT
    # URL credentials: scheme://user:pass@host
    (re.compile(r"(?P<pre>\b[a-z][a-z0-9+.-]*://[^\s:/@]+:)[^\s@/]+(?=@)"), r"\g<pre>" + MASK),
    # key=value / key: value where the key names a secret (WANDB_API_KEY=..., password: ...).
    (re.compile(
        r"(?P<pre>\b[A-Za-z0-9_.-]*(?:password|passwd|secret|token|api[_-]?key|access[_-]?key|"
        r"private[_-]?key|auth)[A-Za-z0-9_.-]*\b\s*[=:]\s*[\"']?)(?P<val>[^\s\"',;]{4,})",
        re.I,
    ), r"\g<pre>" + MASK),
    # Authorization headers.
    (re.compile(r"(?P<pre>\b(?:Bearer|Basic)\s+)[A-Za-z0-9._~+/=-]{8,}"), r"\g<pre>" + MASK),
]


def env_key_allowed(key: str) -> bool:
    """True when the value of this environment variable may be kept."""
    if _ENV_DENY.search(key):
        return False
    return key in ENV_KEYS or key.startswith(ENV_PREFIXES)


def filter_env(env: dict[str, str]) -> dict[str, str]:
    """Keep allowlisted keys only, with their values scrubbed as well."""
    return {k: scrub(v) for k, v in env.items() if env_key_allowed(k)}


def scrub(text: str) -> str:
    """Mask anything that looks like a credential."""
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    return text


class HostRedactor:
    """Replace host names and IP addresses consistently (``--redact-hosts``).

    The mapping stays with the caller (written outside the bundle) so the engineer can map
    ``host-3`` back to the real node while the ticket never names it.
    """

    _ip = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}\b")

    def __init__(self, hosts: list[str] | None = None) -> None:
        self.mapping: dict[str, str] = {}
        for h in hosts or []:
            self.alias(h)

    def alias(self, name: str) -> str:
        if name not in self.mapping:
            prefix = "ip" if self._ip.fullmatch(name) else "host"
            n = sum(1 for v in self.mapping.values() if v.startswith(prefix + "-"))
            self.mapping[name] = f"{prefix}-{n}"
        return self.mapping[name]

    def __call__(self, text: str) -> str:
        text = self._ip.sub(lambda m: self.alias(m.group(0)) if m.group(0) not in ("127.0.0.1", "0.0.0.0") else m.group(0), text)
        for name in sorted((k for k in self.mapping if not self._ip.fullmatch(k)), key=len, reverse=True):
            text = re.sub(rf"\b{re.escape(name)}\b", self.mapping[name], text)
        return text
