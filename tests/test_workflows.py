"""RLVR and multi-turn workflows: token layout, masks, rewards (real reward runner), stop handling."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rollout_doubles import ScriptedEngine

from areal_core.config import GenerationConfig
from areal_core.api.engine import GenerationRequest
from areal_core.builtin.rewards.synthetic import exact_match
from areal_core.rollout.multi_turn import FEEDBACK, MultiTurnWorkflow
from areal_core.rollout.reward_runner import RewardRunner
from areal_core.rollout.rlvr import RLVRWorkflow
from areal_core.api.workflow import decode_ids, encode_chat, stop_at_strings
from areal_core.tiny_model import build_char_tokenizer

DATA = {"id": "arith-3+4", "prompt": "3+4=", "answer": "7"}


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer(["0123456789+=\n " + FEEDBACK])


@pytest.fixture(scope="module")
def runner():
    runner = RewardRunner(exact_match, workers=1, timeout=30)
    try:
        yield runner
    finally:
        runner.close()


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def _replies(tokenizer, texts: list[str], *, eos: bool = True):
    """A script answering the i-th request with ``texts[i % len(texts)]``; records every request."""
    requests: list[GenerationRequest] = []

    def script(request: GenerationRequest) -> list[int]:
        text = texts[len(requests) % len(texts)]
        requests.append(request)
        return _ids(tokenizer, text) + ([tokenizer.eos_token_id] if eos else [])

    return script, requests


def test_rlvr_builds_one_group(tokenizer, runner):
    script, requests = _replies(tokenizer, ["7", "8"])
    gconfig = GenerationConfig(n_samples=4, max_new_tokens=5, temperature=0.7, top_p=0.9)
    group = asyncio.run(RLVRWorkflow(tokenizer, gconfig, runner)(ScriptedEngine(script=script), DATA))

    prompt = encode_chat(tokenizer, [{"role": "user", "content": "3+4="}], add_generation_prompt=True)
    assert prompt == _ids(tokenizer, "3+4=")  # the tiny template keeps the prompt raw
    assert len(group) == 4 and {t.prompt_id for t in group} == {"arith-3+4"}
    assert len({t.uid for t in group}) == 4
    assert sorted(t.reward for t in group) == [0.0, 0.0, 1.0, 1.0]
    for traj in group:
        p = len(prompt)
        assert traj.input_ids[:p] == prompt
        assert traj.input_ids[p:][-1] == tokenizer.eos_token_id and len(traj.input_ids) == p + 2
        assert traj.loss_mask == [0] * p + [1, 1]
        assert traj.logprobs[:p] == [0.0] * p and traj.logprobs[p:] == [-0.5, -0.5]
        assert traj.versions == [-1] * p + [0, 0]
        assert traj.info["completion"] in ("7", "8")  # eos skipped when decoding
    sampling = requests[0].sampling
    assert (sampling.max_new_tokens, sampling.temperature, sampling.top_p, sampling.greedy) == (5, 0.7, 0.9, False)
    assert tokenizer.eos_token_id in sampling.stop_token_ids
    assert len({r.request_id for r in requests}) == 4


def test_rlvr_cuts_at_stop_strings(tokenizer, runner):
    script, _ = _replies(tokenizer, ["7\n12"], eos=False)
    gconfig = GenerationConfig(n_samples=1, max_new_tokens=8, stop=["\n"])
    (traj,) = asyncio.run(RLVRWorkflow(tokenizer, gconfig, runner)(ScriptedEngine(script=script), DATA))
    assert traj.info["completion"] == "7\n" and traj.info["stop_reason"] == "stop"
    assert traj.n_output_tokens == 2 and traj.reward == 1.0


@given(
    ids=st.lists(st.integers(2, 31), max_size=60),  # the character tokens (0 and 1 are special)
    stop=st.lists(st.text(alphabet="0123456789+=\n ", min_size=1, max_size=3), max_size=3),
)
def test_stop_at_strings_keeps_up_to_the_first_token_completing_a_stop_string(tokenizer, ids, stop):
    first = next((n for n in range(1, len(ids) + 1) if any(s in decode_ids(tokenizer, ids[:n]) for s in stop)), len(ids))
    assert stop_at_strings(tokenizer, ids, stop) == first


def test_stop_at_strings_decodes_a_long_completion_a_logarithmic_number_of_times(tokenizer):
    class Counting:
        calls = 0

        def decode(self, ids, skip_special_tokens=True):
            self.calls += 1
            return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    counting, ids = Counting(), _ids(tokenizer, "1" * 1023 + "\n")
    assert stop_at_strings(counting, ids, ["\n"]) == 1024
    assert counting.calls <= 12  # the whole text, then 10 halvings of 1,024 tokens


def test_multi_turn_retries_after_feedback(tokenizer, runner):
    def script(request):  # wrong until told so, then right
        heard_feedback = FEEDBACK in tokenizer.decode(request.input_ids)
        return _ids(tokenizer, "7" if heard_feedback else "9") + [tokenizer.eos_token_id]

    gconfig = GenerationConfig(n_samples=2, max_new_tokens=4)
    workflow = MultiTurnWorkflow(tokenizer, gconfig, runner, max_turns=3, gamma=0.5)
    group = asyncio.run(workflow(ScriptedEngine(script=script), DATA))

    eos = tokenizer.eos_token_id
    prompt, wrong, right = _ids(tokenizer, "3+4="), _ids(tokenizer, "9") + [eos], _ids(tokenizer, "7") + [eos]
    feedback = _ids(tokenizer, FEEDBACK)
    assert len(group) == 2 and len({t.uid for t in group}) == 2
    for traj in group:
        assert traj.input_ids == prompt + wrong + feedback + right
        assert traj.loss_mask == [0] * len(prompt) + [1] * len(wrong) + [0] * len(feedback) + [1] * len(right)
        assert [v for v, m in zip(traj.versions, traj.loss_mask) if not m] == [-1] * (len(prompt) + len(feedback))
        assert traj.reward == 0.5 and traj.info["turns"] == 2  # 1.0 discounted by gamma ** 1


@pytest.mark.parametrize(("answer", "turns", "reward"), [("7", 1, 1.0), ("5", 3, 0.0)])
def test_multi_turn_stops_on_success_or_after_max_turns(tokenizer, runner, answer, turns, reward):
    script, requests = _replies(tokenizer, [answer])
    workflow = MultiTurnWorkflow(tokenizer, GenerationConfig(n_samples=1), runner, max_turns=3, gamma=0.5)
    (traj,) = asyncio.run(workflow(ScriptedEngine(script=script), DATA))
    assert (traj.info["turns"], traj.reward, len(requests)) == (turns, reward, turns)
    assert traj.n_output_tokens == 2 * turns


def test_multi_turn_checks_its_knobs(tokenizer, runner):
    with pytest.raises(ValueError, match="gamma"):
        MultiTurnWorkflow(tokenizer, GenerationConfig(), runner, gamma=0.0)


@given(ids=st.lists(st.integers(0, 40), max_size=64), skip=st.booleans())
def test_decode_ids_is_the_tokenizers_decode(tokenizer, ids, skip):
    """The shortcut past transformers' per-id argument check decodes exactly as ``decode`` does
    (special tokens, eos and pad included)."""
    assert decode_ids(tokenizer, ids, skip_special_tokens=skip) == tokenizer.decode(ids, skip_special_tokens=skip)


def test_decode_ids_keeps_a_tokenizers_own_decode(tokenizer):
    """A tokenizer class whose ``decode`` is its own is called through it."""

    class Shouting(type(tokenizer)):
        def decode(self, token_ids, skip_special_tokens=False, **kwargs):
            return super().decode(token_ids, skip_special_tokens=skip_special_tokens, **kwargs).upper()

    shouting = Shouting(tokenizer_object=tokenizer.backend_tokenizer)
    ids = _ids(tokenizer, FEEDBACK)
    assert decode_ids(shouting, ids) == FEEDBACK.upper() != FEEDBACK
