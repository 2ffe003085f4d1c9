"""The ``swanlab`` sink: one SwanLab run per areal run, continued by a recovered run."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from areal_core.api import SampleRow, SinkRun, StatsSink


def row_text(row: SampleRow) -> tuple[str, str]:
    """(text, caption) of one sample as SwanLab shows it."""
    caption = f"id {row.id} · reward {row.reward:g} · {row.output_tokens} tokens · weights v{row.version}"
    return f"{row.prompt}\n\n---\n\n{row.response}", caption


class SwanLabSink(StatsSink):
    """Logs each step's scalars at ``step``, each sample as a text under ``samples/<split>`` (its
    caption: id, reward, length and weight version), and the resolved config. Files go to
    ``RUN_DIR/swanlog``; ``SWANLAB_MODE`` (then ``plugins.swanlab.mode``) picks online (SwanLab
    cloud, or a private server through ``SWANLAB_API_HOST``), offline or local. Never prompts for
    a login: without an API key an online run fails, is reported, and training goes on."""

    rewrites_history = False

    def __init__(self, run: SinkRun) -> None:
        import swanlab

        options = run.options
        mode = os.environ.get("SWANLAB_MODE") or options.get("mode")
        self.log_dir = run.run_dir / "swanlog"
        self._run = swanlab.init(
            project=options.get("project", run.experiment_name),
            workspace=options.get("workspace"),
            name=options.get("name", run.trial_name),
            group=options.get("group"),
            tags=options.get("tags"),
            config=run.config,
            log_dir=str(self.log_dir),
            id=run.resume_id,  # None: SwanLab picks one
            resume="allow",
            reinit=True,
            settings=swanlab.Settings(interactive=False),
            **({"mode": mode} if mode else {}),
        )
        self.run_id = self._run.id
        self._swanlab = swanlab

    def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        self._run.log(dict(scalars), step=step)

    def log_samples(self, step: int, rows: Sequence[SampleRow]) -> None:
        by_split: dict[str, list] = {}
        for row in rows:
            text, caption = row_text(row)
            by_split.setdefault(f"samples/{row.split}", []).append(self._swanlab.Text(text, caption=caption))
        self._run.log(by_split, step=step)

    def close(self) -> None:
        self._run.finish()

    def local_copy(self) -> str | None:
        return f"swanlab sync {self.log_dir}/run-*"
