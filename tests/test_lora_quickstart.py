"""examples/quickstart/lora.yaml end to end, shortened (the 250-step run is not a test): the LoRA
policy trains, only its adapter reaches the server, and checkpoints/final/ is a peft adapter
naming its base model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from quickstart_runs import REPO, SCRIPT, SHORT_RUN, rewards
from safetensors.torch import load_file

pytestmark = pytest.mark.slow
LORA_CONFIG = REPO / "examples" / "quickstart" / "lora.yaml"


def test_lora_quickstart_trains_and_ships_the_adapter_only(tmp_path):
    args = ["--config", str(LORA_CONFIG), f"fileroot={tmp_path}", "trial_name=smoke", *SHORT_RUN, "actor.kl_coef=0.01"]
    run = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    run_dir = tmp_path / "quickstart_lora" / "smoke"
    assert len(rewards(run_dir)) == 4
    rows = [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines()]
    assert all(row["train/kl_ref"] >= 0 for row in rows)  # kl_coef > 0: the base model is the reference
    final = run_dir / "checkpoints" / "final"
    adapter = load_file(final / "adapter_model.safetensors")
    assert adapter and all(".lora_A." in name or ".lora_B." in name for name in adapter)
    assert not (final / "model.safetensors").exists()
    base = json.loads((final / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert (Path(base) / "config.json").is_file()  # the base model the adapter goes with
    (published,) = (run_dir / "weights").iterdir()  # the servers got v4's adapter, and nothing else
    assert published.name == "v4" and sorted(p.name for p in published.glob("*.safetensors")) == ["adapter_model.safetensors"]
