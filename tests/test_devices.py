"""Device layout: servers first, then training ranks; servers added at run time after both."""

from __future__ import annotations

import sys

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from areal_core.config import load_config
from areal_core.api.errors import ArealError
from areal_core.api.scheduler import ProcessSpec
from areal_core.api.devices import server_devices, trainer_devices
from areal_core.scheduler.local import LocalScheduler


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


class _Machine:
    """A platform whose processes see ``count`` devices through ``AREAL_TEST_VISIBLE_DEVICES``."""

    device_type = "npu"
    visible_devices_env = "AREAL_TEST_VISIBLE_DEVICES"

    def __init__(self, count: int) -> None:
        self.count = count

    def device_count(self) -> int:
        return self.count


@pytest.mark.parametrize("visible", [None, "4,5,6,7"])
def test_a_server_added_when_no_device_is_free_is_refused_with_one_line(
    visible: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1 server + 2 training ranks on 4 devices: the first added server takes the last device, the
    second finds none free (the variable unset: the machine's count; set: its entries)."""
    if visible is None:
        monkeypatch.delenv(_Machine.visible_devices_env, raising=False)
    else:
        monkeypatch.setenv(_Machine.visible_devices_env, visible)
    config = load_config(None, ["rollout.servers=1", "actor.world_size=2"])
    machine = _Machine(count=4)
    with LocalScheduler(machine) as scheduler:  # type: ignore[arg-type]
        added = ProcessSpec(name="server1", cmd=[sys.executable, "-c", "pass"], devices=server_devices(config, machine, 1))
        scheduler.start(added).popen.wait(timeout=60)
        assert added.devices == (3,) and 3 not in [d for r in range(2) for d in trainer_devices(config, machine, r)]
        more = attrs.evolve(added, name="server2", devices=server_devices(config, machine, 2))
        with pytest.raises(ArealError, match=r"^cannot start server2: no free device: the run needs device index 4") as info:
            scheduler.start(more)
    assert "\n" not in str(info.value) and _Machine.visible_devices_env in str(info.value)
    assert [h.name for h in scheduler.handles] == ["server1"]  # nothing started for the refused one
