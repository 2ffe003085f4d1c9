"""Run statistics: a JSONL log, TensorBoard events and the reward-curve plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STATS_FILE = "stats.jsonl"


class StatsLogger:
    """Appends one JSON line per step to ``run_dir/stats.jsonl`` and mirrors scalars to TensorBoard."""

    def __init__(self, run_dir: Path, *, tensorboard: bool, resume_step: int = 0) -> None:
        self.path = run_dir / STATS_FILE
        self.history = _read_history(self.path, up_to_step=resume_step)
        self.path.write_text("".join(json.dumps(row) + "\n" for row in self.history))
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=resume_step + 1)

    def log(self, step: int, stats: dict[str, float]) -> None:
        row: dict[str, Any] = {"step": step, **stats}
        self.history.append(row)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self._writer is not None:
            for key, value in stats.items():
                self._writer.add_scalar(key, value, step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _read_history(path: Path, up_to_step: int) -> list[dict[str, Any]]:
    """Rows of an earlier attempt, kept up to the step a recovered run resumes from."""
    if not path.exists() or up_to_step <= 0:
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [row for row in rows if row["step"] <= up_to_step]


def plot_reward_curve(history: list[dict[str, Any]], out: Path, title: str, eval_at_start: float | None = None) -> None:
    """Train reward per step, and held-out greedy accuracy where it was measured (``eval_at_start``:
    before the first step, drawn at step 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    steps = [row["step"] for row in history if "reward/mean" in row]
    ax.plot(steps, [row["reward/mean"] for row in history if "reward/mean" in row], label="train reward (mean)")
    evals = [(row["step"], row["eval/accuracy"]) for row in history if "eval/accuracy" in row]
    if eval_at_start is not None:
        evals.insert(0, (0, eval_at_start))
    if evals:
        ax.plot(*zip(*evals), marker="o", label="held-out greedy accuracy")
    ax.set_xlabel("train step")
    ax.set_ylabel("reward / accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
