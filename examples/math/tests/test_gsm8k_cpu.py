"""The GSM8K example end to end on CPU with real GSM8K prompts, and its three configs.

With the tiny random model the rewards and the held-out accuracy are ~0: the run checks the
pipeline (prompts, math reward, GRPO steps, weight updates, greedy eval), not learning.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "math"
SHARED = REPO / ".." / "shared" / "data" / "gsm8k"
needs_data = pytest.mark.skipif(
    not SHARED.is_dir(), reason=f"no local GSM8K copy at {SHARED} (the configs' default, openai/gsm8k, needs the hub)"
)


def _run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=False, cwd=REPO, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@needs_data
def test_cpu_config_runs_end_to_end_on_gsm8k(tmp_path: Path) -> None:
    cmd = [
        sys.executable, "-m", "areal_core.launcher.local", str(EXAMPLE / "gsm8k_rl.py"),
        "--config", str(EXAMPLE / "gsm8k_grpo_cpu.yaml"), f"fileroot={tmp_path}",
        "total_train_steps=3", "stats.eval_every=3", "stats.progress=false", "valid_dataset.size=8",
        f"train_dataset.path={SHARED}", f"valid_dataset.path={SHARED}",
    ]  # fmt: skip
    run = _run(cmd, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    run_dir = tmp_path / "gsm8k-cpu" / "trial0"
    rows = [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert all(0.0 <= row["reward/mean"] <= 1.0 and row["rollout/reward_errors"] == 0 for row in rows)
    assert 0.0 <= rows[-1]["eval/accuracy"] <= 1.0  # ~0 with the tiny model: expected
    assert "held-out greedy accuracy" in run.stdout
    assert (run_dir / "checkpoints" / "final" / "config.json").is_file()
    assert (run_dir / "reward_curve.png").is_file()
    resolved = (run_dir / "config.yaml").read_text()
    assert "\\boxed{}" in resolved and "gsm8k" in resolved


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cpu", "cuda", "npu"])
def test_every_config_validates_here(name: str) -> None:
    run = _run(["areal", "config", str(EXAMPLE / f"gsm8k_grpo_{name}.yaml")])
    if name == "cuda" and "engine 'sglang' is not installed" in run.stderr:
        pytest.skip("plugins/engine_sglang is not installed here")
    assert run.returncode == 0, run.stderr
    assert f"platform: {name}" in run.stdout and "path: openai/gsm8k" in run.stdout
    assert "areal: note: train_dataset.path: 'openai/gsm8k' is fetched from the hub when the run loads data" in run.stderr
    if name != "cpu":  # valid for that machine; here one warning line says why it would not run
        warnings = [line for line in run.stderr.splitlines() if line.startswith("areal: warning: platform:")]
        assert len(warnings) == 1 and "not available on this machine" in warnings[0]


@pytest.mark.slow
def test_running_the_npu_config_here_fails_in_one_line() -> None:
    from areal_platform_npu.platform import NpuPlatform

    if NpuPlatform.is_available():
        pytest.skip("an Ascend host")
    launcher = [sys.executable, "-m", "areal_core.launcher.local"]
    run = _run([*launcher, str(EXAMPLE / "gsm8k_rl.py"), "--config", str(EXAMPLE / "gsm8k_grpo_npu.yaml")])
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    assert run.stderr.startswith("areal: error: platform: 'npu' is installed but not available on this machine (")
    assert "torch_npu is not installed" in run.stderr


def test_the_script_asks_for_a_boxed_answer_unless_told_otherwise() -> None:
    sys.path.insert(0, str(EXAMPLE))
    try:
        from gsm8k_rl import BOXED_INSTRUCTION, with_boxed_instruction
    finally:
        sys.path.remove(str(EXAMPLE))
    from areal_core.config import DatasetConfig

    assert "\\boxed{}" in BOXED_INSTRUCTION
    assert with_boxed_instruction(DatasetConfig(name="gsm8k")).options["instruction"] == BOXED_INSTRUCTION
    custom = DatasetConfig(name="gsm8k", options={"instruction": "Answer after ####."})
    assert with_boxed_instruction(custom) is custom and with_boxed_instruction(None) is None
