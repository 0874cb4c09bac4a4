"""``python -m torch.utils.collect_env`` output as env facts (every PyTorch issue form has it under
"### Versions").

The two fixtures are real runs of torch's own script (tests/fixtures/collect_env: an H200 host with
a CUDA 13.0 wheel, and this CPU machine); the multi-GPU and old-driver variants change only the
lines the script prints differently in those cases (torch/utils/collect_env.py: the GPU list starts
on its own line when several GPUs are listed, ``maybe_start_on_next_line``). The claims: the
versions, GPUs and packages are read; the report is context and never a finding by itself, bare
or fenced in a ticket; and rules can read what it says (the paths are in the schema, CEL sees them).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from doctor.probes import env as env_probe

from doctor.engine import celexpr
from doctor.engine import facts as facts_mod
from doctor.engine.diagnose import diagnose_path

FIX = Path(__file__).parent / "fixtures"
H200 = FIX / "collect_env" / "h200-torch2.11-cu130.txt"
CPU = FIX / "collect_env" / "cpu-torch2.13.txt"
NCCL_LOG = FIX / "logs" / "nccl_bad_ifname" / "torchrun.log"


def _facts(path: Path) -> dict:
    facts, _ = facts_mod.build(facts_mod.items_from_folder(path), "loose")
    return facts


def _eight_gpus(text: str) -> str:
    """The same report as collect_env prints it for a host with eight GPUs."""
    listing = "\n".join(f"GPU {i}: NVIDIA H200" for i in range(8))
    return text.replace("GPU models and configuration: GPU 0: NVIDIA H200",
                        f"GPU models and configuration: \n{listing}\n")


def test_real_gpu_report() -> None:
    env = _facts(H200)["env"]
    v = env["versions"]
    assert (v["torch"], v["cuda_build"], v["driver"], v["nccl"], v["cudnn"]) == (
        "2.11.0+cu130", "13.0", "580.159.04", "2.28.9", "9.14.0")
    assert v["os"].startswith("Ubuntu 24.04") and v["python"] == "3.12.3"
    assert env["gpu_models"] == ["NVIDIA H200"] and env["gpu_count"] == 1
    assert env["cuda_available"] is True and env["driver_below_cuda_minimum"] is False
    assert env["packages"]["nvidia-nccl-cu13"] == "2.28.9" and env["packages"]["torch"] == "2.11.0"


def test_real_cpu_report_leaves_out_what_was_not_collected() -> None:
    env = _facts(CPU)["env"]
    assert env["versions"]["torch"] == "2.13.0+cpu"
    assert "driver" not in env["versions"] and "cuda_build" not in env["versions"]  # "Could not collect"
    assert env["gpu_count"] == 0 and env["cuda_available"] is False


def test_gpu_list_on_its_own_lines(tmp_path: Path) -> None:
    f = tmp_path / "versions.txt"
    f.write_text(_eight_gpus(H200.read_text()))
    env = _facts(f)["env"]
    assert env["gpu_count"] == 8 and set(env["gpu_models"]) == {"NVIDIA H200"}
    assert env["versions"]["driver"] == "580.159.04"  # the line after the list is still read


@pytest.mark.parametrize("driver,below", [("535.104.05", True), ("580.65.06", False), ("470.82.01", True)])
def test_driver_below_the_cuda_minimum(tmp_path: Path, driver: str, below: bool) -> None:
    f = tmp_path / "versions.txt"
    f.write_text(H200.read_text().replace("Nvidia driver version: 580.159.04", f"Nvidia driver version: {driver}"))
    assert _facts(f)["env"]["driver_below_cuda_minimum"] is below


@pytest.mark.parametrize("path", [H200, CPU], ids=["h200", "cpu"])
def test_a_report_alone_is_never_a_finding(path: Path) -> None:
    report = diagnose_path(path)
    assert report.findings == [] and report.exit_code == 3


def test_in_an_issue_form_it_is_context_and_the_log_is_evidence(tmp_path: Path) -> None:
    """GitHub's bug form: the log fenced, collect_env pasted bare under "### Versions"."""
    doc = tmp_path / "issue.md"
    doc.write_text("### 🐛 Describe the bug\n\nInit fails on our cluster.\n\n```\n" + NCCL_LOG.read_text()
                   + "```\n\n### Versions\n\n" + H200.read_text() + "\ncc @alice\n")
    facts = _facts(doc)
    assert {"env", "logs"} <= set(facts["evidence"]["kinds"])
    assert facts["env"]["versions"]["nccl"] == "2.28.9"
    assert any("block 2" in d and d.endswith(": env") for d in facts["evidence"]["documents"])
    plain = sorted((f.cause, f.severity) for f in diagnose_path(NCCL_LOG).findings)
    assert sorted((f.cause, f.severity) for f in diagnose_path(doc).findings if not f.rule.startswith("SYM")) == plain
    alone = tmp_path / "versions-only.md"
    alone.write_text("### Versions\n\n" + H200.read_text())
    assert [f for f in diagnose_path(alone).findings if not f.rule.startswith("SYM")] == []


