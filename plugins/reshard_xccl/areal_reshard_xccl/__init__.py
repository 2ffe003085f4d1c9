"""areal-reshard-xccl: registers the ``xccl`` weight updater (``actor.weight_update: xccl``)."""

from areal_core.api import hookimpl


@hookimpl
def areal_register_weight_updaters(register):
    register("xccl", "areal_reshard_xccl.updater:XcclWeightUpdater")
