"""areal-reshard-xccl: registers the ``xccl`` weight updater (``actor.weight_update: xccl``)."""

from areal_core.api import hookimpl

AREAL_API = ">=1.0,<2"  # the areal_core.api versions this plugin supports


@hookimpl
def areal_register_weight_updaters(register):
    register("xccl", "areal_reshard_xccl.updater:XcclWeightUpdater")
