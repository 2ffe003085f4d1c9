"""areal-reshard-disk: registers the ``disk`` weight updater (``actor.weight_update: disk``)."""

from areal_core.api import hookimpl

AREAL_API = ">=1.0,<2"  # the areal_core.api versions this plugin supports


@hookimpl
def areal_register_weight_updaters(register):
    register("disk", "areal_reshard_disk.updater:DiskWeightUpdater")
