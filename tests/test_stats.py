"""Stats log: one JSON line per step, truncated to the resume step on recovery; the reward plot."""

from __future__ import annotations

import json

from areal_core.stats import StatsLogger, plot_reward_curve


def test_resume_drops_steps_after_the_recover_point(tmp_path):
    log = StatsLogger(tmp_path, tensorboard=False)
    for step in range(1, 6):
        log.log(step, {"reward/mean": step / 10})
    log.close()
    resumed = StatsLogger(tmp_path, tensorboard=False, resume_step=3)
    resumed.log(4, {"reward/mean": 0.9})
    rows = [json.loads(line) for line in (tmp_path / "stats.jsonl").read_text().splitlines()]
    assert [(r["step"], r["reward/mean"]) for r in rows] == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.9)]
    assert resumed.history == rows


def test_tensorboard_events_and_reward_curve(tmp_path):
    log = StatsLogger(tmp_path, tensorboard=True)
    log.log(1, {"reward/mean": 0.1})
    log.log(2, {"reward/mean": 0.5, "eval/accuracy": 0.4})
    log.close()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    plot_reward_curve(log.history, tmp_path / "curve.png", "t")
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
