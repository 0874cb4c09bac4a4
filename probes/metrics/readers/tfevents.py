"""TensorBoard event files: TFRecord framing and the few protobuf fields of Event, Summary and
TensorProto that scalars use, decoded here.

No TensorFlow and no protobuf package: mldoctor must read a run's event files on a login node
where neither is installed. tests/test_metrics.py checks the values against tensorboard's own
reader.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

from doctor.probes.metrics.names import canonical
from doctor.probes.metrics.rows import LINE_FORMAT_MAX, Rows

from doctor.evidence.contract import Hints, Sample
from doctor.evidence.errors import EvidenceError

if TYPE_CHECKING:
    from doctor.probes.metrics.detect import Series

def _crc32c_table() -> list[int]:
    tab = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        tab.append(c)
    return tab


_CRC_TAB = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C, rotated and offset ("masked")."""
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC_TAB[(c ^ b) & 0xFF] ^ (c >> 8)
    c ^= 0xFFFFFFFF
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecords(raw: bytes) -> tuple[list[bytes], str]:
    """Split TFRecord framing: u64 length, u32 masked crc of it, data, u32 masked crc of data.

    Only the length checksums are verified (8 bytes each; the data checksum would cost a pure
    Python CRC over every byte). Returns the records and a note when the file ends early.
    """
    out, pos, n = [], 0, len(raw)
    while pos + 12 <= n:
        (length,) = struct.unpack_from("<Q", raw, pos)
        (lcrc,) = struct.unpack_from("<I", raw, pos + 8)
        if masked_crc32c(raw[pos:pos + 8]) != lcrc:
            return out, f"bad record header at byte {pos}"
        end = pos + 12 + length
        if end + 4 > n:
            return out, f"truncated record at byte {pos} (a writer still running?)"
        out.append(raw[pos + 12:end])
        pos = end + 4
    return out, "" if pos == n else f"{n - pos} trailing bytes"


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def pb_fields(buf: bytes) -> Any:
    """Yield (field number, wire type, value) of one protobuf message; bytes for length-delimited."""
    pos, n = 0, len(buf)
    while pos < n:
        key, pos = _varint(buf, pos)
        fno, wt = key >> 3, key & 7
        if wt == 0:
            val, pos = _varint(buf, pos)
        elif wt == 1:
            val = buf[pos:pos + 8]
            pos += 8
        elif wt == 2:
            ln, pos = _varint(buf, pos)
            val = buf[pos:pos + ln]
            pos += ln
        elif wt == 5:
            val = buf[pos:pos + 4]
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wt}")
        if pos > n:
            raise ValueError("truncated field")
        yield fno, wt, val


_DT_FLOAT, _DT_DOUBLE, _DT_INT32, _DT_INT64, _DT_HALF = 1, 2, 3, 9, 19


def _tensor_scalar(buf: bytes) -> float | None:
    """The value of a scalar TensorProto (TF2 ``tf.summary.scalar`` writes these)."""
    dtype, content = 0, b""
    vals: list[float] = []
    for fno, wt, val in pb_fields(buf):
        if fno == 1 and wt == 0:
            dtype = val
        elif fno == 4 and wt == 2:
            content = val
        elif fno == 5:
            vals += list(struct.unpack(f"<{len(val) // 4}f", val)) if wt == 2 else [struct.unpack("<f", val)[0]]
        elif fno == 6:
            vals += list(struct.unpack(f"<{len(val) // 8}d", val)) if wt == 2 else [struct.unpack("<d", val)[0]]
        elif fno in (7, 10) and wt == 0:
            vals.append(float(val if val < 2**63 else val - 2**64))
        elif fno == 13 and wt == 0:
            vals.append(struct.unpack("<e", struct.pack("<H", val & 0xFFFF))[0])
    if vals:
        return float(vals[0])
    fmt = {_DT_FLOAT: "<f", _DT_DOUBLE: "<d", _DT_INT32: "<i", _DT_INT64: "<q", _DT_HALF: "<e"}.get(dtype)
    if fmt and len(content) >= struct.calcsize(fmt):
        return float(struct.unpack_from(fmt, content)[0])
    return None


