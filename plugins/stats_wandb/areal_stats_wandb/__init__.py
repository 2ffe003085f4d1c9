"""areal-stats-wandb: registers the ``wandb`` stats sink (``stats.sinks: [jsonl, wandb]``)."""

from areal_core.api import hookimpl

AREAL_API = ">=1.3,<2"  # the areal_core.api versions this plugin supports (stats sinks came in 1.3)

#: ``plugins.wandb`` options and their types
OPTIONS = {"project": str, "entity": str, "name": str, "group": str, "tags": list, "mode": str}


@hookimpl
def areal_register_stats_sinks(register):
    register("wandb", "areal_stats_wandb.sink:WandbSink")


@hookimpl
def areal_configure(config):
    from areal_core.api import check_sink_options

    check_sink_options(config, "wandb", OPTIONS, {"mode": ("online", "offline", "disabled")})
