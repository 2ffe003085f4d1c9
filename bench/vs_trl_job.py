"""Our side of ``bench/vs_trl.py``: the quickstart's controller, fed 32 prompts per step.

The issue's job draws 32 prompts per step from the 25 ``a+b=`` items, as TRL does from its
repeated list. A run refuses a batch larger than its dataset (a step would take some items
twice), so this script registers ``arith-repeated``: every ``arith`` item twice, under distinct
ids, and trains on it in place of ``train_dataset.name`` (which the launcher checks against the
installed datasets, so the command line keeps ``arith``). Run it through the launcher like
``examples/quickstart/train.py``.
"""

from __future__ import annotations

import types
from typing import Any

import attrs

from areal_core.api import hookimpl
from areal_core.config import Config, DatasetConfig
from areal_core.builtin.datasets.synthetic import load_arith
from areal_core.launcher import script_main
from areal_core.plugins import load_plugins
from areal_core.trainer import Trainer

NAME, COPIES = "arith-repeated", 2


def load_repeated(config: DatasetConfig, split: str) -> list[dict[str, Any]]:
    items = load_arith(attrs.evolve(config, name="arith"), split)
    return [{**item, "id": f"{item['id']}#{k}"} for k in range(COPIES) for item in items]


@hookimpl
def areal_register_datasets(register: Any) -> None:
    register(NAME, load_repeated)


def main(config: Config) -> None:
    config = attrs.evolve(config, train_dataset=attrs.evolve(config.train_dataset, name=NAME))
    plugins = load_plugins(extra=[("vs-trl-job", types.SimpleNamespace(areal_register_datasets=areal_register_datasets))])
    print(Trainer(config, plugins).run().render())


if __name__ == "__main__":
    script_main(main)
