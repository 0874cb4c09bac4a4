"""Keep secrets out of everything mldoctor writes.

Two layers, as in sos: environment values are kept only for an allowlist of keys that matter
for diagnosis, and every text that is written (artifacts, reports, logs copied in) goes through
``scrub`` which masks tokens, keys, passwords, URL credentials, private keys and JWTs.
Binary artifacts (flight-recorder pickles, NUL-separated ``/proc`` files) go through
``scrub_bytes``, which masks in place with the same length so length-prefixed formats stay
readable. ``HostRedactor`` is the optional third layer (``--redact-hosts``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

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
_ENV_DENY = re.compile(r"(TOKEN(?!IZERS_PARALLELISM)|SECRET|PASSWORD|PASSWD|API_KEY|PRIVATE|CREDENTIAL|_KEY$)", re.I)

MASK = "[REDACTED]"

# Words that make a key name a secret. ``token`` must not be followed by a letter so that
# ``max_tokens=4096`` or ``TOKENIZERS_PARALLELISM`` (throughput and config, not secrets) survive.
# ``pass`` counts only as the last word of a compound key (DB_PASS, smtp.pass), never alone:
# "forward pass: 0.2 s" is a timing.
_SECRET_WORD = (
    r"(?:password|passwd|passphrase|secret|token(?![a-z])|api[_-]?key|apikey|access[_-]?key|"
    r"private[_-]?key|account[_-]?key|shared[_-]?access[_-]?key|auth(?![a-z])|authorization|"
    r"credentials?(?![a-z])|session[_-]?key|(?<=[_.-])pass(?![a-z]))"
)
#: The longest key tail after the secret word (``PASSWORD_FILE_OF_...``) that is still a key.
_KEY_TAIL = 64


def _build(val: str, binary: bool) -> list[tuple[re.Pattern[str], str | None]]:
    """The secret patterns; ``val`` is the character class of an unquoted secret value.

    Each entry is (pattern, group): the named group is masked, or the whole match when None.
    The binary variant only ever spans printable ASCII so that it cannot eat the framing bytes
    of a pickle or the NULs between ``/proc`` entries.

    Linear time matters as much as coverage: a log line of 50,000 progress dots must not take
    minutes. So no pattern may start a scan at every character of a long run and scan to its
    end. Patterns that begin with a character class have a look-behind that excludes that same
    class (one start per run), runs that need not give characters back are possessive
    (``*+``), and key tails are bounded. ``tests/test_fuzz.py`` holds the time bound per MB.
    """
    pem_body = r"[ -~\t\r\n]*?" if binary else r".*?"
    pem_open_end = r"[ -~\t\r\n]*" if binary else r".*"
    # A provider token starts after a non-alphanumeric (``rank0-hf_...`` in a file name counts).
    # These bodies are long ({20,}), so a run either matches whole or is short: linear either way.
    tok = r"(?<![A-Za-z0-9])"
    return [
        # PEM private keys (RSA, EC, OPENSSH, ENCRYPTED, PGP ... BLOCK); the header stays visible
        # so a reviewer sees what was removed. An unterminated block is masked to its end.
        (re.compile(
            r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----(?P<s>" + pem_body
            + r"(?=-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----)|" + pem_open_end + r")",
            re.S), "s"),
        # Provider tokens with recognizable shapes.
        (re.compile(tok + r"hf_[A-Za-z0-9]{20,}+"), None),                  # Hugging Face
        (re.compile(tok + r"api_org_[A-Za-z0-9]{20,}+"), None),             # Hugging Face org
        (re.compile(tok + r"gh[pousr]_[A-Za-z0-9]{20,}+"), None),           # GitHub
        (re.compile(tok + r"github_pat_[A-Za-z0-9_]{20,}+"), None),
        (re.compile(tok + r"glpat-[A-Za-z0-9_-]{20,}+"), None),             # GitLab
        (re.compile(tok + r"sk-(?:proj-|ant-|svcacct-)?[A-Za-z0-9_-]{20,}+"), None),  # OpenAI / Anthropic
        (re.compile(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])"), None),  # AWS access key id
        (re.compile(tok + r"AIza[0-9A-Za-z_-]{35}"), None),                # Google API key
        (re.compile(tok + r"xox[abposr]-[A-Za-z0-9-]{10,}+"), None),       # Slack tokens
        (re.compile(r"hooks\.slack\.com/(?:services|workflows|triggers)/(?P<s>[A-Za-z0-9_/-]++)"), "s"),  # Slack webhooks
        (re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]{8,}+"), None),  # JWT
        # URL credentials: scheme://user:pass@host
        (re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{0,31}+://[^\s:/@\x00]++:(?P<s>[^\s@/\x00]++)@"), "s"),
        # Authorization headers (before key=value, which would otherwise mask only "Bearer").
        (re.compile(r"\b(?:Bearer|Basic)\s++(?P<s>[A-Za-z0-9._~+/=-]{8,}+)"), "s"),
        # aws_secret_access_key VALUE (the AWS CLI's config and `aws configure list` print a space).
        (re.compile(r"(?<![A-Za-z0-9_])aws_(?:secret_access_key|session_token)[ \t]++(?P<s>(?![=:])" + val + r"++)",
                    re.I), "s"),
        # Command-line flags with the value as the next argument: --password hunter2, --hf-token X
        # (separated by a space in a shell line, by a NUL in /proc/PID/cmdline).
        (re.compile(r"(?<![A-Za-z0-9])--?(?:[A-Za-z0-9]++[-_]){0,8}" + _SECRET_WORD
                    + r"[ \t\x00]++(?:\"(?P<dq>[^\"\n\x00]*+)\"|'(?P<sq>[^'\n\x00]*+)'|(?P<s>(?!-)" + val + r"++))",
                    re.I), "dq|sq|s"),
        # key=value / key: value / "key": "value" where the key names a secret. The match starts
        # at the secret word (anything before it in the key changes nothing that is masked).
        (re.compile(_SECRET_WORD + r"[A-Za-z0-9_.-]{0," + str(_KEY_TAIL) + r"}+\\?[\"']?"
                    r"[ \t]*+[=:][ \t]*+(?:\"(?P<dq>[^\"\n\x00]*+)\"|'(?P<sq>[^'\n\x00]*+)'|\\?[\"']?(?P<s>"
                    + val + r"++))", re.I), "dq|sq|s"),
        # Environment-style keys ending in _KEY (SOME_SERVICE_KEY=...).
        (re.compile(r"(?<![A-Za-z0-9_])[A-Z][A-Z0-9_]*_KEY[ \t]*+=[ \t]*+(?P<s>" + val + r"++)"), "s"),
    ]


_TEXT_PATTERNS = _build(r"[^\s\x00\"'\\,;]", binary=False)
_BIN_PATTERNS = _build(r"[!#-&(-+\--:<-\[\]-~]", binary=True)  # printable ASCII minus " ' , ; \


def _masker(group: str | None, same_length: bool, fill: str = "*") -> Callable[[re.Match[str]], str]:
    names = group.split("|") if group else []

    def repl(m: re.Match[str]) -> str:
        start, end = m.span()
        for name in names:
            if m.group(name) is not None:
                start, end = m.span(name)
                break
        secret = m.string[start:end]
        if not secret or secret == MASK or (fill != "*" and secret == fill * len(secret)):
            return m.group(0)
        mask = fill * len(secret) if same_length else MASK
        s0 = m.start()
        return m.group(0)[: start - s0] + mask + m.group(0)[end - s0:]

    return repl


_TEXT_RULES = [(p, _masker(g, False)) for p, g in _TEXT_PATTERNS]
_BIN_RULES = [(p, _masker(g, True)) for p, g in _BIN_PATTERNS]
#: The two key-name patterns start with an alternation under re.I, which the regex engine tries
#: at every position (half the scrubbing time of a log); no key can match without one of these
#: words, and a lower-cased copy plus ``in`` finds them at memchr speed. Masks add no word.
_WORDY = frozenset(p for p, _ in _TEXT_PATTERNS[-3:-1] + _BIN_PATTERNS[-3:-1])
_WORDS = ("pass", "secret", "token", "key", "auth", "credential")


def _apply(text: str, rules: list[tuple[re.Pattern[str], Callable[[re.Match[str]], str]]]) -> str:
    wordy: bool | None = None
    for pattern, repl in rules:
        if pattern in _WORDY:
            if wordy is None:
                low = text.lower()
                wordy = any(w in low for w in _WORDS)
            if not wordy:
                continue
        text = pattern.sub(repl, text)
    return text


def env_key_allowed(key: str) -> bool:
    """True when the value of this environment variable may be kept."""
    if _ENV_DENY.search(key):
        return False
    return key in ENV_KEYS or key.startswith(ENV_PREFIXES)


def filter_env(env: dict[str, str]) -> dict[str, str]:
    """Keep allowlisted keys only, with their values scrubbed as well."""
    return {k: scrub(v) for k, v in env.items() if env_key_allowed(k)}


_ENV_LINE = re.compile(r"^(?:export\s+|declare\s+-x\s+|setenv\s+)?([A-Za-z_][A-Za-z0-9_]*)(?:=|\s)")


def filter_env_text(text: str) -> str:
    """An environment dump (``env`` lines or NUL-separated ``/proc/PID/environ``) cut to the
    allowlisted keys. Every other line goes, including continuation lines of multi-line values
    (a PEM key in a variable spans several lines; keeping its body would leak it)."""
    sep = "\x00" if "\x00" in text else "\n"
    kept = []
    for entry in text.split(sep):
        m = _ENV_LINE.match(entry.strip())
        if m and env_key_allowed(m.group(1)):
            kept.append(scrub(entry))
    return sep.join(kept) + (sep if kept else "")


def scrub(text: str) -> str:
    """Mask anything that looks like a credential (``[REDACTED]``)."""
    return _apply(text, _TEXT_RULES)


def scrub_bytes(data: bytes) -> bytes:
    """Mask credentials inside binary data with ``*`` of the same length.

    Keeping the length keeps length-prefixed formats (pickle strings, tar members) parseable;
    only printable ASCII runs are ever touched.
    """
    return _apply(data.decode("latin-1"), _BIN_RULES).encode("latin-1")


#: Chunked scrubbing (``scrub_stream``): text is scrubbed in windows of CHUNK characters, and
#: the last OVERLAP characters of each window are scrubbed again with the next one.
CHUNK = 1 << 20
OVERLAP = 64 << 10
_FILL = "\ue000"  # masks in a window: same length, so window positions stay true
_TEXT_RULES_SAME = [(p, _masker(g, True, _FILL)) for p, g in _TEXT_PATTERNS]
_PEM_OPEN = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")
_PEM_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")
_PEM_HEAD = "-----BEGIN PRIVATE KEY-----"


def scrub_stream(read: Callable[[int], bytes], write: Callable[[bytes], object], text: bool) -> None:
    """``scrub`` (``text``) or ``scrub_bytes`` over a file read in chunks, in bounded memory.

    Why not whole: ``--out`` scrubbed a 200 MB single-line log in one string (657 MB, 86 s).
    How no secret straddles a cut: each window is masked with same-length masks and only its
    part before ``len - OVERLAP`` is written; the rest is carried raw into the next window, so a
    secret shorter than OVERLAP is seen whole in some window (one cut off by a window's end is
    seen again, whole, in the next). A mask that runs across the cut is carried too, as a
    count of characters the next window masks whatever it finds. A private-key block longer
    than a window is carried on: the next window gets a key header in front, so its body is
    masked up to the END line. Text masks become ``[REDACTED]`` when written.
    """
    import codecs

    dec = codecs.getincrementaldecoder("utf-8" if text else "latin-1")(errors="replace")
    rules, fill = (_TEXT_RULES_SAME, _FILL) if text else (_BIN_RULES, "*")
    carry, force, in_pem, masked_tail = "", 0, False, False
    while True:
        data = read(CHUNK)
        window = carry + dec.decode(data, final=not data)
        if text and _FILL in window[len(carry):]:
            window = carry + window[len(carry):].replace(_FILL, "\ufffd")
        head = _PEM_HEAD + "\n" if in_pem else ""
        masked = _apply(head + window, rules)[len(head):]
        if force:
            masked = fill * force + masked[force:]
        cut = len(masked) if not data else max(0, len(masked) - OVERLAP)
        if data:
            opened = [m.start() for m in _PEM_OPEN.finditer(window)]
            last_open = opened[-1] if opened else -1
            open_block = (last_open >= 0 and not _PEM_END.search(window, last_open)) or (
                in_pem and not opened and not _PEM_END.search(window))
            in_pem = open_block and (last_open < cut)
        force = 0
        if 0 < cut < len(masked) and masked[cut - 1] != window[cut - 1]:
            while cut + force < len(masked) and masked[cut + force] != window[cut + force]:
                force += 1
        out, carry = masked[:cut], window[cut:]
        if text:
            body = re.sub(_FILL + "+", MASK, out)
            if masked_tail and out.startswith(_FILL):
                body = body[len(MASK):]  # one secret cut by the window: one mask
            masked_tail = out.endswith(_FILL)
            write(body.encode("utf-8"))
        else:
            write(out.encode("latin-1"))
        if not data:
            return


def is_text(data: bytes) -> bool:
    """Text is UTF-8 without NULs in its first 8 KiB (``/proc`` NUL files count as binary)."""
    head = data[:8192]
    if b"\x00" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start >= len(head) - 4  # a character cut at the sample's end
    return True


def scrub_any(data: bytes) -> bytes:
    """``scrub`` for text, ``scrub_bytes`` for everything else."""
    if is_text(data):
        return scrub(data.decode("utf-8", errors="replace")).encode()
    return scrub_bytes(data)


_IP = re.compile(r"(?<!\d)(?<!\d\.)(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)(?!\.?\d)")
# IPv6 by shape: eight groups, or groups on both sides of "::" (fe80::966d:ae03:8b:df78). Times
# (13:31:22) and C++ names (c10d::ProcessGroupNCCL) do not fit; each hit is also checked with
# the ipaddress module before it is replaced.
_IP6 = re.compile(r"(?<![\w:.])(?:(?:[0-9A-Fa-f]{1,4}:){7}[0-9A-Fa-f]{1,4}"
                  r"|(?:[0-9A-Fa-f]{1,4}:){1,6}(?::[0-9A-Fa-f]{1,4}){1,6})(?![\w:])")
_KEEP_IPS = frozenset({"127.0.0.1", "0.0.0.0", "255.255.255.255", "::1", "::"})


def _is_ip6(text: str) -> bool:
    import ipaddress

    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv6Address)
    except ValueError:
        return False
_KEEP_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "none", "unknown"})


class HostRedactor:
    """Replace host names and IP addresses consistently (``--redact-hosts``).

    The mapping stays with the caller (written outside the bundle) so the engineer can map
    ``host-3`` back to the real node while the ticket never names it. IPs are found by shape;
    host names must be registered first (``alias``), since nothing tells a host name from a word.
    """

    _ip = _IP

    def __init__(self, hosts: list[str] | None = None) -> None:
        self.mapping: dict[str, str] = {}
        self._names_re: re.Pattern[str] | None = None
        for h in hosts or []:
            self.alias(h)

    def alias(self, name: str) -> str:
        """The stable alias of ``name`` (registered on first sight)."""
        name = name.strip()
        if not name or name.lower() in _KEEP_NAMES or name in _KEEP_IPS:
            return name
        if name not in self.mapping:
            prefix = "ip" if self._ip.fullmatch(name) or _is_ip6(name) else "host"
            n = len({v for v in self.mapping.values() if v.startswith(prefix + "-")})
            self.mapping[name] = f"{prefix}-{n}"
            self._names_re = None
            short = name.split(".", 1)[0]
            if prefix == "host" and short != name and len(short) >= 3 and short not in self.mapping:
                self.mapping[short] = self.mapping[name]  # node07.cluster -> also node07
        return self.mapping[name]

    def _names(self) -> re.Pattern[str] | None:
        if self._names_re is None:
            names = sorted((k for k in self.mapping if not self.mapping[k].startswith("ip-")), key=len, reverse=True)
            if not names:
                return None
            self._names_re = re.compile(r"(?<![A-Za-z0-9_-])(?:" + "|".join(map(re.escape, names))
                                        + r")(?![A-Za-z0-9_-])")
        return self._names_re

    def __call__(self, text: str) -> str:
        text = self._ip.sub(lambda m: m.group(0) if m.group(0) in _KEEP_IPS else self.alias(m.group(0)), text)
        if "::" in text or text.count(":") >= 7:
            text = _IP6.sub(lambda m: self.alias(m.group(0)) if _is_ip6(m.group(0)) and m.group(0) not in _KEEP_IPS
                            else m.group(0), text)
        names = self._names()
        if names is not None:
            text = names.sub(lambda m: self.mapping[m.group(0)], text)
        return text

    def redact_bytes(self, data: bytes) -> bytes:
        """Host redaction for artifacts: text is rewritten, binary data is left alone (an alias
        of another length would break length-prefixed formats)."""
        if is_text(data):
            return self(data.decode("utf-8", errors="replace")).encode()
        if not data.startswith(b"\x80") and is_text(data.replace(b"\x00", b"\n")):
            return self(data.decode("utf-8")).encode()  # NUL-separated /proc text
        return data
