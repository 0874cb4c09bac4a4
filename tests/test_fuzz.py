"""Property-based tests: hostile bytes meet only the project's own errors, and the scrubber
stays linear. Each test is bounded (deadline, max_examples) so the file runs in well under 60 s."""

from __future__ import annotations

import json
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from doctor.evidence.bundle import Bundle
from doctor.evidence.errors import UserError
from doctor.evidence.redact import scrub, scrub_bytes
from doctor.evidence.unpickle import UnpickleError, safe_loads

FAST = settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FAST
@given(st.binary(max_size=2048))
def test_unpickler_raises_only_its_own_error(data):
    try:
        safe_loads(data)
    except UnpickleError:
        pass


@FAST
@given(st.binary(max_size=64).map(lambda b: b"\x80\x04" + b))
def test_unpickler_with_a_valid_header_raises_only_its_own_error(data):
    try:
        safe_loads(data)
    except UnpickleError:
        pass


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                     max_leaves=20)


@FAST
@given(artifacts=_json, probes=_json, extra=st.dictionaries(st.sampled_from(["hosts", "ranks", "notes", "target", "reports"]), _json))
def test_manifest_loader_raises_only_user_errors(tmp_path_factory, artifacts, probes, extra):
    root = tmp_path_factory.mktemp("b")
    (root / "manifest.json").write_text(json.dumps({"schema": "mldoctor.bundle/1", "artifacts": artifacts,
                                                    "probes": probes, **extra}))
    try:
        b = Bundle.load(root)
    except UserError:
        return
    b.verify()
    for art in b.manifest["artifacts"]:
        assert Path(b.artifact_path(art)).resolve().is_relative_to(root.resolve())


@FAST
@given(st.binary(max_size=512))
def test_manifest_loader_on_raw_bytes(tmp_path_factory, raw):
    root = tmp_path_factory.mktemp("b")
    (root / "manifest.json").write_bytes(raw)
    try:
        Bundle.load(root)
    except UserError:
        pass


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(["-", ".", "=", "a", "token-", "-eyJ", "a.", "x://", "--a_", "A_", "QUJDRA+/", "password="]))
def test_scrubber_time_per_megabyte(unit):
    text = unit * (1_000_000 // len(unit))  # one 1 MB line
    t0 = time.perf_counter()
    scrub(text)
    scrub_bytes(text.encode())
    assert time.perf_counter() - t0 < 10.0  # about 1-2 s per MB on a loaded 2-core host; was hours


@FAST
@given(st.text(max_size=300))
def test_scrub_is_idempotent_and_total(text):
    once = scrub(text)
    assert scrub(once) == once or "[REDACTED]" in once


# -- issue 18, "by design": every pattern library, the readers, the bundle loader ----------------
#: Patterns quadratic on an 8 KiB near-miss line (a start at every character of a long run, each
#: scanning to its end). The logs scanner runs a signature only on lines holding its needle, which
#: narrows but does not close this: a line of 8,000 non-spaces then "invoked oom-killer" still
#: takes ~0.3 s. Fix proposed (issue 18): a look-behind on the leading run, e.g.
#: ``(?<!\S)(?P<comm>\S+) invoked oom-killer``. Listed so the test guards every other pattern.
KNOWN_SLOW: set[tuple[str, str]] = set()  # (library file, pattern id) waiting for a fix
_LINE = 8192  # the longest line the logs scanner hands a pattern


def _pathological(examples: tuple[str, ...]) -> list[str]:
    """Long runs of the characters regexes backtrack on, and each example turned into a near
    miss: repeated without its last character, or glued to a long run with its spaces gone."""
    out = [c * _LINE for c in ("a", " ", ".", "-", "0", "\t")] + ["a " * (_LINE // 2), "x:" * (_LINE // 2)]
    for ex in examples[:3]:
        if not ex:
            continue
        out.append((ex[:-1] * (_LINE // len(ex) + 1))[:_LINE])
        out.append(("a" * _LINE + ex.replace(" ", ""))[-_LINE:])
        half = ex[: max(1, len(ex) // 2)]
        out.append((half * (_LINE // len(half) + 1))[:_LINE])
    return out


def test_every_pattern_library_is_linear_on_pathological_lines():
    from doctor.evidence.patterns import every_library, load_library

    slow = []
    libraries = every_library()
    assert libraries
    for lib in libraries:
        for p in load_library(lib):
            if (lib.name, p.id) in KNOWN_SLOW:
                continue
            t0 = time.process_time()
            for text in _pathological(p.examples):
                p.hits(text)
            if time.process_time() - t0 > 0.2:  # ~17 lines of 8 KiB: linear patterns take < 5 ms
                slow.append(f"{lib.name}:{p.id}")
    assert not slow, slow


def test_scrub_stream_time_per_megabyte():
    import io

    from doctor.evidence.redact import scrub_stream

    for unit, text in (("-", True), ("a.", False), ("password=", True), ("-eyJ", False)):
        data = (unit * (500_000 // len(unit))).encode()  # half a megabyte, over the overlap
        t0 = time.process_time()
        scrub_stream(io.BytesIO(data).read, io.BytesIO().write, text)
        assert time.process_time() - t0 < 2.5, unit  # about 0.3 s CPU per MB


_NAMES = ["rank0.log", "trainer_state.json", "metrics.jsonl", "metrics.csv", "nccl_trace_rank_0", "fr_rank1.json",
          "gpu.json", "env-rank0.txt", "py-spy-rank0.txt", "stacks-rank0.json", "events.out.tfevents.1.host",
          "samples-rank0.json", "profile.speedscope.json", "procs.json", "system.json", "slurm.txt"]
_SEEDS = [b"", b"{", b"[", b'{"log_history": [', b'{"entries": [{"process_group": ["0"', b"\x80\x04\x95",
          b"step,loss\n1,", b"Thread 0x", b"NCCL INFO", b'{"schema": "mldoctor.gpu/1", "devices": [']


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(_NAMES), seed=st.sampled_from(_SEEDS), tail=st.binary(max_size=400))
def test_every_reader_raises_only_evidence_errors(tmp_path_factory, name, seed, tail):
    from doctor.evidence import plugins
    from doctor.evidence.contract import Hints
    from doctor.evidence.errors import EvidenceError

    path = tmp_path_factory.mktemp("r") / name
    path.write_bytes(seed + tail)
    for probe in plugins.probes():
        try:
            probe.parse(path, name, Hints.from_path(name))
        except EvidenceError:
            pass


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(members=st.lists(st.tuples(st.sampled_from(["b/manifest.json", "b/x.log", "b/../x", "/abs", "b/sub/y"]),
                                  st.binary(max_size=200)), max_size=4))
def test_archive_loader_raises_only_user_errors(tmp_path_factory, members):
    import io
    import tarfile

    tmp = tmp_path_factory.mktemp("a")
    arc = tmp / "x.tar.gz"
    with tarfile.open(arc, "w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    work = tmp / "work"
    work.mkdir()
    try:
        b = Bundle.load(arc, workdir=work)
    except UserError:
        assert not list(work.iterdir())
        return
    b.verify()


def test_big_json_readers_stay_linear():
    """Time per MB of the streamed JSON readers (the memory side is in test_hardening.py)."""
    from doctor.probes.common import jsonstream

    text = '{"a": 1, "log_history": [' + ",".join(f'{{"loss": 1.5, "step": {i}}}' for i in range(100_000)) + "]}"
    t0 = time.process_time()
    n = sum(1 for _, _, elem in jsonstream.members(text, "log_history") if elem)
    assert n == 100_000 and time.process_time() - t0 < 3.0  # ~2.5 MB
