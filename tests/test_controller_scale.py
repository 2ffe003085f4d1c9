"""bench/controller_scale.py in a tiny mode, so the benchmark cannot rot (no timed assertions).

A few replay servers and a few hundred episodes, RLVR and multi-turn agents through the proxy,
with weight updates in between, under the controller's interpreter settings and Python's defaults:
each run must complete requests on both paths and leave a ledger in which every episode was
consumed exactly once, and the ratio line must compare the two.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_controller_scale_tiny_mode() -> None:
    cmd = [
        sys.executable, str(ROOT / "bench" / "controller_scale.py"),
        "--servers", "3", "--in-flight", "48", "--batch", "16", "--eta", "2", "--n-samples", "2",
        "--rate", "150", "--agent-share", "0.3", "--turns", "2", "--median-s", "2", "--sigma", "0.5",
        "--train-s", "0.05", "--update-s", "0.02", "--warmup-s", "1", "--seconds", "3", "--cpus", "0",
        "--tuning", "controller", "python",
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    rows = [line.split() for line in lines if line.split()[:1] == ["3"]]
    assert [row[-1] for row in rows] == ["controller", "python"], out.stdout
    assert all(float(row[1]) > 0 for row in rows)  # requests/s
    summaries = [line for line in lines if "ledger:" in line]
    assert len(summaries) == 2, out.stdout
    for summary in summaries:
        batches, uninterrupted, agent_calls = map(
            int, re.search(r"(\d+) batches taken, (\d+) uninterrupted requests, (\d+) agent calls", summary).groups()
        )
        assert batches > 0 and uninterrupted > 0 and agent_calls > 0, summary
        assert "ledger: exactly once" in summary, summary
    assert re.search(r"controller/python \(medians\): req/s x\d+\.\d+, CPU per request x\d+\.\d+", out.stdout), out.stdout
