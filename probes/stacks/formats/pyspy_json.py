"""``py-spy dump --json`` (what ``collect`` writes) and the error records of failed live dumps;
several concatenated documents and a cut-off array are salvaged, as a dump interrupted by a
dying rank is still evidence.
"""

from __future__ import annotations

import json
from typing import Any

from doctor.probes.stacks.formats.common import is_native_file
from doctor.probes.stacks.model import DumpError, RawProc, RawThread


def _json_values(text: str, notes: list[str]) -> list[Any]:
    """Top-level JSON values; several concatenated documents and a cut-off array are salvaged."""
    try:
        return [json.loads(text)]
    except json.JSONDecodeError:
        pass
    dec = json.JSONDecoder()
    vals: list[Any] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n:
            break
        try:
            v, i = dec.raw_decode(text, i)
            vals.append(v)
            continue
        except json.JSONDecodeError:
            pass
        if text[i] == "[":  # a cut-off array: take its complete elements
            i += 1
            while i < n:
                while i < n and text[i] in " \t\r\n,":
                    i += 1
                if i >= n or text[i] == "]":
                    i += 1
                    break
                try:
                    v, i = dec.raw_decode(text, i)
                    vals.append(v)
                except json.JSONDecodeError:
                    notes.append("JSON is cut off (truncated); parsed the complete threads")
                    return vals
            continue
        notes.append(f"unparseable JSON at offset {i}; parsed what came before")
        break
    return vals


def _flatten_json(vals: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for v in vals:
        if isinstance(v, list):
            out.extend(_flatten_json(v))
        elif isinstance(v, dict):
            if isinstance(v.get("threads"), list):  # a process object holding its threads
                for t in v["threads"]:
                    if isinstance(t, dict):
                        out.append({**t, "pid": t.get("pid", v.get("pid"))})
            else:
                out.append(v)
    return out


def parse_json(text: str) -> tuple[list[RawProc], list[DumpError], list[str]]:
    notes: list[str] = []
    objs = _flatten_json(_json_values(text, notes))
    errors: list[DumpError] = []
    by_pid: dict[Any, RawProc] = {}
    for o in objs:
        err = o.get("mldoctor_stack_error")
        if isinstance(err, dict):
            errors.append(DumpError(_int(err.get("rank")), _int(err.get("pid")), str(err.get("kind", "error")),
                                    str(err.get("reason", ""))[:300], _int(err.get("snapshot")) or 0))
            continue
        frames = o.get("frames")
        if not isinstance(frames, list):
            continue
        pid = _int(o.get("pid"))
        proc = by_pid.get(pid)
        if proc is None:
            proc = by_pid[pid] = RawProc(pid, "pyspy_json")
            info = o.get("process_info")
            if isinstance(info, dict) and isinstance(info.get("parent"), dict):
                proc.parent = _int(info["parent"].get("pid"))
        tid = o.get("os_thread_id") or o.get("thread_id") or ""
        t = RawThread(str(tid), str(o.get("thread_name") or ""), active=_bool(o.get("active")),
                       gil=_bool(o.get("owns_gil")))
        for f in frames:
            if not isinstance(f, dict):
                continue
            file = str(f.get("short_filename") or f.get("filename") or "")
            native = f.get("module") is not None or is_native_file(file)
            t.frames.append((str(f.get("name", "?")), file, _int(f.get("line")) or 0, native))
        proc.threads.append(t)
    procs = list(by_pid.values())
    if notes and procs:
        procs[-1].truncated = True
    return procs, errors, notes


def _int(v: Any) -> int | None:
    try:
        return int(v) if v is not None and not isinstance(v, bool) else None
    except (TypeError, ValueError):
        return None


def _bool(v: Any) -> bool | None:
    return v if isinstance(v, bool) else None
