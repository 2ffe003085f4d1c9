"""Datasets: prompt sources whose items carry the fields their reward needs.

A loader is ``load(config: DatasetConfig, split: str) -> list[dict]`` (registered through
``areal_register_datasets``); each item has a unique ``"id"``, a ``"prompt"`` and reward fields.
The reward is called as ``fn(prompt, completion, **reward_data(item))``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from areal_core.api.errors import ConfigError

if TYPE_CHECKING:
    from areal_core.config import DatasetConfig

SPLITS = ("train", "valid")


def dataset_key(split: str) -> str:
    """The config section a split comes from, for error messages: ``train_dataset``/``valid_dataset``."""
    if split not in SPLITS:
        raise ValueError(f"unknown dataset split {split!r}; expected one of {SPLITS}")
    return f"{split}_dataset"


def dataset_options(config: DatasetConfig, split: str, defaults: dict[str, Any]) -> dict[str, Any]:
    """``defaults`` updated with ``config.options``; an unknown option is a ConfigError naming it."""
    for name, value in config.options.items():
        if name not in defaults:
            known = ", ".join(sorted(defaults)) or "none"
            raise ConfigError(
                f"{dataset_key(split)}.options.{name}",
                f"unknown option for dataset {config.name!r} (options: {known})",
            )
        if value is not None and defaults[name] is not None and type(value) is not type(defaults[name]):
            raise ConfigError(
                f"{dataset_key(split)}.options.{name}",
                f"expected {type(defaults[name]).__name__}, got {value!r}",
            )
    return {**defaults, **config.options}


def reward_data(item: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments a reward gets for ``item``: every field except ``id``, ``prompt`` and
    the framework's own ``_``-prefixed tags."""
    return {k: v for k, v in item.items() if k not in ("id", "prompt") and not k.startswith("_")}


def corpus(items: list[dict[str, Any]]) -> list[str]:
    """Every prompt and string reward field, e.g. to build a character tokenizer's alphabet."""
    return [value for item in items for key, value in item.items() if key != "id" and isinstance(value, str)]
