"""Stats sinks: where a run's scalars and sample tables go (stats.jsonl, TensorBoard, trackers).

A sink is registered by name through ``areal_register_stats_sinks`` and selected by
``stats.sinks``. The run builds each selected sink once with a :class:`SinkRun`, then calls
``log_scalars`` once per step (step 0 carries the held-out accuracy measured before training),
``log_samples`` with readable generations, and ``close`` at the end. The run calls every sink from
a thread of its own: a sink that raises or hangs is reported once and left behind, and training
goes on (:mod:`areal_core.sink_runner`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import attrs


@attrs.frozen(kw_only=True)
class SinkRun:
    """What a sink is built with.

    ``resume_step`` is 0 for a fresh run; a recovered run starts again after it, and ``resume_id``
    is then the tracker run id this sink reported on the earlier attempt (``None`` otherwise), so
    a tracker can continue the same run.
    """

    run_dir: Path
    experiment_name: str
    trial_name: str
    config: dict[str, Any]  # the resolved config, as plain data
    options: dict[str, Any]  # the sink's own section: ``plugins.<sink name>`` of the config
    resume_step: int = 0
    resume_id: str | None = None


@attrs.frozen(kw_only=True)
class SampleRow:
    """One generation as a person reads it: prompt, response, reward, length and weight version."""

    step: int  # the train step it belongs to (0: the evaluation before training)
    split: str  # "eval" (held-out, greedy) or "train" (a sample the step trained on)
    id: str  # the dataset item's id
    prompt: str
    response: str
    reward: float
    output_tokens: int
    version: int  # the weight version that generated it (the newest one, for a response that spans several)

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


#: the columns of a sample table, in order (:meth:`SampleRow.as_dict`'s keys)
SAMPLE_COLUMNS: tuple[str, ...] = tuple(field.name for field in attrs.fields(SampleRow))


def markdown_table(rows: Sequence[SampleRow]) -> str:
    """The rows as a Markdown table, for a sink that shows text (TensorBoard, SwanLab)."""
    columns = ("id", "reward", "output_tokens", "version", "prompt", "response")
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for row in rows:
        cells = [str(getattr(row, name)) if name != "reward" else f"{row.reward:g}" for name in columns]
        lines.append("| " + " | ".join(cell.replace("|", "\\|").replace("\n", "<br>") for cell in cells) + " |")
    return "\n".join(lines)


class StatsSink(ABC):
    """One destination of a run's stats. Subclasses take a :class:`SinkRun` in ``__init__``."""

    #: whether ``log_samples`` writes the rows somewhere (the run skips building them otherwise)
    takes_tables: ClassVar[bool] = True
    #: whether a resumed run may re-log steps after ``resume_step`` because the sink rewrites its
    #: own history (stats.jsonl is truncated, TensorBoard purges); a tracker that only appends
    #: sets False and the run then skips the steps it already sent, so none appears twice
    rewrites_history: ClassVar[bool] = False

    #: the tracker's run id, where it has one, kept in the run directory for a resume
    run_id: str | None = None

    @abstractmethod
    def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        """Record one step's scalars (called once per step, steps increasing)."""

    def log_samples(self, step: int, rows: Sequence[SampleRow]) -> None:
        """Record a table of generations (only called where ``takes_tables``)."""

    def close(self) -> None:
        """Flush and release; the run calls it once, last."""

    def local_copy(self) -> str | None:
        """Where this sink's data stays on disk for a later upload, as a user reads it
        (for example ``"wandb sync RUN_DIR/wandb"``); ``None`` where it keeps none."""
        return None


def check_sink_options(
    config: Any,
    name: str,
    allowed: Mapping[str, type | tuple[type, ...]],
    choices: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """For a sink plugin's ``areal_configure``: where ``stats.sinks`` lists ``name``, every key of
    the config's ``plugins.<name>`` section is one of ``allowed`` and of its type, and one of
    ``choices[key]`` where given; else a :class:`~areal_core.api.errors.ConfigError` naming the key
    and what is accepted."""
    from areal_core.api.errors import ConfigError

    if name not in config.stats.sinks:
        return
    section = config.plugins.get(name) or {}
    if not isinstance(section, dict):
        raise ConfigError(f"plugins.{name}", f"expected a mapping of options, got {section!r}")
    for key, value in section.items():
        if key not in allowed:
            options = ", ".join(allowed)
            raise ConfigError(f"plugins.{name}.{key}", f"unknown option of the {name} sink (options: {options})")
        if not isinstance(value, allowed[key]):
            kinds = allowed[key] if isinstance(allowed[key], tuple) else (allowed[key],)
            expected = " or ".join(kind.__name__ for kind in kinds)
            raise ConfigError(f"plugins.{name}.{key}", f"expected {expected}, got {value!r}")
        if choices and key in choices and value not in choices[key]:
            raise ConfigError(f"plugins.{name}.{key}", f"expected one of {', '.join(choices[key])}, got {value!r}")
