"""The quickstart controller with the rewards of reward_fns_for_tests registered under their names.

    python tests/train_with_test_rewards.py --config examples/quickstart/config.yaml reward.name=always_raises
"""

from __future__ import annotations

import reward_fns_for_tests as fns

from areal_core.api import hookimpl
from areal_core.config import Config
from areal_core.launcher import script_main
from areal_core.plugins import load_plugins
from areal_core.trainer import Trainer


class TestRewards:
    @hookimpl
    def areal_register_rewards(self, register):
        for name in ("always_raises", "always_exits", "raises_on_bad"):
            register(name, getattr(fns, name))
        register("broken_in_workers", fns.BrokenInWorkers())


def main(config: Config) -> None:
    plugins = load_plugins(extra=[("test_rewards", TestRewards())])
    print(Trainer(config, plugins=plugins).run().render())


if __name__ == "__main__":
    script_main(main)
