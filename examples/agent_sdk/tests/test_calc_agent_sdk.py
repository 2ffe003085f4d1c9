"""The OpenAI Agents SDK calculator agent: its tool, and three steps of ``areal run`` training it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1]
REPO = EXAMPLE.parents[1]
SHORT_RUN = [  # few agent processes at a time: each starts an interpreter and imports the SDK
    "total_train_steps=3",
    "gconfig.n_samples=2",
    "train_dataset.batch_size=2",
    "rollout.max_concurrent_rollouts=2",
    "valid_dataset.size=2",
    "stats.eval_every=3",
    "stats.progress=false",
]

pytest.importorskip("agents", reason="the agents-test extra: bash scripts/install_agents_test.sh, then run this file with .venv-agents/bin/python -m pytest")
sys.path.insert(0, str(EXAMPLE))

from sdk_calc_agent import add


def test_calculator_tool() -> None:
    assert add("3+4=") == "7" and add("a+1").startswith("error")


@pytest.mark.slow
def test_areal_run_trains_the_sdk_agent(tmp_path: Path) -> None:
    """Every episode runs the SDK agent as a program through the proxy's Responses API; none fails."""
    cmd = [
        sys.executable, "-m", "areal_core.cli", "run", str(EXAMPLE / "config.yaml"), f"fileroot={tmp_path}",
        f"agent.command=[{sys.executable}, {EXAMPLE / 'sdk_calc_agent.py'}]", *SHORT_RUN,
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "agent_sdk" / "trial0" / "stats.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    for row in rows:
        assert row["rollout/failed"] == 0 and row["perf/output_tokens"] > 0
    assert (tmp_path / "agent_sdk" / "trial0" / "checkpoints" / "final" / "config.json").exists()
