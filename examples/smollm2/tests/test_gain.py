"""examples/smollm2/gain.py splits an accuracy gain into arithmetic and format from eval_samples.jsonl."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

GAIN = Path(__file__).resolve().parents[1] / "gain.py"


def _row(step: int, answer: str, completion: str, reward: float) -> dict:
    return {"step": step, "id": f"{step}-{completion}", "reward": reward, "output_tokens": 10, "stop_reason": "stop",
            "completion": completion, "answer": answer}  # fmt: skip


def test_a_gain_splits_into_numbers_computed_and_numbers_read(tmp_path: Path):
    rows = [
        # before: one right, one computed but followed by another number (a format miss), two wrong
        _row(0, "7", "3 + 4 = 7", 1.0), _row(0, "9", "4 + 5 = 9 apples, 2 left", 0.0),
        _row(0, "8", "4 + 4 = 10", 0.0), _row(0, "6", "2 * 3 = 5", 0.0),
        # after: three right (one boxed), one still wrong: +2 points of which +1 computed, +1 read right
        _row(10, "7", "3 + 4 = 7", 1.0), _row(10, "9", "4 + 5 = \\boxed{9}", 1.0),
        _row(10, "8", "4 + 4 = 8", 1.0), _row(10, "6", "2 * 3 = 5", 0.0),
    ]  # fmt: skip
    (tmp_path / "eval_samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = subprocess.run([sys.executable, str(GAIN), str(tmp_path)], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert lines[1].split() == ["0", "0.250", "0.500", "0.50", "0.00", "10"]
    assert lines[2].split() == ["10", "0.750", "0.750", "1.00", "0.25", "10"]
    assert lines[-1] == "gain step 0 -> 10: +50.0 points = arithmetic +25.0 + format +25.0"
