"""The ``wandb`` sink: one W&B run per areal run, continued by a recovered run."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from areal_core.api import SAMPLE_COLUMNS, SampleRow, SinkRun, StatsSink


class WandbSink(StatsSink):
    """Logs each step's scalars at ``step``, sample tables as ``samples/<split>`` W&B Tables, and
    the resolved config as the run's config. Files go to ``RUN_DIR/wandb``; ``WANDB_MODE`` (then
    ``plugins.wandb.mode``) picks online or offline. Project and name default to the experiment
    and trial names."""

    rewrites_history = False

    def __init__(self, run: SinkRun) -> None:
        import wandb

        options = run.options
        mode = os.environ.get("WANDB_MODE") or options.get("mode")
        self._run = wandb.init(
            project=options.get("project", run.experiment_name),
            entity=options.get("entity"),
            name=options.get("name", run.trial_name),
            group=options.get("group"),
            tags=options.get("tags"),
            config=run.config,
            dir=str(run.run_dir),
            id=run.resume_id,  # None: W&B picks one
            resume="allow",
            reinit="create_new",
            **({"mode": mode} if mode else {}),
        )
        self.run_id = self._run.id
        self._wandb = wandb

    def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        self._run.log(dict(scalars), step=step)

    def log_samples(self, step: int, rows: Sequence[SampleRow]) -> None:
        tables = {}
        for row in rows:
            table = tables.setdefault(f"samples/{row.split}", self._wandb.Table(columns=list(SAMPLE_COLUMNS)))
            table.add_data(*row.as_dict().values())
        self._run.log(tables, step=step)

    def close(self) -> None:
        self._run.finish()

    def local_copy(self) -> str | None:
        return f"wandb sync {Path(self._run.dir).parent}"
