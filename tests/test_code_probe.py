"""The code kind: training scripts and pasted Python blocks read with ``ast`` only.

Each anti-pattern is checked on both sides: the shape that breaks a job is found (with its line),
and the near miss that is fine (a collective on all ranks, rank-0 print/torch.save, an .item()
once after the loop, HF's paired barrier) is not. The samples are in tests/fixtures/code/ (written
for these tests in the shapes of plain DDP loops, HF scripts and Lightning modules) or inline.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from doctor.probes.code import PROBE, source

from doctor.engine import facts as F
from doctor.engine.diagnose import diagnose_path
from doctor.evidence.contract import Sample

ROOT = Path(__file__).resolve().parents[1]
FX = ROOT / "tests" / "fixtures" / "code"


def _facts(path: Path) -> dict[str, Any]:
    facts, _ = F.build(F.items_from_folder(path), "loose")
    return facts


def _code(tmp_path: Path, text: str, name: str = "train.py") -> dict[str, Any]:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return _facts(p).get("code", {})


def _sample(tmp_path: Path, text: str, name: str = "block1.log") -> Sample:
    p = tmp_path / name
    p.write_text(text)
    return Sample.read(p)


# ---- sniff: claims code, never a log, a traceback, an env list or JSON

def test_every_fixture_script_is_claimed() -> None:
    for p in sorted(FX.glob("*.py")):
        assert PROBE.sniff(Sample.read(p)), p


def test_a_traceback_quoting_source_lines_is_not_code(tmp_path: Path) -> None:
    tb = textwrap.dedent('''\
        Traceback (most recent call last):
          File "/workspace/train.py", line 88, in <module>
            for step, batch in enumerate(loader):
          File "/workspace/train.py", line 61, in train
            if dist.get_rank() == 0:
                dist.barrier()
        RuntimeError: NCCL communicator was aborted on rank 1.
        ''')
    assert not PROBE.sniff(_sample(tmp_path, tb))
    assert not PROBE.sniff(_sample(tmp_path, tb, "tb.py"))  # not even named .py


def test_logs_env_lists_and_json_are_not_code(tmp_path: Path) -> None:
    for text in (
        "NCCL_DEBUG=INFO\nNCCL_SOCKET_IFNAME=eth0\nOMP_NUM_THREADS=1\n",
        '{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.4}\n',
        "[rank0]: for step in range(10):\n[rank0]:     loss.backward()\nepoch 1 step 5 loss 2.3\n",
        "import torch failed: no module named torch\nif you see this, reinstall\n",
        "2024-01-01 10:00:00 INFO with 8 GPUs: starting\nfor epoch 1: loss 2.5\n",
    ):
        assert not PROBE.sniff(_sample(tmp_path, text)), text


def test_no_other_captured_evidence_is_claimed() -> None:
    """Over every non-Python file of tests/fixtures and the open bench cases (never the sealed ones)."""
    claimed = []
    for top in (ROOT / "tests" / "fixtures", ROOT / "bench" / "cases"):
        for p in sorted(top.rglob("*")):
            if any(part.startswith("sealed-") for part in p.parts) or not p.is_file() or p.is_symlink():
                continue
            if p.suffix == ".py" or FX in p.parents:
                continue
            try:
                if PROBE.sniff(Sample.read(p)):
                    claimed.append(p)
            except OSError:
                continue
    assert not claimed, claimed[:10]


def test_fenced_python_in_a_ticket_reaches_the_code_kind() -> None:
    facts = _facts(FX / "tickets" / "hang_rank0_validate.md")
    code = facts["code"]
    assert code["files"] and "block" in code["files"][0]
    [hit] = code["rank_conditional_collectives"]
    assert hit["op"] == "all_reduce" and hit["via"] == "evaluate" and "evaluate(model, val_loader)" in hit["code"]


# ---- rank-conditional collectives: both sides

def test_rank0_helper_that_all_reduces_is_found_with_its_line() -> None:
    code = _facts(FX / "ddp_rank0_eval.py")["code"]
    [hit] = code["rank_conditional_collectives"]
    assert (hit["line"], hit["op"], hit["via"], hit["guard"]) == (42, "all_reduce", "validate", "rank == 0")


def test_lightning_sync_dist_under_global_rank_is_found() -> None:
    code = _facts(FX / "lightning_module.py")["code"]
    [hit] = code["rank_conditional_collectives"]
    assert hit["op"] == "log(sync_dist=True)" and hit["guard"] == "self.global_rank == 0"


def test_clean_ddp_and_hf_paired_barrier_have_no_rank_findings() -> None:
    for name in ("ddp_clean.py", "hf_trainer_script.py"):
        code = _facts(FX / name)["code"]
        assert code["rank_conditional_collectives"] == [] and code["rank_conditional_exits"] == [], name


def test_shapes_that_break_and_near_misses_that_do_not(tmp_path: Path) -> None:
    broken = {
        "barrier on rank 0": """
            import torch.distributed as dist
            if dist.get_rank() == 0:
                prepare_cache()
                dist.barrier()
            """,
        "accelerate main process": """
            if accelerator.is_main_process:
                accelerator.wait_for_everyone()
                accelerator.save_state("ckpt")
            """,
        "DDP forward on rank 0": """
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(net, device_ids=[local_rank])
            if is_main_process():
                with torch.no_grad():
                    preds = model(val_batch)
            """,
        "local_rank in [-1, 0] with a gather": """
            import torch.distributed as dist
            if args.local_rank in [-1, 0]:
                dist.all_gather_object(outputs, preds)
            """,
    }
    for name, text in broken.items():
        assert _code(tmp_path, text)["rank_conditional_collectives"], name
    fine = {
        "rank-0 print and save": """
            import torch, torch.distributed as dist
            dist.all_reduce(loss)
            if dist.get_rank() == 0:
                print(loss)
                torch.save(model.state_dict(), "m.pt")
            """,
        "same op in both branches": """
            import torch.distributed as dist
            if rank == 0:
                objs = [config]
                dist.broadcast_object_list(objs, src=0)
            else:
                objs = [None]
                dist.broadcast_object_list(objs, src=0)
            """,
        "distributed-or-not test": """
            import torch.distributed as dist
            if args.local_rank != -1:
                dist.barrier()
            """,
        "rank picks a value": """
            import torch.distributed as dist
            src = 0 if rank == 0 else 1
            dist.broadcast(t, src=src)
            """,
        "functools.reduce and torch.gather under rank 0": """
            from functools import reduce
            if rank == 0:
                total = reduce(lambda a, b: a + b, sizes)
                picked = torch.gather(x, 1, idx)
            """,
    }
    for name, text in fine.items():
        assert _code(tmp_path, text)["rank_conditional_collectives"] == [], name


def test_early_exit_on_one_rank_in_a_ddp_loop() -> None:
    code = _facts(FX / "ddp_early_exit.py")["code"]
    [hit] = code["rank_conditional_exits"]
    assert hit["exit"] == "break" and hit["guard"] == "rank == 0" and hit["line"] == 35


def test_rank0_return_before_a_later_collective_but_not_at_the_end(tmp_path: Path) -> None:
    bad = _code(tmp_path, """
        import torch.distributed as dist
        def save(model, rank):
            if rank != 0:
                return
            write(model)
            dist.barrier()
        """)
    assert bad["rank_conditional_exits"][0]["exit"] == "return"
    ok = _code(tmp_path, """
        import torch
        def save(model, rank):
            if rank != 0:
                return
            torch.save(model.state_dict(), "m.pt")
        """)
    assert ok["rank_conditional_exits"] == []


# ---- host syncs

def test_item_every_step_versus_once_after_the_loop() -> None:
    assert [h["call"] for h in _facts(FX / "ddp_rank0_eval.py")["code"]["host_sync_in_loop"]] == [".item()"]
    clean = _facts(FX / "ddp_clean.py")["code"]  # .item() per epoch and after the loop only
    assert clean["host_sync_in_loop"] == [] and clean["n_host_syncs_every_step"] == 0


def test_a_sync_every_n_steps_is_marked(tmp_path: Path) -> None:
    code = _code(tmp_path, """
        for step, batch in enumerate(loader):
            loss = model(batch).mean()
            loss.backward()
            optimizer.step()
            if step % 100 == 0:
                print(step, loss.item())
        """)
    assert [h["every_n"] for h in code["host_sync_in_loop"]] == [True] and code["n_host_syncs_every_step"] == 0


# ---- settings

def test_settings_of_the_early_exit_script() -> None:
    code = _facts(FX / "ddp_early_exit.py")["code"]
    assert code["sampler_set_epoch_missing"] and code["nccl_without_set_device"] and code["fp16_without_scaler"]
    assert code["dataloaders_main_process"] == 1
    assert [(h["key"], h["loopback"]) for h in code["hardcoded_rendezvous"]] == [("MASTER_ADDR", True), ("MASTER_PORT", False)]
    assert [(lr["optimizer"], lr["high"]) for lr in code["learning_rates"]] == [("Adam", True)]
    assert not code["grad_clipping"]


def test_settings_of_the_careful_scripts() -> None:
    clean = _facts(FX / "ddp_clean.py")["code"]
    assert not clean["sampler_set_epoch_missing"] and not clean["nccl_without_set_device"]
    assert not clean["fp16_without_scaler"] and clean["grad_clipping"] and clean["dataloaders_main_process"] == 0
    hf = _facts(FX / "hf_trainer_script.py")["code"]
    assert not hf["nccl_without_set_device"] and not hf["fp16_without_scaler"] and hf["hardcoded_rendezvous"] == []
    lit = _facts(FX / "lightning_module.py")["code"]
    assert lit["heavy_getitem"][0]["call"] == "Image.open"


# ---- safety and bad input

def test_the_code_is_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    code = _code(tmp_path, f"""
        import os
        os.system("touch {marker}")
        open("{marker}", "w").write("x")
        if __name__ == "__main__":
            exec("import os; os.system('touch {marker}')")
        """)
    assert code["files"] and not marker.exists()


def test_snippets_are_repaired_or_noted_never_raised(tmp_path: Path) -> None:
    code = _facts(FX / "snippet_indented.py")["code"]  # indented, and cut off mid-call
    assert any("read up to line" in n for n in code["notes"])
    assert code["rank_conditional_collectives"][0]["op"] == "barrier"
    bad = _code(tmp_path, "def f(:\n    return ((\nimport x\nfor in in in:\n")
    assert bad["files"] and any("not parseable" in n for n in bad["notes"])
    deep = _code(tmp_path, "import torch\n" + "x = " + "(" * 50000 + "1" + ")" * 50000 + "\n")
    assert deep["files"]  # a RecursionError inside the parser is a note, not a crash


def test_size_is_bounded() -> None:
    big = "import torch\n" + "x = 1\n" * (source.MAX_SOURCE // 6 + 10)
    tree, note = source.parse(big)
    assert "cut" in note


# ---- the rules on whole tickets

def _top(path: Path) -> list[tuple[str, str, str]]:
    rep = diagnose_path(path)
    return [(f.cause, f.severity, f.rule) for f in rep.findings]


def test_hang_ticket_with_rank0_collective_names_collective_mismatch() -> None:
    found = _top(FX / "tickets" / "hang_rank0_validate.md")
    assert ("collective_mismatch", "medium", "CODE001") in found
    assert found[0][0] == "collective_mismatch"


def test_hang_ticket_with_clean_code_gets_no_code_finding() -> None:
    assert not [f for f in _top(FX / "tickets" / "hang_clean_code.md") if f[2].startswith("CODE")]


def test_slow_ticket_names_host_sync_and_loader_as_low_leads() -> None:
    found = [f for f in _top(FX / "tickets" / "slow_item_loop.md") if f[2].startswith("CODE")]
    assert {(c, s) for c, s, _ in found} == {("host_sync_in_loop", "low"), ("dataloader_starvation", "low")}


def test_words_inside_strings_are_not_rank_conditions(tmp_path: Path) -> None:
    code = _code(tmp_path, """
        import sys
        import torch.distributed as dist
        if "--rank-main" in sys.argv:
            dist.barrier()
        if f"{rank}" and mode == "rank":
            dist.all_reduce(t)
        """)
    assert code["rank_conditional_collectives"] == []


def test_printing_a_tensor_every_step_is_a_sync_printing_a_number_is_not(tmp_path: Path) -> None:
    code = _code(tmp_path, """
        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            print(f"step {step}: {loss}")
            print("lr", lr, step)
        """)
    assert [h["call"] for h in code["host_sync_in_loop"]] == ["print(tensor)"]


def test_a_spent_time_budget_leaves_a_note_not_an_error(tmp_path: Path, monkeypatch: Any) -> None:
    from doctor.probes.code import scan

    monkeypatch.setattr(scan, "TIME_BUDGET_S", -1.0)
    code = _facts(FX / "ddp_rank0_eval.py")["code"]
    assert any("scan stopped" in n for n in code["notes"]) and code["rank_conditional_collectives"] == []


def test_report_has_a_code_section_with_each_place_noted(tmp_path: Path) -> None:
    """The report lists what the scan found at file:line, marking the places hang rules read."""
    from doctor.render import view

    (tmp_path / "train.py").write_text((ROOT / "tests/fixtures/code/ddp_early_exit.py").read_text())
    report = diagnose_path(tmp_path)
    sec = view.section(report, "code")
    assert sec is not None
    rows = {(r.cells[1].text, r.cells[2].text): r.marks for r in sec.body.rows}
    exits = [k for k in rows if k[0] == "early exit under a rank condition"]
    assert exits and rows[exits[0]] == ("LOOK",)
    assert all(r.cells[0].text.startswith("train.py:") for r in sec.body.rows)
    setup = dict(view.section(report, "code-setup").body.items)
    assert setup["device setup"].startswith("nccl with no torch.cuda.set_device")


def test_no_code_section_without_code(tmp_path: Path) -> None:
    from doctor.render import view

    (tmp_path / "train.log").write_text("step 1 loss 2.0\nstep 2 loss 1.9\n")
    assert view.section(diagnose_path(tmp_path), "code") is None
