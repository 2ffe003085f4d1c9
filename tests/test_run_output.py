"""What a user reads: plain progress lines without a terminal, the summary, no stray progress bars."""

from __future__ import annotations

from pathlib import Path

import attrs

from areal_core.config import TinyModelSpec
from areal_core.rollout.failures import FailureCounts
from areal_core.tiny_model import ensure_tiny_model
from areal_core.trainer import RunSummary, _Progress

STATS = {"reward/mean": 0.5, "rollout/max_lag": 1.0, "perf/tokens_per_s": 12.0}


def test_progress_prints_a_plain_line_per_step_without_a_terminal(capsys):
    for enabled in (True, False):  # pytest's stdout is not a terminal: no bar either way
        with _Progress(3, 0, enabled=enabled) as progress:
            progress.update(1, STATS)
            progress.update(2, {**STATS, "eval/accuracy": 0.25})
        assert capsys.readouterr().out.splitlines() == [
            "areal: step 1/3  reward 0.50  lag 1  12 tok/s",
            "areal: step 2/3  reward 0.50  lag 1  12 tok/s  eval 0.25",
        ]


def test_summary_reports_start_up_training_and_failure_rates(tmp_path):
    run_dir = tmp_path / ("a-long-directory-name-" * 5) / "trial0"
    summary = RunSummary(
        steps=2, samples=32, output_tokens=96, wall_seconds=6.2, startup_seconds=24.4, reward_first=0.1,
        reward_last=0.3, eval_accuracy=None, episode_failures=FailureCounts(1, 10),
        reward_failures=FailureCounts(32, 32), run_dir=run_dir, final_model=run_dir / "checkpoints" / "final",
    )
    lines = summary.render().splitlines()
    assert lines[1] == "wall 31s   start-up 24s   training 6s"
    assert lines[3] == "failures     1 of 10 episode attempts (10%)   32 of 32 reward calls (100%)"
    assert f"run dir      {run_dir}" in lines
    with_eval = attrs.evolve(summary, eval_failures=FailureCounts(3, 12))
    assert with_eval.render().splitlines()[3] == (
        "failures     1 of 10 episode attempts (10%)   32 of 32 reward calls (100%)   3 of 12 held-out episodes (25%)"
    )


def test_building_the_tiny_model_draws_no_progress_bar(tmp_path: Path, capfd):
    ensure_tiny_model(TinyModelSpec(), ["0123456789+="], tmp_path, seed=0)
    out, err = capfd.readouterr()
    assert "Writing model shards" not in out + err and "%|" not in err


def test_summary_shows_accuracy_before_and_after_and_each_process_group_s_peak_memory(tmp_path):
    summary = RunSummary(
        steps=2, samples=32, output_tokens=96, wall_seconds=6.2, startup_seconds=24.4, reward_first=0.1,
        reward_last=0.3, eval_accuracy=0.41, eval_accuracy_start=0.2, episode_failures=FailureCounts(0, 10),
        reward_failures=FailureCounts(0, 32), run_dir=tmp_path, final_model=tmp_path / "final",
        peak_rss={"controller": (2, 3 * 2**29), "vllm_server0": (3, 2**31)},
    )  # fmt: skip
    lines = summary.render().splitlines()
    assert lines[2] == "train reward 0.10 -> 0.30   held-out greedy accuracy 0.20 -> 0.41"
    assert "peak RSS     controller 1.5 GB (2 processes) · vllm_server0 2.0 GB (3 processes)" in lines
