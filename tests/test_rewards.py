"""Built-in rewards: math-verify answers on real GSM8K data, exact match for synthetic tasks."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_core.plugins import load_plugins
from areal_core.builtin.rewards.math import extract_final_answer, math_reward
from areal_core.builtin.rewards.synthetic import arith_reward, exact_match, reverse_reward
from areal_core.rollout.reward_runner import RewardRunner

GSM8K_TEST = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "gsm8k" / "test.jsonl"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so the total is \\boxed{\\frac{3}{4}} dollars", "\\frac{3}{4}"),
        ("\\boxed{1} then \\boxed{\\sqrt{2}}", "\\sqrt{2}"),
        ("She pays 3 + 4 = 7.\n#### $1,250.", "1,250"),
        ("#### 18 dollars", "18"),
        ("first 3, then 4, finally -12.5", "-12.5"),
        ("no answer here", None),
    ],
)
def test_extract_final_answer(text, expected):
    assert extract_final_answer(text) == expected


@pytest.mark.parametrize(
    "completion, gold, reward",
    [
        ("The answer is \\boxed{18}.", "Solution...\n#### 18", 1.0),
        ("I think it is 18", "#### 18", 1.0),
        ("#### 1250", "x\n#### 1,250", 1.0),
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("#### -3", "#### -3", 1.0),
        ("#### 3", "#### -3", 0.0),
        ("\\boxed{17}", "#### 18", 0.0),
        ("I cannot solve it", "#### 18", 0.0),
    ],
)
def test_math_reward(completion, gold, reward):
    assert math_reward("q", completion, gold) == reward


@settings(max_examples=40, deadline=None)
@given(
    gold=st.integers(-(10**6), 10**6),
    guess=st.integers(-(10**6), 10**6),
    style=st.sampled_from(["####", "boxed", "last"]),
)
def test_math_reward_is_integer_equality(gold, guess, style):
    completion = {"####": f"work\n#### {guess:,}", "boxed": f"\\boxed{{{guess}}}", "last": f"it is {guess:,}"}[style]
    assert math_reward("q", completion, f"steps\n#### {gold}") == float(gold == guess)


@pytest.mark.slow
@pytest.mark.skipif(not GSM8K_TEST.is_file(), reason=f"shared GSM8K data not found at {GSM8K_TEST}: put the shared/data directory beside the clone, as CI has it")
def test_gsm8k_gold_solutions_score_one_and_perturbed_ones_zero():
    records = [json.loads(line) for line in GSM8K_TEST.read_text().splitlines()]
    assert len(records) == 1319
    gold_ok = perturbed_zero = 0
    for r in records:
        solution = r["answer"]
        gold_ok += math_reward(r["question"], solution, solution) == 1.0
        body, final = solution.rsplit("####", 1)
        wrong = int(final.strip().replace(",", "")) + 1
        perturbed_zero += math_reward(r["question"], f"{body}#### {wrong}", solution) == 0.0
    assert (gold_ok, perturbed_zero) == (1319, 1319)


def test_math_reward_outside_the_main_thread():
    # math-verify's own timeout needs SIGALRM (main thread only); other threads must still work.
    results = []
    thread = threading.Thread(target=lambda: results.append(math_reward("q", "\\boxed{2}", "#### 2")))
    thread.start()
    thread.join()
    assert results == [1.0]


def test_math_reward_in_a_reward_worker():
    with RewardRunner(math_reward, workers=1, timeout=60.0) as runner:
        scores = asyncio.run(runner.score("q", "so \\boxed{42}", {"answer": "#### 42"}))
    assert scores == 1.0 and runner.stats.errors == 0


def test_exact_match_rewards():
    assert exact_match("3+4=", " 7\n", answer="7") == 1.0
    assert exact_match("3+4=", "77", answer="7") == 0.0
    assert exact_match("3+4=", "", answer="7") == 0.0
    assert arith_reward("3+4=", "7", answer="7", extra="ignored") == 1.0
    assert reverse_reward("rev 123=", "321", answer="321") == 1.0


def test_builtin_rewards_are_registered():
    plugins = load_plugins(autoload=False)
    assert plugins.get("reward", "gsm8k") is math_reward
    assert plugins.get("reward", "math") is math_reward
    assert plugins.get("reward", "arith") is arith_reward
    assert plugins.get("reward", "reverse") is reverse_reward