def read_tfevents(path: Path, rel: str, hints: Hints) -> list[Series]:
    size = path.stat().st_size
    if size > LINE_FORMAT_MAX:
        raise EvidenceError(rel, f"{size / 2**20:.0f} MiB event file is over the {LINE_FORMAT_MAX // 2**20} MiB limit")
    recs, note = tfrecords(path.read_bytes())
    if not recs:
        raise EvidenceError(rel, f"no TFRecord events ({note or 'empty'})")
    rows = Rows()
    wall0 = None
    tags: dict[str, str] = {}
    try:
        for rec in recs:
            step, wall, summary, session = 0, None, None, None
            for fno, wt, val in pb_fields(rec):
                if fno == 1 and wt == 1:
                    wall = struct.unpack("<d", val)[0]
                elif fno == 2 and wt == 0:
                    step = val if val < 2**63 else val - 2**64
                elif fno == 5 and wt == 2:
                    summary = val
                elif fno == 7 and wt == 2:
                    session = val
            if wall is not None and wall0 is None:
                wall0 = wall
            if session is not None:
                status = next((v for f, w, v in pb_fields(session) if f == 1 and w == 0), 0)
                if status == 1 and rows.steps:  # SessionLog.START after data: a restart
                    rows.marks.append({"kind": "restart", "step": step, "from_step": rows.last_step})
            if summary is None:
                continue
            for fno, wt, val in pb_fields(summary):
                if fno != 1 or wt != 2:
                    continue
                tag, value = None, None
                for f2, w2, v2 in pb_fields(val):
                    if f2 == 1 and w2 == 2:
                        tag = bytes(v2).decode("utf-8", "replace")
                    elif f2 == 2 and w2 == 5:
                        value = struct.unpack("<f", v2)[0]
                    elif f2 == 8 and w2 == 2:
                        value = _tensor_scalar(v2)
                if tag is None or value is None:
                    continue
                c = canonical(tag)
                if c is None or c[0] in ("step", "rank", "run", "wall"):
                    continue
                if tags.setdefault(c[0], tag) != tag:
                    continue  # a second tag for the same metric (e.g. two loss heads): keep the first
                rows.put(rows.row_for(int(step)), c[0], value * c[1])
    except (ValueError, struct.error) as exc:
        raise EvidenceError(rel, f"corrupt event record ({exc})") from None
    if not rows.steps:
        raise EvidenceError(rel, "event file holds no training-metric scalars")
    run_dir = str(Path(rel).parent)
    s = rows.series(run_dir if run_dir != "." else rel, rel, "tensorboard", rank=hints.rank)
    s.meta = {"wall0": wall0 or 0.0, "tb_dir": run_dir, "note": note}
    return [s]


def looks_tfevents(sample: Sample) -> bool:
    raw = sample.raw
    if len(raw) < 16:
        return False
    (length,) = struct.unpack_from("<Q", raw, 0)
    if length > 1 << 30 or masked_crc32c(raw[:8]) != struct.unpack_from("<I", raw, 8)[0]:
        return False
    return b"brain.Event" in raw[12:12 + min(length, 64)] or "tfevents" in sample.name


def merge_tensorboard(series: list[Series]) -> list[Series]:
    """Event files of one TensorBoard run directory are one run, restarted: join them by time."""
    import numpy as np
    from doctor.probes.metrics.detect import Series

    out, groups = [], {}
    for s in series:
        meta = getattr(s, "meta", None) or {}
        if s.fmt == "tensorboard" and "tb_dir" in meta:
            groups.setdefault((meta["tb_dir"], s.rank), []).append(s)
        else:
            out.append(s)
    for (_, _), parts in groups.items():
        if len(parts) == 1:
            out.append(parts[0])
            continue
        parts.sort(key=lambda s: s.meta.get("wall0", 0.0))
        metrics = sorted({m for s in parts for m in s.cols})
        cols = {m: np.concatenate([s.cols.get(m, np.full(s.rows, np.nan)) for s in parts]) for m in metrics}
        nl = {}
        for m in {m for s in parts for m in s.nan_logged}:
            nl[m] = np.concatenate([s.nan_logged.get(m, np.zeros(s.rows, bool)) for s in parts])
        merged = Series(name=parts[0].name, file=", ".join(s.file for s in parts), fmt="tensorboard",
                        step=np.concatenate([s.step for s in parts]), cols=cols, nan_logged=nl,
                        rank=parts[0].rank, marks=[m for s in parts for m in s.marks])
        out.append(merged)
    return out
