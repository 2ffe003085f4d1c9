"""The reward-curve plot of a run (its stats go to ``stats.sinks``: :mod:`areal_core.sink_runner`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


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
