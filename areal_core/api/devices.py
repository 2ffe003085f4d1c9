"""Which accelerator indices each process gets: servers first, then training ranks.

With 2 servers x 2 devices and 4 training ranks on an 8-device node the layout is
``server0: 0,1  server1: 2,3  trainer0: 4 ... trainer3: 7`` (the seed's "4 + 4"); a server added
at run time takes the devices after the trainers' (here 8, 9: refused when not visible). On the CPU
platform nothing is assigned; processes share the cores by thread count instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from areal_core.api.errors import ArealError

if TYPE_CHECKING:
    from areal_core.config import Config
    from areal_core.api.platform import Platform


def uses_devices(platform: Platform) -> bool:
    return platform.device_type != "cpu"


def server_devices(config: Config, platform: Platform, index: int) -> tuple[int, ...]:
    """Device indices of inference server ``index`` (``rollout.devices_per_server`` of them).

    Servers beyond ``rollout.servers`` (added at run time) come after the training ranks' devices,
    so they never take a trainer's device.
    """
    if not uses_devices(platform):
        return ()
    per, servers = config.rollout.devices_per_server, config.rollout.servers
    first = index * per if index < servers else servers * per + config.actor.world_size + (index - servers) * per
    return tuple(range(first, first + per))


def trainer_devices(config: Config, platform: Platform, rank: int) -> tuple[int, ...]:
    """The one device of training rank ``rank``, after every server's devices."""
    if not uses_devices(platform):
        return ()
    return (config.rollout.servers * config.rollout.devices_per_server + rank,)


def physical_devices(
    indices: Sequence[int], visible: str | None, env_var: str = "visible devices", count: int | None = None
) -> tuple[str, ...]:
    """The ids to expose to a child for layout ``indices`` when this process sees only ``visible``
    (its own ``CUDA_VISIBLE_DEVICES``/``ASCEND_RT_VISIBLE_DEVICES``): index ``i`` is its ``i``-th entry,
    so a controller started with ``ASCEND_RT_VISIBLE_DEVICES=4,5`` places a 1 + 1 run on NPUs 4 and 5.
    Without ``visible``, index ``i`` is device ``i`` of the ``count`` this machine has (unchecked
    when ``count`` is None). An index past the last device is refused with one line: no device is
    free for it (a server added at run time never falls back onto a trainer's device)."""
    ids = [item.strip() for item in (visible or "").split(",") if item.strip()]
    needed = max(indices, default=-1)
    if not ids:
        if count is not None and needed >= count:
            raise ArealError(
                f"no free device: the run needs device index {needed}, but {env_var} is not set and this machine "
                f"has {count} (0..{count - 1}); servers take the first devices, training ranks the next, servers "
                "added at run time the ones after: lower rollout.servers, rollout.devices_per_server or "
                f"actor.world_size, stop adding servers, or set {env_var} to the devices to use"
            )
        return tuple(str(i) for i in indices)
    if needed >= len(ids):
        raise ArealError(
            f"no free device: the run needs device index {needed}, but {env_var}={visible} leaves {len(ids)} visible; "
            "lower rollout.servers, rollout.devices_per_server or actor.world_size, stop adding servers, "
            "or expose more devices"
        )
    return tuple(ids[i] for i in indices)
