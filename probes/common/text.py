"""Text shapes several evidence kinds must agree on: launcher line prefixes, Python exception
lines, traceback starts. One definition here, so that the logs and stacks kinds never disagree on
who owns a traceback or how a ``[rank3]:`` prefix is read.
"""

from __future__ import annotations

import re

#: The first line of a Python traceback (and of one re-raised across a DataLoader worker).
TB_START = ("Traceback (most recent call last):", "Original Traceback (most recent call last):")
#: ``ValueError: msg``, ``torch.distributed.DistBackendError: ...``: an exception line.
EXC_LINE = re.compile(r"^(?P<type>(?:[A-Za-z_]\w*\.)*[A-Z_]\w*)(?::\s?(?P<msg>.*))?$")
RANK_PREFIX = re.compile(r"\[(?:rank(?P<rank>\d+)\]:?|default(?P<local>\d+)\]:|\d+,(?P<mpi>\d+)\]<std(?:out|err)>:)\s?")
# What a container runtime or its log collector puts before each line the job wrote: the CRI
# format of Kubernetes node logs ("2026-12-02T13:31:20.123456789Z stderr F "), docker/kubectl
# --timestamps ("2026-12-02T13:31:20.123456789Z "), kubectl logs --prefix ("[pod/trainer-0/main] ").
# Removed before anything else so the job's own prefixes and messages read as written.
RUNTIME_PREFIX = re.compile(r"(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)) "
                             r"(?:(?:stdout|stderr) [FP] )?|\[pod/[^\]\s]+\] ")


def strip_prefixes(line: str) -> tuple[str, int | None]:
    """Remove nested launcher prefixes; the innermost rank-like prefix wins."""
    rank = None
    if line[:1].isdigit() or line.startswith("[pod/"):
        while True:
            m = RUNTIME_PREFIX.match(line)
            if not m:
                break
            line = line[m.end():]
    while line.startswith("["):
        m = RANK_PREFIX.match(line)
        if not m:
            break
        for key in ("rank", "mpi", "local"):
            if m.group(key) is not None:
                if key != "local" or rank is None:
                    rank = int(m.group(key))
                break
        line = line[m.end():]
    return line, rank
