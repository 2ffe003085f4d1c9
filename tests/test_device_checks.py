"""The device checks (scripts/device_check_{cuda,npu}.sh, scripts/device_check_xccl.py) on a CPU
machine: they parse, ``--help`` and ``--dry-run`` list every step with PASS/FAIL/SKIP/PLAN, the
steps that need two devices are SKIPped with the reason, and the xccl check itself runs end to
end on the cpu platform with the hf engine (the path a device takes, with gloo)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "scripts").glob("device_check_*.sh"))
STEPS = {
    "cuda": ["platform_tests", "vllm_nccl_weight_transfer", "sglang_nccl_weight_group", "sglang_engine_tests",
             "logprob_memory_gpu"],
    "npu": ["npu_platform_on_hardware", "vllm_ascend_hccl_registered", "vllm_ascend_hccl_weight_transfer",
            "logprob_memory_npu"],
}  # fmt: skip


def _bash(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse(script: Path) -> None:
    run = _bash("-n", str(script))
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize("kind", sorted(STEPS))
def test_help_prints_the_header_and_bad_options_are_one_usage_line(kind: str) -> None:
    run = _bash(f"scripts/device_check_{kind}.sh", "--help")
    assert run.returncode == 0 and "--dry-run" in run.stdout
    assert all(name in run.stdout for name in STEPS[kind])  # every step is described
    bad = _bash(f"scripts/device_check_{kind}.sh", "--nope")
    assert bad.returncode == 2 and bad.stderr.strip() == f"usage: bash scripts/device_check_{kind}.sh [--dry-run | --help]"


@pytest.mark.parametrize("kind", sorted(STEPS))
def test_dry_run_lists_one_line_per_step_and_skips_what_needs_two_devices(kind: str, tmp_path: Path) -> None:
    run = subprocess.run(
        ["bash", f"scripts/device_check_{kind}.sh", "--dry-run"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "AREAL_CHECK_DIR": str(tmp_path)},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = run.stdout.split("summary ================\n", 1)[1].strip().splitlines()
    assert [re.match(r"(PLAN|SKIP)  (\S+)  \(", line).group(2) for line in lines] == STEPS[kind]  # type: ignore[union-attr]
    transfer = next(line for line in lines if "weight_transfer" in line)
    assert transfer.startswith("SKIP") and re.search(r"needs 2 (GPUs|NPUs) .*; found 0\)$", transfer)
    assert list(tmp_path.iterdir()) == []  # a dry run writes no logs


def test_xccl_check_parses_and_dry_runs_without_starting_anything() -> None:
    script = str(ROOT / "scripts" / "device_check_xccl.py")
    run = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0 and "--expect-backend" in run.stdout
    args = ["--platform", "npu", "--engine", "hf", "--dry-run"]
    run = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=60, check=False)
    assert run.stdout.strip() == "XCCL_CHECK DRY-RUN platform=npu engine=hf updater=xccl", run.stderr
    args = ["--platform", "cuda", "--engine", "nope", "--dry-run"]
    run = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 1 and run.stdout.startswith("XCCL_CHECK FAIL engine 'nope' is not installed")


@pytest.mark.slow
def test_xccl_check_runs_end_to_end_on_cpu_with_the_hf_engine(tmp_path: Path) -> None:
    script = str(ROOT / "scripts" / "device_check_xccl.py")
    args = ["--platform", "cpu", "--engine", "hf", "--expect-backend", "gloo", "--workdir", str(tmp_path)]
    run = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert re.search(r"^XCCL_CHECK OK platform=cpu backend=gloo engine=hf ", run.stdout, re.MULTILINE), run.stdout[-2000:]

