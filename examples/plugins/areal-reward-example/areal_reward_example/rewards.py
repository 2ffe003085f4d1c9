"""Two shaping rewards: a final-answer format check and correctness minus a length penalty."""

from __future__ import annotations

import re

import attrs

_NUMBER = r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_FINAL_LINE = re.compile(rf"####\s*\$?{_NUMBER}\.?")
_BOXED_END = re.compile(r"\\boxed\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}[\s.$]*$")


def answer_format(prompt: str, completion: str, **_: object) -> float:
    """1.0 when the completion ends with a final answer a grader can parse, else 0.0.

    Accepted endings: a last line ``#### <number>``, or a ``\\boxed{...}`` (one level of nested
    braces, e.g. ``\\boxed{\\frac{1}{2}}``) followed only by spaces, ``.`` or ``$``.
    """
    lines = [line.strip() for line in completion.strip().splitlines() if line.strip()]
    if not lines:
        return 0.0
    return 1.0 if _FINAL_LINE.fullmatch(lines[-1]) or _BOXED_END.search(completion) else 0.0


@attrs.frozen
class LengthPenalty:
    """``correct - penalty * max(0, len(completion) - (len(answer) + slack))``, floored at ``floor``.

    ``correct`` is lenient: the stripped completion starts with ``answer`` and the next character
    (if any) is not a digit, so ``"7 since 3+4=7"`` counts for answer ``"7"`` but ``"77"`` does
    not. The penalty then pushes the policy from rambling towards the bare answer. The object is
    picklable, so it runs in areal-core's reward worker processes.
    """

    slack: int = 0
    penalty: float = 0.1
    floor: float = -1.0

    def __call__(self, prompt: str, completion: str, answer: str, **_: object) -> float:
        text = completion.strip()
        rest = text[len(answer) :]
        correct = text.startswith(answer) and not rest[:1].isdigit()
        excess = max(0, len(text) - len(answer) - self.slack)
        return max(self.floor, float(correct) - self.penalty * excess)


arith_length_penalty = LengthPenalty()
