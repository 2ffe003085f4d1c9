"""GSM8K with GRPO: the same script on CPU, CUDA and Ascend NPU; only the YAML differs.

    python -m areal_core.launcher.local examples/math/gsm8k_rl.py --config examples/math/gsm8k_grpo_cpu.yaml
    python -m areal_core.launcher.local examples/math/gsm8k_rl.py --config examples/math/gsm8k_grpo_cuda.yaml
    python -m areal_core.launcher.local examples/math/gsm8k_rl.py --config examples/math/gsm8k_grpo_npu.yaml

Each prompt is a GSM8K question plus an instruction to put the final answer in ``\\boxed{}``;
the reward is the built-in ``math`` reward (math-verify equivalence with the gold ``#### N``).
Every ``stats.eval_every`` steps, and after the last one, the servers answer the held-out slice
(``valid_dataset``) greedily and the accuracy is logged as ``eval/accuracy``.
"""

from __future__ import annotations

import attrs

from areal_core.config import Config, DatasetConfig
from areal_core.launcher import script_main
from areal_core.trainer import Trainer

BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def with_boxed_instruction(dataset: DatasetConfig | None) -> DatasetConfig | None:
    """``dataset`` asking for a ``\\boxed{}`` answer unless its ``options.instruction`` says otherwise."""
    if dataset is None or "instruction" in dataset.options:
        return dataset
    return attrs.evolve(dataset, options={**dataset.options, "instruction": BOXED_INSTRUCTION})


def main(config: Config) -> None:
    config = attrs.evolve(
        config,
        train_dataset=with_boxed_instruction(config.train_dataset),
        valid_dataset=with_boxed_instruction(config.valid_dataset),
    )
    summary = Trainer(config).run()
    print(summary.render())


if __name__ == "__main__":
    script_main(main)
