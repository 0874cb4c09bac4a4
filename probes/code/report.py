"""The training-code section of a report: what the ast scan found, each at its file and line.

Why a section of its own: a code finding names a cause, but the engineer still has to open the
file at the right line to believe it. Listing every place the scan noted (not only the ones a rule
used) lets them see, for example, that a rank-guarded barrier sits next to the early return a rule
flagged. Rows a finding is likely about (every-step host syncs, rank-conditional collectives and
exits) are marked LOOK, in words, so the mark survives a monochrome terminal.
"""

from __future__ import annotations

from typing import Any

from doctor.evidence.sections import Cell, KeyValues, Row, Section, Table

#: The facts lists shown as rows, with what a row of each is.
_KINDS: tuple[tuple[str, str], ...] = (
    ("rank_conditional_collectives", "collective under a rank condition"),
    ("rank_conditional_exits", "early exit under a rank condition"),
    ("host_sync_in_loop", "host sync in the training loop"),
    ("dataloaders", "DataLoader"),
    ("heavy_getitem", "heavy read in a Dataset"),
    ("find_unused_parameters", "DDP find_unused_parameters=True"),
    ("hardcoded_rendezvous", "rendezvous written as a literal"),
    ("fp16", "fp16"),
    ("learning_rates", "learning rate"),
)
_LOOK = {"rank_conditional_collectives", "rank_conditional_exits"}


def _detail(key: str, item: dict[str, Any]) -> str:
    if key == "rank_conditional_collectives":
        via = f" via {item['via']}" if item.get("via") else ""
        return f"{item.get('op', '?')}{via} under {item.get('guard', '')}"
    if key == "rank_conditional_exits":
        return f"{item.get('exit', '?')} under {item.get('guard', '')}: {item.get('why', '')}".rstrip(": ")
    if key == "host_sync_in_loop":
        return f"{item.get('call', '?')}" + (" (every N steps)" if item.get("every_n") else " (every step)")
    if key == "dataloaders":
        nw = item.get("num_workers")
        return "num_workers " + ("not a literal" if nw == -1 else str(nw))
    if key == "heavy_getitem":
        return str(item.get("call", ""))
    if key == "hardcoded_rendezvous":
        loop = " (loopback: this host only)" if item.get("loopback") else ""
        return f"{item.get('key', '')}={item.get('value', '')}{loop}"
    if key == "fp16":
        return str(item.get("how", ""))
    if key == "learning_rates":
        high = " (high)" if item.get("high") else ""
        return f"{item.get('optimizer', '')} lr={item.get('lr', '')}{high}"
    return ""


def _marks(key: str, item: dict[str, Any]) -> tuple[str, ...]:
    if key in _LOOK or (key == "host_sync_in_loop" and not item.get("every_n")):
        return ("LOOK",)
    if key == "learning_rates" and item.get("high"):
        return ("LOOK",)
    return ()


def sections(facts: dict[str, Any]) -> list[Section]:
    code = facts.get("code")
    if not isinstance(code, dict) or not code.get("files"):
        return []
    rows: list[Row] = []
    for key, what in _KINDS:
        for item in code.get(key) or []:
            if not isinstance(item, dict):
                continue
            place = f"{item.get('file', '?')}:{item.get('line', '?')}"
            rows.append(Row([Cell(place, code=True), Cell(what), Cell(_detail(key, item), code=True)],
                            marks=_marks(key, item)))
    flags = [("DDP", "yes" if code.get("ddp") else "no"),
             ("backend", code.get("backend") or "not a literal / not found"),
             ("trains", "yes" if code.get("trains") else "no")]
    if code.get("nccl_without_set_device"):
        flags.append(("device setup", "nccl with no torch.cuda.set_device anywhere"))
    if code.get("sampler_set_epoch_missing"):
        flags.append(("sampler", "DistributedSampler without set_epoch"))
    if code.get("fp16_without_scaler"):
        flags.append(("mixed precision", "fp16 without a GradScaler"))
    files = ", ".join(str(f) for f in code["files"][:5]) + (" ..." if len(code["files"]) > 5 else "")
    summary = f"{len(code['files'])} source file(s)/block(s), {len(rows)} place(s) noted"
    out = [Section(id="code", title="Training code (read with ast, never run)", nav="Code", order=45,
                   summary=summary, note=f"Read: {files}",
                   body=Table(["where", "what", "detail"], rows, noun="place",
                              legend="LOOK = a place a hang or slowdown rule reads"))
           if rows else
           Section(id="code", title="Training code (read with ast, never run)", nav="Code", order=45,
                   summary=summary, note=f"Read: {files}", body=KeyValues(flags))]
    if rows:
        out.append(Section(id="code-setup", title="Training code: setup", nav="Code setup", order=46,
                           summary="; ".join(f"{k}: {v}" for k, v in flags), body=KeyValues(flags)))
    for note in code.get("notes") or []:
        out[0].note += f"; {note}"
    return out
