"""areal-stats-mlflow: registers the ``mlflow`` stats sink (``stats.sinks: [jsonl, mlflow]``)."""

from areal_core.api import hookimpl

AREAL_API = ">=1.3,<2"  # the areal_core.api versions this plugin supports (stats sinks came in 1.3)

#: ``plugins.mlflow`` options and their types
OPTIONS = {"tracking_uri": str, "experiment": str, "name": str, "tags": dict}


@hookimpl
def areal_register_stats_sinks(register):
    register("mlflow", "areal_stats_mlflow.sink:MlflowSink")


@hookimpl
def areal_configure(config):
    from areal_core.api import check_sink_options

    check_sink_options(config, "mlflow", OPTIONS)
