"""Agentic RL on CPU: the calculator agent (calc_agent.py) trained through the OpenAI proxy.

    python -m areal_core.launcher.local examples/agent/train.py --config examples/agent/config.yaml

The agent only talks to an OpenAI ``base_url``; every model call it makes goes through the proxy,
which records the exact tokens, log-probs and weight versions, and the agent's reward turns them
into trajectories. By default the agent is awaited in-process; ``agent.command=[python,
examples/agent/calc_agent.py]`` runs it as a separate program per sample instead.
"""

import sys
from pathlib import Path

import attrs

from areal_core.agent import agent_workflow
from areal_core.config import Config
from areal_core.api.dataset import corpus
from areal_core.dataset_loading import load_dataset
from areal_core.launcher import script_main
from areal_core.tiny_model import ensure_tiny_model
from areal_core.trainer import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calc_agent


def with_agent_model(config: Config) -> Config:
    """Build the tiny model with a tokenizer that also covers what the agent says (its retry turn)."""
    if config.model.path:
        return config
    items = load_dataset(config.train_dataset, "train")
    if config.valid_dataset is not None:
        items += load_dataset(config.valid_dataset, "valid")
    texts = corpus(items) + [calc_agent.FEEDBACK]
    path = ensure_tiny_model(config.model.tiny, texts, Path(config.fileroot) / "models", config.seed)
    return attrs.evolve(config, model=attrs.evolve(config.model, path=str(path)))


def main(config: Config) -> None:
    agent = None if config.agent.command else calc_agent.solve
    summary = Trainer(with_agent_model(config), workflow=agent_workflow(agent)).run()
    print(summary.render())


if __name__ == "__main__":
    script_main(main)
