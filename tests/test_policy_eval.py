"""bench/policy_eval.py: the sampled reward of a model matches the reward it expects exactly.

With one new token, the arith reward of ``a+b=`` is the probability of the sum's one digit under
the temperature-scaled softmax, which one forward pass gives; the model's logits are made peaked
so that a temperature ignored, a wrong prompt or a wrong token would each move the estimate.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import transformers

from areal_core.api.workflow import encode_chat
from areal_core.config import Config, load_config
from areal_core.dataset_loading import load_dataset
from areal_core.plugins import load_plugins
from areal_core.tiny_model import ensure_tiny_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from policy_eval import sampled_reward  # noqa: E402

SAMPLES, TEMPERATURE = 1000, 0.7


def exact_reward(model: transformers.PreTrainedModel, tokenizer, items: list[dict[str, str]]) -> float:
    """Mean over items of the probability that the first sampled token is the whole answer."""
    total = 0.0
    for item in items:
        if len(item["answer"]) != 1:
            continue
        ids = encode_chat(tokenizer, [{"role": "user", "content": item["prompt"]}], add_generation_prompt=True)
        with torch.inference_mode():
            logits = model(torch.tensor([ids])).logits[0, -1]
        total += float(torch.softmax(logits / TEMPERATURE, -1)[tokenizer.convert_tokens_to_ids(item["answer"])])
    return total / len(items)


def test_the_sampled_reward_estimates_the_expected_reward(tmp_path):
    config = load_config(None, ["gconfig.max_new_tokens=1", f"gconfig.temperature={TEMPERATURE}"])
    plugins = load_plugins()
    items = load_dataset(config.train_dataset, "train", plugins)
    built = ensure_tiny_model(Config().model.tiny, [i["prompt"] + i["answer"] for i in items], tmp_path, seed=0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(built)
    model = transformers.AutoModelForCausalLM.from_pretrained(built, dtype=torch.float32).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)  # random init is near uniform over the 13 tokens; this is not
    model.save_pretrained(tmp_path / "peaked")
    tokenizer.save_pretrained(tmp_path / "peaked")
    expected = exact_reward(model, tokenizer, items)
    assert 0.01 < expected < 0.04  # far from 0, from 1/13 (uniform) and from 0.044 (the temperature ignored)
    samples = len(items) * SAMPLES
    tolerance = 4 * (expected * (1 - expected) / samples) ** 0.5
    assert sampled_reward(tmp_path / "peaked", config, plugins, SAMPLES) == pytest.approx(expected, abs=tolerance)
