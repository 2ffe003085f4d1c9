"""Single-turn RLVR: one prompt, ``n_samples`` completions sampled concurrently, verifiable rewards."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import attrs

from areal_core.config import GenerationConfig
from areal_core.api.dataset import reward_data
from areal_core.api.engine import GenerationRequest, InferenceEngine
from areal_core.rollout.dataloader import EPOCH_KEY
from areal_core.api.workflow import (
    RewardScorer,
    TokenSequence,
    encode_chat,
    request_seed,
    sampling_params,
    stop_at_strings,
)
from areal_core.api.trajectory import Trajectory

PROMPT_CACHE_SIZE = 4096  # token ids of this many recent prompts are kept


class RLVRWorkflow:
    """``data`` needs ``"id"`` and ``"prompt"``; every other field is passed to the reward.

    With ``seed`` set, sample ``i`` of an item in epoch ``e`` is drawn with a seed derived from
    ``(seed, id, e, i)``, so a run (or a recovered run) repeats its rollouts exactly.
    """

    def __init__(
        self,
        tokenizer: Any,
        gconfig: GenerationConfig,
        reward_runner: RewardScorer,
        *,
        greedy: bool = False,
        seed: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.gconfig = gconfig
        self.reward_runner = reward_runner
        self.sampling = sampling_params(gconfig, tokenizer, greedy=greedy)
        self.seed = seed
        # prompts come back every epoch: render the chat template once per prompt
        self._encode = functools.lru_cache(maxsize=PROMPT_CACHE_SIZE)(self._encode_prompt)

    def _encode_prompt(self, prompt: str) -> tuple[int, ...]:
        return tuple(encode_chat(self.tokenizer, [{"role": "user", "content": prompt}], add_generation_prompt=True))

    async def __call__(self, engine: InferenceEngine, data: dict[str, Any]) -> list[Trajectory]:
        prompt_ids = list(self._encode(data["prompt"]))
        return list(
            await asyncio.gather(*(self._sample(engine, data, prompt_ids, i) for i in range(self.gconfig.n_samples)))
        )

    async def _sample(
        self, engine: InferenceEngine, data: dict[str, Any], prompt_ids: list[int], index: int
    ) -> Trajectory:
        sampling = self.sampling
        if self.seed is not None:
            sampling = attrs.evolve(sampling, seed=request_seed(self.seed, data["id"], data.get(EPOCH_KEY, 0), index))
        response = await engine.agenerate(GenerationRequest(input_ids=prompt_ids, sampling=sampling))
        n_kept = stop_at_strings(self.tokenizer, response.output_ids, self.gconfig.stop)
        completion = self.tokenizer.decode(response.output_ids[:n_kept], skip_special_tokens=True)
        reward = await self.reward_runner.score(data["prompt"], completion, reward_data(data))
        seq = TokenSequence()
        seq.add_context(prompt_ids)
        seq.add_output(response, n_kept)
        stop_reason = "stop" if n_kept < len(response.output_ids) else response.stop_reason
        info = {
            "stop_reason": stop_reason,
            "latency": response.latency,
            "completion": completion,
            "epoch": data.get(EPOCH_KEY, 0),
            "sample_index": index,
        }
        return seq.to_trajectory(str(data["id"]), reward, info)
