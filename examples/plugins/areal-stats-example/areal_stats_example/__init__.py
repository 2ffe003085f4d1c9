"""areal-stats-example: registers the ``csv`` stats sink (``stats.sinks: [jsonl, csv]``)."""

from areal_core.api import hookimpl


@hookimpl
def areal_register_stats_sinks(register):
    register("csv", "areal_stats_example.csv_sink:CsvSink")  # imported only when a run selects it
