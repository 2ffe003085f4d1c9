"""The ``tensorboard`` sink: scalars and sample tables as TensorBoard events under ``RUN_DIR/tensorboard``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from areal_core.api.stats_sink import SampleRow, SinkRun, StatsSink, markdown_table


class TensorBoardSink(StatsSink):
    """A recovered run purges the events after its resume step, so each step appears once."""

    rewrites_history = True

    def __init__(self, run: SinkRun) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(run.run_dir / "tensorboard"), purge_step=run.resume_step + 1)

    def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        for key, value in scalars.items():
            self._writer.add_scalar(key, value, step)

    def log_samples(self, step: int, rows: Sequence[SampleRow]) -> None:
        for split in sorted({row.split for row in rows}):
            table = [row for row in rows if row.split == split]
            self._writer.add_text(f"samples/{split}", markdown_table(table), step)

    def close(self) -> None:
        self._writer.close()