def test_rules_can_read_it(tmp_path: Path) -> None:
    """The paths are in the facts schema (so ``rules lint`` accepts a rule on them) and CEL
    evaluates them: NCCL's version for nccl_version_issue rules, torch's CUDA against the driver."""
    schema = facts_mod.schema()
    for src in ('env.versions.nccl.startsWith("2.18")', "env.driver_below_cuda_minimum",
                'size(env.versions_differ) > 0 && "nccl" in env.versions_differ', "env.gpu_count < 8"):
        assert celexpr.check_paths(src, schema, {"env"}) == [], src
    hosts = tmp_path / "hosts"
    hosts.mkdir()
    (hosts / "node1-versions.txt").write_text(H200.read_text())
    (hosts / "node2-versions.txt").write_text(H200.read_text().replace("nvidia-nccl-cu13==2.28.9",
                                                                         "nvidia-nccl-cu13==2.27.3"))
    env = _facts(hosts)["env"]
    ctx = celexpr.cel().Context({"env": env})
    run = lambda src: celexpr.compile_expr(src).program.execute(ctx)  # noqa: E731
    assert run('"nccl" in env.versions_differ') is True
    assert run("env.version_values.nccl") == ["2.28.9", "2.27.3"]
    assert run("env.driver_below_cuda_minimum") is False


def test_sniff_wants_the_report_not_a_mention() -> None:
    assert env_probe.is_collect_env(H200.read_text())
    assert not env_probe.is_collect_env("We run PyTorch version: 2.1 on 8 nodes; it hangs at init.\n")


def test_a_log_that_prints_the_report_first(tmp_path: Path) -> None:
    """Some launch scripts print collect_env before training: the log stays the logs kind's, env
    reads the versions besides, and the log's later "Key: value" lines are not taken for them."""
    f = tmp_path / "train.log"
    f.write_text(H200.read_text() + NCCL_LOG.read_text() + "OS: not the report's\n")
    facts = _facts(f)
    assert {"env", "logs"} <= set(facts["evidence"]["kinds"])
    assert facts["env"]["versions"]["os"].startswith("Ubuntu 24.04")
    plain = sorted((x.cause, x.severity) for x in diagnose_path(NCCL_LOG).findings)
    assert sorted((x.cause, x.severity) for x in diagnose_path(f).findings) == plain


def test_a_pasted_package_list_alone_is_read_as_packages(tmp_path: Path) -> None:
    """Tickets often paste only collect_env's library list: two NCCL packages side by side must
    reach env.packages (NET023 reads them), a stray [pip3] mention must not make an env file."""
    listing = ("[pip3] nvidia-nccl-cu12==2.29.3\n[pip3] nvidia-nccl-cu13==2.29.7\n"
               "[pip3] torch==2.10.0\n[conda] numpy 1.26.4 py311h_0 conda-forge\n")
    assert env_probe.is_package_list(listing)
    assert not env_probe.is_package_list("we installed [pip3] torch==2.1.0 yesterday\nand then\nit broke\n")
    (tmp_path / "pkgs.txt").write_text(listing)
    env = _facts(tmp_path)["env"]
    assert env["packages"]["nvidia-nccl-cu13"] == "2.29.7" and env["versions"]["nccl"] == "2.29.7"
