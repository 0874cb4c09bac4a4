"""Training code as evidence: a ``train.py`` attached to a ticket, or a fenced Python block.

Tickets about broken distributed jobs often carry the script, and the script often shows the
cause (a collective only rank 0 calls, an ``.item()`` every step, fp16 with no loss scaler). This
kind reads it with the ``ast`` module only: the user's code is parsed, never compiled, executed,
evaluated or imported. Size is bounded (``source.MAX_SOURCE``) and so is the walk
(``source.MAX_NODES``); a snippet that does not parse is repaired where that is cheap (dedent,
drop the tail from the rejected line) and otherwise leaves a one-line note, never an error.

The facts are leads, not verdicts: code shows what *can* go wrong, so the rules that read them
(``rules/*/CODE0*.yaml``) stay at low or medium severity and say what would confirm them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any, ClassVar

from doctor.evidence.contract import Hints, Parsed, Probe, Sample, read_whole
from doctor.evidence.errors import EvidenceError
from doctor.evidence.sections import Section, SectionContext

from . import report, scan, source

#: a traceback quotes indented source lines under these; never a script, whatever its name
_TRACEBACK = re.compile(r'^\s*(?:Traceback \(most recent call last\)|File "[^"]+", line \d+)', re.M)
_LIST_KEYS = ("rank_conditional_collectives", "rank_conditional_exits", "host_sync_in_loop", "dataloaders",
              "heavy_getitem", "find_unused_parameters", "hardcoded_rendezvous", "fp16", "learning_rates")
_ANY_KEYS = ("distributed_sampler", "sampler_set_epoch_missing", "ddp", "nccl_without_set_device",
             "fp16_without_scaler", "trains", "grad_clipping", "sets_omp_threads")


def _records(path: str, what: str, fields: dict[str, str]) -> dict[str, str]:
    """A list of findings: each quotes its source line (line, code) and names its file."""
    out = {path: f"list<map>: {what}",
           f"{path}[].line": "int: line number in the file (a ticket block's: in the document)",
           f"{path}[].code": "string: that source line, stripped",
           f"{path}[].file": "string: the file, or the document a ticket block is in"}
    out.update({f"{path}[].{k}": v for k, v in fields.items()})
    return out


def _schema() -> dict[str, str]:
    s = {
        "code.files": "list<string>: the source files and ticket blocks read as Python",
        "code.notes": "list<string>: repairs made to a snippet (dedented, read up to line N) or why one could not be read",
        "code.n_host_syncs_every_step": "int: host syncs in the loop not under an every-N guard",
        "code.dataloaders_main_process": "int: DataLoaders loading in the main process (num_workers 0)",
        "code.distributed_sampler": "bool: a DistributedSampler is built",
        "code.sampler_set_epoch_missing": "bool: a DistributedSampler is built and set_epoch is never called "
        "(the same shuffle every epoch)",
        "code.ddp": "bool: the model is wrapped in DistributedDataParallel",
        "code.backend": "string: init_process_group's literal backend (nccl, gloo), empty when not literal",
        "code.nccl_without_set_device": "bool: init_process_group('nccl') and no torch.cuda.set_device or "
        "per-rank device choice anywhere in the code",
        "code.fp16_without_scaler": "bool: fp16 is used and no GradScaler (nor a framework that scales: HF fp16, "
        "Lightning precision 16, DeepSpeed, apex)",
        "code.trains": "bool: the code has a training loop (backward or optimizer.step in a loop) or training_step",
        "code.grad_clipping": "bool: gradient clipping appears (clip_grad_norm_, max_grad_norm, gradient_clip_val)",
        "code.sets_omp_threads": "bool: the code sets OMP_NUM_THREADS or torch.set_num_threads",
    }
    guard = {"guard": "string: the rank condition", "guard_line": "int: its line"}
    s |= _records("code.rank_conditional_collectives",
                  "a collective (or a call of this file's function that reaches one, or a DDP-wrapped model's "
                  "forward) under a rank condition with no matching call for the other ranks (the same op in "
                  "the other branch, or a paired barrier, is not listed)",
                  {"op": "string: the collective (barrier, all_reduce, DDP forward, log(sync_dist=True))",
                   "via": "string: the function of this file (or DDP model) through which it is reached; empty when direct",
                   "barrier": "bool: the op is a barrier (barrier, wait_for_everyone, rendezvous)", **guard})
    s |= _records("code.rank_conditional_exits",
                  "break/continue/return under a rank condition in a loop that runs collectives, or before a "
                  "later collective of the same function",
                  {"exit": "string: break, continue or return", "why": "string: what the other ranks go on to", **guard})
    s |= _records("code.host_sync_in_loop",
                  ".item()/.cpu()/.numpy()/.tolist()/torch.cuda.synchronize() inside a training loop or training_step",
                  {"call": "string: the sync call", "every_n": "bool: under an `if step % N` guard (not every step)"})
    s |= _records("code.dataloaders", "DataLoader(...) calls",
                  {"num_workers": "int: 0 when not given (the default), -1 when not a literal",
                   "drop_last": "bool: drop_last=True given", "sampler": "string: the sampler argument, if any",
                   "shuffle": "bool: shuffle=True given"})
    s |= _records("code.heavy_getitem", "file, image, tokenizer or network reads inside a Dataset's __getitem__/__iter__",
                  {"call": "string: the call"})
    s |= _records("code.find_unused_parameters", "DDP(..., find_unused_parameters=True)", {})
    s |= _records("code.hardcoded_rendezvous", "MASTER_ADDR/MASTER_PORT or a tcp:// init_method written as literals",
                  {"key": "string: MASTER_ADDR, MASTER_PORT or init_method", "value": "string: the literal",
                   "loopback": "bool: localhost/127.x/0.0.0.0 (reachable only from its own host)"})
    s |= _records("code.fp16", "fp16 autocast (CUDA autocast's default dtype) or model.half()",
                  {"how": "string: autocast or .half()"})
    s |= _records("code.learning_rates", "literal learning rates given to an optimizer or TrainingArguments",
                  {"optimizer": "string: the optimizer class", "lr": "float: the value",
                   "high": "bool: >= 1e-2 for Adam-family, >= 1.0 for SGD"})
    return s


_BLOCK = re.compile(r"^(?P<doc>.+?) blocks? [\d-]+, lines (?P<start>\d+)-\d+$")


def _document_place(rel: str) -> tuple[str, int]:
    """A ticket block's findings are quoted at the document's own line numbers ("issue.md line 28"),
    which the reader can find, rather than at the line inside the block."""
    m = _BLOCK.match(rel)
    return (m.group("doc"), int(m.group("start")) - 1) if m else (rel, 0)


def _placed(item: dict[str, Any], where: str, offset: int) -> dict[str, Any]:
    out = dict(item, file=where, line=item["line"] + offset)
    if "guard_line" in item:
        out["guard_line"] = item["guard_line"] + offset
    return out


class CodeProbe(Probe):
    name: ClassVar[str] = "code"
    title: ClassVar[str] = "Training code (Python source, read with ast only)"
    collects: ClassVar[str] = (
        "Python source attached to or pasted in a ticket, parsed with the ast module (never run): collectives "
        "under a rank condition, early exits on one rank, host syncs in the training loop, DataLoader and "
        "sampler settings, rendezvous and device setup, mixed precision, learning rates, gradient clipping."
    )
    # Above logs (30), which would take a code block as unstructured text; below stacks (60), whose
    # traceback-style readers own quoted source lines (a traceback never parses as a module anyway).
    priority: ClassVar[int] = 55
    build_order: ClassVar[int] = 85
    max_bytes: ClassVar[int] = 4 * 1024 * 1024
    fixtures: ClassVar[tuple[str, ...]] = ("tests/fixtures/code/*.py",)
    facts_schema: ClassVar[dict[str, str]] = _schema()

    def sniff(self, sample: Sample) -> bool:
        if sample.is_binary or not sample.size:
            return False
        text = sample.text
        if len(sample.raw) < sample.size:  # the head of a longer file: drop its cut last line
            text = text[: text.rfind("\n") + 1]
        if not source.STATEMENT.search(text):
            return False
        if source.looks_like_code(text):
            return True
        # A snippet cut off mid-statement, or the head of a long file: a repaired head is enough when
        # it keeps most of the lines and several statements (a log's first lines never do both).
        tree, _ = source.parse(text)
        if tree is None:
            # a .py file that does not parse is still the user's script: read as a one-line note
            return sample.name.endswith(".py") and not _TRACEBACK.search(text)
        kept = max((getattr(n, "end_lineno", 0) or 0) for n in tree.body) if tree.body else 0
        total = sum(1 for ln in text.splitlines() if ln.strip())
        n_stmts = sum(1 for n in ast.walk(tree) if isinstance(n, ast.stmt))
        return n_stmts >= 3 and (sample.name.endswith(".py") or kept >= 0.8 * total)

    def parse(self, path: Path, rel: str, hints: Hints) -> Parsed:
        raw = read_whole(path)
        if b"\x00" in raw[:4096]:
            raise EvidenceError(rel, "binary file, not Python source")
        text = raw.decode("utf-8", errors="replace")
        tree, note = source.parse(text)
        notes = [f"{rel}: {note}"] if note else []
        if tree is None or not source.small_enough(tree):
            why = note or f"more than {source.MAX_NODES} syntax nodes"
            return Parsed(self.name, rel, {"file": rel, "unreadable": why}, hints.rank, hints.host,
                          notes=[f"{rel}: {why}"])
        data = scan.scan(tree, text)
        data["file"] = rel
        if data.pop("out_of_time", False):
            notes.append(f"{rel}: scan stopped after {scan.TIME_BUDGET_S:g} s (rank and loop findings only partly read)")
        return Parsed(self.name, rel, data, hints.rank, hints.host, notes=notes)

    def build(self, parsed: list[Parsed], facts: dict[str, Any]) -> None:
        out: dict[str, Any] = {"files": [], "notes": [], "backend": ""}
        for key in _LIST_KEYS:
            out[key] = []
        for key in _ANY_KEYS:
            out[key] = False
        for p in parsed:
            d = p.data
            out["files"].append(d["file"])
            out["notes"] += p.notes
            if "unreadable" in d:
                continue
            where, offset = _document_place(d["file"])
            for key in _LIST_KEYS:
                out[key] += [_placed(item, where, offset) for item in d.get(key, [])]
            for key in _ANY_KEYS:
                out[key] = out[key] or bool(d.get(key))
            out["backend"] = out["backend"] or d.get("backend", "")
        out["n_host_syncs_every_step"] = sum(1 for h in out["host_sync_in_loop"] if not h["every_n"])
        out["dataloaders_main_process"] = sum(1 for d in out["dataloaders"] if d["num_workers"] == 0)
        facts[self.name] = out

    def report_sections(self, facts: dict[str, Any], context: SectionContext) -> list[Section]:
        return report.sections(facts)


PROBE = CodeProbe()
