"""The reward of a trained policy itself: completions sampled from a run's final model, scored.

A run's "final reward" in its stats is the mean reward of its last training batches. An
asynchronous run's batches come from policies up to ``rollout.max_head_offpolicyness`` versions
older than the step that trains on them, so while rewards still climb that figure trails a
synchronous run's even where both runs end with equally good models. :func:`sampled_reward` scores
the final model the same way for any run: ``samples`` completions of every training item, sampled
as the run's servers sample (its temperature, top_p, max_new_tokens, stop tokens and strings), from
one fixed seed, so two runs are compared on common random numbers.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch
import transformers

from areal_core.api.dataset import reward_data
from areal_core.api.workflow import decode_ids, encode_chat, sampling_params, stop_at_strings
from areal_core.config import Config
from areal_core.dataset_loading import load_dataset
from areal_core.plugins import Plugins


def sampled_reward(model_dir: Path, config: Config, plugins: Plugins, samples: int, seed: int = 0) -> float:
    """Mean reward of ``samples`` completions per item of ``config``'s training set from ``model_dir``."""
    transformers.utils.logging.disable_progress_bar()  # no weight-loading bar in the bench's output
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    reward = plugins.get("reward", config.reward.name)
    sampling = sampling_params(config.gconfig, tokenizer)
    stop_ids = list(sampling.stop_token_ids)
    torch.manual_seed(seed)
    scores: list[float] = []
    for item in load_dataset(config.train_dataset, "train", plugins):
        prompt_ids = encode_chat(tokenizer, [{"role": "user", "content": item["prompt"]}], add_generation_prompt=True)
        prompts = torch.tensor([prompt_ids] * samples)
        with torch.inference_mode():
            rows = model.generate(
                prompts, attention_mask=torch.ones_like(prompts), do_sample=True, temperature=sampling.temperature,
                top_p=sampling.top_p, top_k=0, max_new_tokens=sampling.max_new_tokens, eos_token_id=stop_ids,
                pad_token_id=stop_ids[0],
            )  # fmt: skip
        for row in rows[:, len(prompt_ids) :].tolist():
            output = row[: next((i for i, t in enumerate(row) if t in stop_ids), len(row))]
            completion = decode_ids(tokenizer, output[: stop_at_strings(tokenizer, output, config.gconfig.stop)])
            scores.append(float(reward(item["prompt"], completion, **reward_data(item))))
    return statistics.fmean(scores)
