"""Device layout: servers first, then training ranks; servers added at run time after both."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from areal_core.config import load_config
from areal_core.api.devices import server_devices, trainer_devices


class _Accelerator:
    device_type = "npu"


@given(servers=st.integers(1, 4), per=st.integers(1, 4), world=st.integers(1, 4), added=st.integers(0, 4))
def test_no_two_processes_share_a_device_even_with_servers_added_at_run_time(
    servers: int, per: int, world: int, added: int
) -> None:
    config = load_config(None, [f"rollout.servers={servers}", f"rollout.devices_per_server={per}", f"actor.world_size={world}"])
    platform = _Accelerator()
    layouts = [server_devices(config, platform, i) for i in range(servers + added)]
    layouts += [trainer_devices(config, platform, r) for r in range(world)]
    taken = [d for layout in layouts for d in layout]
    assert len(taken) == len(set(taken)) == (servers + added) * per + world
    assert server_devices(config, platform, 0) == tuple(range(per))  # the configured ones come first
