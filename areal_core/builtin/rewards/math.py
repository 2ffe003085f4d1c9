"""Math answer reward: extract the final answer and check equivalence with ``math-verify``.

The final answer is the last ``\\boxed{...}``, else the text after the last ``####``, else the last
number, whichever the completion uses. A gold ``answer`` in GSM8K form (a solution ending with
``#### N``) is reduced the same way, so both raw solutions and bare answers work as gold.
"""

from __future__ import annotations

import re
import threading

_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+")
_NUMBER_THEN_UNITS = re.compile(rf"({_NUMBER.pattern})\s*[^\d\\]*")  # "18 dollars" -> "18"
_PARSE_TIMEOUT_S = 5


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return None


def _clean(answer: str) -> str:
    """Drop what surrounds a final answer line: ``$`` signs, a trailing period, spaces."""
    return answer.replace("$", "").strip().rstrip(".").strip()


def _after_marker(text: str) -> str | None:
    """The rest of the line after the last ``####``, or None."""
    if "####" not in text:
        return None
    lines = text.rsplit("####", 1)[1].strip().splitlines()
    if not lines:
        return None
    tail = _clean(lines[0])
    number = _NUMBER_THEN_UNITS.fullmatch(tail)
    return number.group(1) if number else tail


def extract_final_answer(text: str) -> str | None:
    """The final answer a solution states (boxed, ``#### x`` or last number), or None."""
    answer = _last_boxed(text) or _after_marker(text)
    if answer:
        return answer
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def _gold_answer(answer: str) -> str:
    """A gold answer: a full solution's final answer, else the text itself (e.g. ``\\frac{1}{2}``)."""
    return _last_boxed(answer) or _after_marker(answer) or _clean(answer)


def _timeout() -> int | None:
    # math-verify times out with SIGALRM, which only works in a process's main thread.
    return _PARSE_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def is_equivalent(gold: str, predicted: str) -> bool:
    """Whether two final answers are mathematically equal according to ``math-verify``."""
    from math_verify import parse, verify

    timeout = _timeout()
    gold_parsed = parse(f"\\boxed{{{gold}}}", parsing_timeout=timeout)
    pred_parsed = parse(f"\\boxed{{{predicted}}}", parsing_timeout=timeout)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=timeout))


def math_reward(prompt: str, completion: str, answer: str, **_: object) -> float:
    """1.0 when the completion's final answer equals the gold ``answer``, else 0.0."""
    predicted = extract_final_answer(completion)
    if predicted is None:
        return 0.0
    return 1.0 if is_equivalent(_gold_answer(answer), predicted) else 0.0
