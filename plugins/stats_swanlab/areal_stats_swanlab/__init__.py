"""areal-stats-swanlab: registers the ``swanlab`` stats sink (``stats.sinks: [jsonl, swanlab]``)."""

from areal_core.api import hookimpl

AREAL_API = ">=1.3,<2"  # the areal_core.api versions this plugin supports (stats sinks came in 1.3)

#: ``plugins.swanlab`` options and their types
OPTIONS = {"project": str, "workspace": str, "name": str, "group": str, "tags": list, "mode": str}


@hookimpl
def areal_register_stats_sinks(register):
    register("swanlab", "areal_stats_swanlab.sink:SwanLabSink")


@hookimpl
def areal_configure(config):
    from areal_core.api import check_sink_options

    check_sink_options(config, "swanlab", OPTIONS, {"mode": ("online", "offline", "local", "disabled")})
