"""Multi-turn retry: a wrong answer gets a feedback turn and another try, up to ``max_turns``.

Each of the ``n_samples`` conversations becomes one trajectory: the prompt, then for each turn
the sampled assistant tokens (loss mask 1) followed by the feedback turn's template tokens (mask
0). The reward of the final turn is discounted by ``gamma ** turn_index``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from areal_core.config import GenerationConfig
from areal_core.api.dataset import reward_data
from areal_core.api.engine import GenerationRequest, InferenceEngine
from areal_core.api.workflow import (
    RewardScorer,
    TokenSequence,
    decode_ids,
    encode_chat,
    sampling_params,
    stop_at_strings,
)
from areal_core.api.trajectory import Trajectory

FEEDBACK = "Your answer is wrong. Please try again."


class MultiTurnWorkflow:
    """A turn succeeds when its reward is above ``success_threshold``; ``data`` as for RLVR."""

    def __init__(
        self,
        tokenizer: Any,
        gconfig: GenerationConfig,
        reward_runner: RewardScorer,
        *,
        max_turns: int = 2,
        gamma: float = 0.9,
        feedback: str = FEEDBACK,
        success_threshold: float = 0.0,
    ) -> None:
        if max_turns < 1 or not 0.0 < gamma <= 1.0:
            raise ValueError(f"need max_turns >= 1 and 0 < gamma <= 1, got max_turns={max_turns}, gamma={gamma}")
        self.tokenizer = tokenizer
        self.gconfig = gconfig
        self.reward_runner = reward_runner
        self.max_turns = max_turns
        self.gamma = gamma
        self.feedback = feedback
        self.success_threshold = success_threshold
        self.sampling = sampling_params(gconfig, tokenizer)

    async def __call__(self, engine: InferenceEngine, data: dict[str, Any]) -> list[Trajectory]:
        return list(await asyncio.gather(*(self._conversation(engine, data) for _ in range(self.gconfig.n_samples))))

    async def _conversation(self, engine: InferenceEngine, data: dict[str, Any]) -> Trajectory:
        messages = [{"role": "user", "content": data["prompt"]}]
        seq = TokenSequence()
        seq.add_context(encode_chat(self.tokenizer, messages, add_generation_prompt=True))
        turn = 0
        while True:
            response = await engine.agenerate(GenerationRequest(input_ids=list(seq.input_ids), sampling=self.sampling))
            n_kept = stop_at_strings(self.tokenizer, response.output_ids, self.gconfig.stop)
            completion = decode_ids(self.tokenizer, response.output_ids[:n_kept])
            seq.add_output(response, n_kept)
            reward = await self.reward_runner.score(data["prompt"], completion, reward_data(data))
            if reward > self.success_threshold or turn + 1 == self.max_turns:
                info = {"turns": turn + 1, "raw_reward": reward, "completion": completion}
                return seq.to_trajectory(str(data["id"]), reward * self.gamma**turn, info)
            messages.append({"role": "assistant", "content": completion})
            seq.add_context(self._feedback_ids(messages))
            messages.append({"role": "user", "content": self.feedback})
            turn += 1

    def _feedback_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """Template tokens between the assistant's answer and the next generation (the feedback turn)."""
        before = encode_chat(self.tokenizer, messages, add_generation_prompt=False)
        after = encode_chat(
            self.tokenizer, messages + [{"role": "user", "content": self.feedback}], add_generation_prompt=True
        )
        if after[: len(before)] != before:
            raise ValueError(
                "the chat template renders earlier turns differently once a turn is added; "
                "MultiTurnWorkflow needs a prefix-stable template"
            )
        return after[len(before) :]
