"""bench/batch_free.py in a tiny mode, so the benchmark cannot rot (no timed assertions): every
repeat measures both ways (each must empty the batch), and the summary compares them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_batch_free_tiny_mode() -> None:
    cmd = [sys.executable, str(ROOT / "bench" / "batch_free.py"), "--episodes", "16", "--tokens", "20", "--repeats", "2"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(re.findall(r"^repeat \d\s+(all at once|free_in_turns): free ", out.stdout, re.M)) == 4, out.stdout
    assert re.search(r"longest loop stall, median: all at once / in turns = \d+\.\dx", out.stdout), out.stdout
