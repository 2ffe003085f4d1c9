"""Quickstart: asynchronous GRPO on a synthetic arithmetic task with a tiny Qwen3, on CPU.

    python -m areal_core.launcher.local examples/quickstart/train.py --config examples/quickstart/config.yaml

This script is the controller: the Trainer starts the hf inference server(s) and the FSDP2
training worker(s) as separate processes, keeps rollouts flowing under the staleness bound,
trains on each batch and pushes new weights to the servers after every step.
"""

from areal_core.config import Config
from areal_core.launcher import script_main
from areal_core.trainer import Trainer


def main(config: Config) -> None:
    summary = Trainer(config).run()
    print(summary.render())


if __name__ == "__main__":
    script_main(main)
