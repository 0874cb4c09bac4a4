"""Metric CSV files (any delimiter; W&B exports with ``<run> - <metric>`` columns).

CSV is the format for long runs (ten million rows), so this reader parses byte ranges of the
file on several threads straight into preallocated columns; the other readers go line by line.
pandas and numpy are imported inside the functions that need them.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING, Any

from doctor.probes.metrics.names import TRAINING, canonical
from doctor.probes.metrics.rows import postprocess

from doctor.evidence.contract import Hints, Sample
from doctor.evidence.errors import EvidenceError
from doctor.evidence.redact import scrub

if TYPE_CHECKING:
    from doctor.probes.metrics.detect import Series

CSV_RANGE_BYTES = 32 * 2**20  # one parse task: small enough to spread over cores
CSV_FLOAT32_ROWS = 1_000_000  # longer CSV files keep loss-like values as float32
_COMPACT = frozenset({"loss", "grad_norm", "lr", "loss_scale"})  # never clocks or counters


def _sniff_delim(first: str) -> str:
    counts = {d: first.count(d) for d in (",", "\t", ";")}
    return max(counts, key=lambda d: counts[d])


def _csv_columns(header: list[str]) -> dict[str, Any]:
    """Which raw columns are which metric; W&B ``<run> - <metric>`` columns grouped by run."""
    plain: dict[str, tuple[str, float]] = {}
    per_run: dict[str, dict[str, tuple[str, float]]] = {}
    special: dict[str, str] = {}
    for col in header:
        name = col.strip().strip('"')
        if " - " in name:
            run, _, metric = name.rpartition(" - ")
            run = scrub(run)[:80]
            c = canonical(metric)
            if c and c[0] not in ("step", "rank", "run"):
                per_run.setdefault(run, {}).setdefault(c[0], (col, c[1]))
            continue
        c = canonical(name)
        if c is None:
            continue
        if c[0] in ("step", "rank", "run"):
            special.setdefault(c[0], col)
        elif c[0] not in {v[0] for v in plain.values()}:
            plain[col] = c
    return {"plain": plain, "per_run": per_run, "special": special}


def _csv_useful(cols: dict[str, Any]) -> bool:
    metrics = {c[0] for c in cols["plain"].values()}
    for d in cols["per_run"].values():
        metrics |= set(d)
    key = metrics & {"loss", "grad_norm", "loss_scale", "step_time", "data_time"}
    return bool(key) and ("step" in cols["special"] or len(metrics) >= 2 or bool(cols["per_run"]))


def _has_empty_cells(path: Path, delim: str, at: float) -> bool:
    """Are NaN values written as empty cells (",," or a delimiter at a line's end or start)?

    Only asked when a loss column holds NaN, and answered from 16 MiB of the file around the
    first NaN row (``at``: its position as a share of the rows), so a ten-million-row file is
    not read twice. If no cell there is empty, NaN is written out ("nan") and is exact;
    otherwise ``logged_nan`` judges by the shape of the column.
    """
    d = delim.encode()
    size = path.stat().st_size
    start = max(0, int(at * size) - 8 * 2**20)
    with open(path, "rb") as fh:
        fh.seek(start)
        buf = fh.read(16 * 2**20)
    if start:
        buf = buf[buf.find(b"\n") + 1:]  # from the start of a line
    return any(p in buf for p in (d + d, d + b"\n", d + b"\r\n", b"\n" + d))


def _csv_ranges(path: Path, data_start: int, size: int) -> list[tuple[int, int]]:
    """Byte ranges of the data rows, each ending at a newline, about CSV_RANGE_BYTES long."""
    parts = max(1, (size - data_start) // CSV_RANGE_BYTES)
    bounds = [data_start]
    with open(path, "rb") as fh:
        for i in range(1, parts):
            fh.seek(data_start + (size - data_start) * i // parts)
            fh.readline()  # to the start of the next line
            at = fh.tell()
            if bounds[-1] < at < size:
                bounds.append(at)
    bounds.append(size)
    return list(zip(bounds[:-1], bounds[1:], strict=True))


class _Span:
    """A read-only window ``[start, end)`` of a file, for pandas to read a byte range in place.

    pandas pulls its input in small pieces through ``read``; handing it the file itself (and not
    the range copied into one bytes object) keeps every range's text out of fresh memory.
    """

    def __init__(self, path: Path, start: int, end: int) -> None:
        self._fh = open(path, "rb")  # noqa: SIM115 - closed by the reader through close()
        self._fh.seek(start)
        self._left = end - start

    def read(self, n: int = -1) -> bytes:
        n = self._left if n is None or n < 0 else min(n, self._left)
        data = self._fh.read(n)
        self._left -= len(data)
        return data

    def close(self) -> None:
        self._fh.close()

    def __iter__(self) -> Any:  # pandas checks for it on file-likes; lines are never asked for
        return iter(())


def _newlines(path: Path, span: tuple[int, int]) -> int:
    """Lines in a byte range (a last line without newline counts): an upper bound on its rows."""
    buf = bytearray(4 * 2**20)  # reused for the whole range: no fresh memory per read
    n, left, last = 0, span[1] - span[0], b"\n"
    with open(path, "rb") as fh:
        fh.seek(span[0])
        while left > 0:
            got = fh.readinto(memoryview(buf)[:min(left, len(buf))])
            if not got:
                break
            n += buf.count(b"\n", 0, got)
            last = buf[got - 1:got]
            left -= got
    return n + (last != b"\n")


def _convert(frame: Any, names: dict[int, str], run_pos: int | None) -> tuple[dict[int, Any], Any]:
    """One parsed range's columns as numpy arrays, and the mask of repeated header lines."""
    import numpy as np
    import pandas as pd

    drop = np.zeros(len(frame), bool)
    conv: dict[int, Any] = {}
    for pos in names:
        s = frame[pos]
        if pos == run_pos:
            conv[pos] = s.astype(str).to_numpy()
        elif s.dtype.kind in "fiub":
            conv[pos] = s.to_numpy()
        else:  # text in a numeric column: a header repeated on append, or junk
            num = pd.to_numeric(s, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
            idx = np.flatnonzero(np.isnan(num) & ~s.isna().to_numpy())
            drop[idx[(s.iloc[idx].astype(str).str.strip() == names[pos].strip()).to_numpy()]] = True
            conv[pos] = num
    return conv, drop


def _read_columns(path: Path, delim: str, header: list[str], data_start: int, names: dict[int, str],
                  step_pos: int | None, run_pos: int | None,
                  compact: frozenset[int] = frozenset()) -> tuple[dict[int, Any], Any]:
    """Parse the wanted columns of every data row: byte ranges in parallel threads, each written
    straight into one preallocated array per column. Returns the columns and, when some step
    cells were not numbers, the mask of rows with a valid step (else None).

    pandas' C tokenizer and float conversion release the GIL, so ranges parsed on every core cut
    the wall time of a ten-million-row file by the core count. What costs next is touching fresh
    memory, so each column is allocated once (its length bounded by a count of lines) and no
    range's text or columns are ever copied whole. Rows never span ranges unless a quoted field
    holds a newline: a file with quotes in its data is read as one range. ``compact``: the
    positions whose values may be kept as float32.
    """
    import os
    import warnings
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import pandas as pd

    size = path.stat().st_size
    with open(path, "rb") as fh:
        fh.seek(data_start)
        quoted = b'"' in fh.read(65536)
    ranges = [(data_start, size)] if quoted else _csv_ranges(path, data_start, size)
    workers = min(len(ranges), os.cpu_count() or 1, 8)
    ex = ThreadPoolExecutor(workers, thread_name_prefix="mldoctor-csv") if workers > 1 else None

    def each(fn: Any, items: list[Any]) -> list[Any]:
        return list(ex.map(fn, items)) if ex else [fn(i) for i in items]

    try:
        counts = each(lambda span: _newlines(path, span), ranges)
        offsets = [0]
        for c in counts:
            offsets.append(offsets[-1] + c)
        total = offsets[-1]
        # Past a million rows, loss-like values are kept as float32 (7 significant digits, more
        # than any detector or report uses): half the memory to touch, which on a VM is most of
        # the time. Clocks stay float64: an epoch timestamp in float32 is off by minutes.
        def dtype(pos: int) -> Any:
            if pos == run_pos:
                return object
            if pos == step_pos:
                return np.int64
            return np.float32 if pos in compact and total > CSV_FLOAT32_ROWS else np.float64

        dest = {pos: np.empty(total, dtype(pos)) for pos in names}
        bad_step: list[Any] = []  # global rows whose step cell was not a number

        def parse(i: int) -> int:
            span = _Span(path, *ranges[i])
            try:
                frame = pd.read_csv(span, sep=delim, header=None, names=range(len(header)), index_col=False,
                                    usecols=sorted(names), engine="c", on_bad_lines="skip",
                                    encoding="utf-8", encoding_errors="replace")
            except pd.errors.EmptyDataError:
                return 0
            finally:
                span.close()
            conv, drop = _convert(frame, names, run_pos)
            del frame
            keep = ~drop if drop.any() else None
            n = len(drop) if keep is None else int(keep.sum())
            at = offsets[i]
            for pos, a in conv.items():
                v = a if keep is None else a[keep]
                if pos == step_pos and v.dtype.kind == "f":
                    ok = np.isfinite(v)
                    if not ok.all():
                        bad_step.append(at + np.flatnonzero(~ok))
                    v = np.where(ok, v, 0)
                dest[pos][at:at + n] = v
            return n

        with warnings.catch_warnings():  # mixed text and numbers in a column is expected here
            warnings.simplefilter("ignore", pd.errors.DtypeWarning)
            got = each(parse, list(range(len(ranges))))
    finally:
        if ex:
            ex.shutdown()
    n = sum(got)
    if n < total:  # dropped or blank lines left gaps: close them, in order, in place
        end = 0
        for at, k in zip(offsets, got, strict=False):
            if k and at != end:
                for a in dest.values():
                    a[end:end + k] = a[at:at + k]
            end += k
        dest = {pos: a[:n] for pos, a in dest.items()}
    ok = None
    if bad_step:
        ok = np.ones(total, bool)
        ok[np.concatenate(bad_step)] = False
        if n < total:
            ok = np.concatenate([ok[at:at + k] for at, k in zip(offsets, got, strict=False)])
    return dest, ok


def read_csv(path: Path, rel: str, hints: Hints) -> list[Series]:
    import numpy as np
    import pandas as pd
    from doctor.probes.metrics.detect import Series, logged_nan

    with open(path, "rb") as fh:
        first_raw = fh.readline()
    first = first_raw.decode("utf-8-sig", errors="replace")
    delim = _sniff_delim(first)
    header = next(iter(csv.reader([first.rstrip("\r\n")], delimiter=delim)), [])
    cols = _csv_columns(header)
    if not _csv_useful(cols):
        raise EvidenceError(rel, "CSV header names no training metric (loss, grad_norm, loss_scale, step_time)")
    want: dict[str, list[tuple[str, str, float]]] = {}  # run key -> [(raw col, metric, factor)]
    for col, (m, f) in cols["plain"].items():
        want.setdefault("", []).append((col, m, f))
    for run, d in cols["per_run"].items():
        for m, (col, f) in d.items():
            want.setdefault(run, []).append((col, m, f))
    usecols = sorted({c for lst in want.values() for c, _, _ in lst} | set(cols["special"].values()))
    position = {c: header.index(c) for c in usecols}  # the first column of a repeated name
    try:
        compact = frozenset(position[c] for lst in want.values() for c, m, _ in lst if m in _COMPACT)
        by_pos, step_ok = _read_columns(path, delim, header, len(first_raw), {position[c]: c for c in usecols},
                                        position.get(cols["special"].get("step", "")),
                                        position.get(cols["special"].get("run", "")), compact)
    except (ValueError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise EvidenceError(rel, f"unreadable CSV ({str(exc).splitlines()[0][:120]})") from None
    full = {c: by_pos[position[c]] for c in usecols}
    n = len(next(iter(full.values()))) if full else 0
    if n == 0:
        raise EvidenceError(rel, "CSV has a header but no rows")
    metric_cols = {c for lst in want.values() for c, _, _ in lst}
    if not any(np.isfinite(full[c][:1000]).any() or np.isfinite(full[c]).any() for c in metric_cols):
        raise EvidenceError(rel, "CSV metric columns hold no numbers")
    step_col = cols["special"].get("step")
    if step_col:
        ok, step, step_from = step_ok, full[step_col], "column"
    else:
        ok = None
        step = np.arange(1, n + 1, dtype=np.int64)
        step_from = "row"
    # A mask of None means "all rows": no copies of ten-million-row columns for the usual case.
    groups: list[tuple[str | None, int | None, Any]] = [(None, hints.rank, ok)]
    rank_col, run_col = cols["special"].get("rank"), cols["special"].get("run")
    if rank_col or run_col:
        rk = full[rank_col] if rank_col else None
        rn = full[run_col] if run_col else None
        groups = []
        for r in (np.unique(rk[np.isfinite(rk)]) if rk is not None else [None]):
            for nm in (np.unique(rn) if rn is not None else [None]):
                mask = np.ones(n, bool) if ok is None else ok.copy()
                if r is not None:
                    mask &= rk == r
                if nm is not None:
                    mask &= rn == nm
                if mask.any():
                    groups.append((None if nm is None else scrub(str(nm))[:80], None if r is None else int(r), mask))
    out = []
    no_gaps: bool | None = None
    for run_key, lst in want.items():
        for run, rank, mask in groups:
            cols_out, nl, src = {}, {}, {}
            def pick(a: Any, mask: Any = mask) -> Any:
                return a if mask is None else a[mask]

            for col, m, f in lst:
                v = pick(full[col])
                cols_out[m] = v * f if f != 1.0 else v
                src[m] = col
            for m in ("loss", "grad_norm"):
                if m not in cols_out:
                    continue
                isn = np.isnan(cols_out[m])
                first = int(np.argmax(isn))
                if not isn[first]:
                    continue  # no NaN at all
                if no_gaps is None:
                    no_gaps = not _has_empty_cells(path, delim, first / max(1, len(isn)))
                if no_gaps:  # no cell near the NaN rows is empty: every NaN was written as a value
                    nl[m] = isn
                    continue
                others = [v for k, v in cols_out.items() if k in TRAINING and k != m]
                flags = logged_nan(cols_out[m], others)
                if flags is not None:
                    nl[m] = flags
            run_name = run_key or run
            parts = [rel] + ([run_name] if run_name else []) + ([f"rank{rank}"] if rank_col and rank is not None else [])
            s = Series(name=":".join(parts), file=rel, fmt="csv", step=pick(step), cols=cols_out, nan_logged=nl,
                       rank=rank, run=run_name, step_from=step_from)
            postprocess(s)
            if s.rows:
                out.append(s)
    return out


def looks_csv(sample: Sample) -> bool:
    text = sample.text
    first, _, rest = text.partition("\n")
    if not rest.strip() or len(first) > 4000:
        return False
    delim = _sniff_delim(first)
    if first.count(delim) < 1:
        return False
    header = [h.strip().strip('"') for h in first.rstrip("\r").split(delim)]
    if any(not h for h in header[:2]):
        return False
    return _csv_useful(_csv_columns(header))
