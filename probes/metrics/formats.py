"""Which metric format a file is in, and its reader.

The probe (``sniff``, ``also_sniff``, ``parse``) and the library API (``load_series``) decide a
file's format the same way; keeping the decision here, apart from the Probe class, lets the
library read files without going through the probe object.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from doctor.probes.metrics.readers.csv import looks_csv, read_csv
from doctor.probes.metrics.readers.jsonl import (
    _first_char,
    looks_json,
    looks_jsonl,
    read_json,
    read_jsonl,
)
from doctor.probes.metrics.readers.text import KEY_BYTES, looks_text, read_text
from doctor.probes.metrics.readers.tfevents import looks_tfevents, read_tfevents

from doctor.evidence.contract import Hints, Sample
from doctor.evidence.errors import EvidenceError

if TYPE_CHECKING:
    from doctor.probes.metrics.detect import Series


def owns(sample: Sample) -> bool:
    """The structured formats, which no other probe reads.

    Each reader's test runs behind a cheap condition it cannot be true without, as this runs on
    every file of a folder (16k stack dumps at scale): an event file's first record length is
    below 2**30, so its high four bytes are zero; JSON and JSON lines start with "{"; a csv's
    first line holds a delimiter and is followed by more text.
    """
    raw = sample.raw
    if raw[4:8] == b"\x00\x00\x00\x00" and looks_tfevents(sample):
        return True
    if raw.find(b"\x00", 0, 4096) != -1:
        return False
    text = sample.text
    if _first_char(text) == "{" and (looks_json(sample) or looks_jsonl(sample)):
        return True
    end = text.find("\n")
    if end == -1 or end > 4000 or (text.find(",", 0, end) == -1 and text.find("\t", 0, end) == -1
                                   and text.find(";", 0, end) == -1):
        return False
    return looks_csv(sample)


def carries_metric_lines(sample: Sample) -> bool:
    """A text log (owned by the logs probe) that also carries training-metric lines.

    The head of the file is checked first; a long log whose first 64 KiB are start-up noise
    (Megatron's argument dump, NCCL INFO lines) is checked on its last 64 KiB too.
    """
    raw = sample.raw
    # an event file holds NUL bytes in its first 8 (its record length's high bytes): the NUL test
    # alone rules it out, as looks_tfevents would
    if raw.find(b"\x00", 0, 4096) != -1:
        return False
    if KEY_BYTES.search(raw) and looks_text(sample):
        return True
    if sample.size <= len(raw):
        return False
    with open(sample.path, "rb") as fh:
        fh.seek(max(0, sample.size - len(raw)))
        tail = fh.read(len(raw))
    if b"\x00" in tail or not KEY_BYTES.search(tail):
        return False
    text = tail.decode("utf-8", "replace").split("\n", 1)[-1]
    return looks_text(Sample(sample.path, sample.name, text.encode(), sample.size))


def read_series(path: Path, rel: str, hints: Hints) -> list[Series]:
    """Every series of one file, read by the reader its format needs.

    The order of the checks is the sniffers' order: a TensorBoard file first (binary), then the
    text formats from the most to the least specific; a trainer log comes last, as only
    ``also_sniff`` sends one here.
    """
    sample = Sample.read(path)
    if looks_tfevents(sample):
        return read_tfevents(path, rel, hints)
    if b"\x00" in sample.raw[:4096]:
        raise EvidenceError(rel, "binary file that is not a TensorBoard event file")
    if looks_json(sample):
        return read_json(path, rel, hints)
    if looks_jsonl(sample):
        return read_jsonl(path, rel, hints)
    if looks_csv(sample):
        return read_csv(path, rel, hints)
    return read_text(path, rel, hints)
