"""Built-in stats sinks: ``jsonl`` (stats.jsonl and samples.jsonl in the run directory) and
``tensorboard`` (events under ``RUN_DIR/tensorboard``)."""

from areal_core.api import hookimpl


@hookimpl
def areal_register_stats_sinks(register):
    register("jsonl", "areal_core.builtin.stats_sinks.jsonl:JsonlSink")
    register("tensorboard", "areal_core.builtin.stats_sinks.tensorboard:TensorBoardSink")
