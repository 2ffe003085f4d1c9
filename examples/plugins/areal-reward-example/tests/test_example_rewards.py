"""Unit tests of the example rewards (run from this directory: ``python -m pytest``)."""

import pytest

from areal_reward_example.rewards import LengthPenalty, answer_format, arith_length_penalty


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("4 + 5 = 9\n#### 9", 1.0),
        ("so\n#### $1,250.\n\n", 1.0),
        ("#### -3.5", 1.0),
        ("The answer is \\boxed{\\frac{1}{2}}.", 1.0),
        ("\\boxed{42}", 1.0),
        ("#### nine", 0.0),
        ("#### 9 and then more text", 0.0),
        ("\\boxed{42} is my guess, or maybe 43", 0.0),
        ("the answer is 9", 0.0),
        ("", 0.0),
    ],
)
def test_answer_format(completion, expected):
    assert answer_format("q", completion) == expected


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("7", 1.0),
        (" 7\n", 1.0),
        ("7 ok", 1.0 - 0.1 * 3),
        ("77", 0.0 - 0.1 * 1),
        ("8", 0.0),
        ("7" + "x" * 40, -1.0),
    ],
)
def test_arith_length_penalty(completion, expected):
    assert arith_length_penalty("3+4=", completion, answer="7") == pytest.approx(expected)


def test_length_penalty_knobs():
    lenient = LengthPenalty(slack=3, penalty=0.5, floor=-2.0)
    assert lenient("3+4=", "7 ok", answer="7") == 1.0
    assert lenient("3+4=", "7 is it", answer="7") == pytest.approx(1.0 - 0.5 * 3)
    assert lenient("3+4=", "x" * 20, answer="7") == -2.0
