"""Single-turn RLVR: one prompt, ``n_samples`` completions sampled concurrently, verifiable rewards."""

from __future__ import annotations

import functools
from typing import Any

import attrs

from areal_core.config import GenerationConfig
from areal_core.api.dataset import reward_data
from areal_core.api.engine import GenerationRequest, GenerationResponse, InferenceEngine, SamplingParams
from areal_core.rollout.dataloader import EPOCH_KEY
from areal_core.api.workflow import (
    RewardScorer,
    TokenSequence,
    decode_ids,
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
        """The group: one ``agenerate_group`` call for its samples, one ``score_many`` for their rewards."""
        prompt_ids = list(self._encode(data["prompt"]))
        n = self.gconfig.n_samples
        requests = [GenerationRequest(input_ids=prompt_ids, sampling=self._sampling(data, i)) for i in range(n)]
        responses = await engine.agenerate_group(requests)
        kept = [stop_at_strings(self.tokenizer, r.output_ids, self.gconfig.stop) for r in responses]
        completions = [decode_ids(self.tokenizer, r.output_ids[:k]) for r, k in zip(responses, kept)]
        rewards = await self.reward_runner.score_many([(data["prompt"], c, reward_data(data)) for c in completions])
        return [
            self._trajectory(data, prompt_ids, i, *sample)
            for i, sample in enumerate(zip(responses, kept, completions, rewards))
        ]

    def _sampling(self, data: dict[str, Any], index: int) -> SamplingParams:
        if self.seed is None:
            return self.sampling
        return attrs.evolve(self.sampling, seed=request_seed(self.seed, data["id"], data.get(EPOCH_KEY, 0), index))

    def _trajectory(
        self,
        data: dict[str, Any],
        prompt_ids: list[int],
        index: int,
        response: GenerationResponse,
        n_kept: int,
        completion: str,
        reward: float,
    ) -> Trajectory:
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
