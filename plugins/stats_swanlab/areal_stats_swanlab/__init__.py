"""areal-stats-swanlab: registers the ``swanlab`` stats sink (``stats.sinks: [jsonl, swanlab]``)."""

from areal_core.api import hookimpl

AREAL_API = ">=1.3,<2"  # the areal_core.api versions this plugin supports (stats sinks came in 1.3)

#: ``plugins.swanlab`` options and their types
OPTIONS = {"project": str, "workspace": str, "name": str, "group": str, "tags": list, "mode": str}
MODES = ("online", "offline", "local", "disabled")


@hookimpl
def areal_register_stats_sinks(register):
    register("swanlab", "areal_stats_swanlab.sink:SwanLabSink")


@hookimpl
def areal_configure(config):
    from areal_core.api import ConfigError, check_sink_options

    check_sink_options(config, "swanlab", OPTIONS)
    mode = (config.plugins.get("swanlab") or {}).get("mode")
    if "swanlab" in config.stats.sinks and mode not in (None, *MODES):
        raise ConfigError("plugins.swanlab.mode", f"expected {', '.join(MODES)}, got {mode!r}")
