"""Checks of what a resolved config points at: the model directory, ``fileroot`` and the datasets.

``areal config`` and every run call :func:`preflight` before anything starts, so a bad path or a
broken dataset is one :class:`ConfigError` line naming the key, and nothing is written.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from areal_core.config import Config, DatasetConfig, sequence_parallel_problem
from areal_core.api.dataset import dataset_key
from areal_core.dataset_loading import load_dataset
from areal_core.api.errors import ConfigError
from areal_core.api.hub import is_hub_id
from areal_core.model_source import check_source, is_source
from areal_core.plugins import Plugins

#: Files of which a Hugging Face model directory holds at least one when it has a tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")


def check_model_path(path: str, models_root: Path) -> None:
    """``model.path`` is empty (tiny model), a hub id (fetched at run time), a source (converted at run
    time into ``models_root``: :mod:`areal_core.model_source`) or a model directory."""
    if not path or is_hub_id(path):
        return
    if is_source(path):
        check_source(path, models_root)
        return
    p = Path(path)
    if p.is_file():
        raise ConfigError("model.path", f"{path!r} is a file; give a Hugging Face model directory")
    if not (p / "config.json").is_file():
        raise ConfigError("model.path", f"{path!r} has no config.json; give a Hugging Face model directory")
    if not any((p / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(
            "model.path", f"{path!r} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); save the model's "
            "tokenizer into it (tokenizer.save_pretrained)"
        )  # fmt: skip


def check_fileroot(fileroot: str) -> None:
    """``fileroot`` is a directory this process can create run directories in (it may not exist yet)."""
    p = Path(fileroot).absolute()
    existing = next(parent for parent in (p, *p.parents) if parent.exists())
    if not existing.is_dir():
        raise ConfigError("fileroot", f"{str(existing)!r} is a file, not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".areal-probe-", dir=existing))
    except OSError as exc:
        raise ConfigError("fileroot", f"cannot create directories in {str(existing)!r} ({exc.strerror})") from None


def datasets(config: Config, plugins: Plugins, *, fetch: bool = True) -> dict[str, list[dict[str, Any]]]:
    """The checked items of each configured split. ``fetch=False`` skips a hub dataset (a run fetches it)."""
    splits: dict[str, DatasetConfig] = {"train": config.train_dataset}
    if config.valid_dataset is not None:
        splits["valid"] = config.valid_dataset
    loaded = {
        split: load_dataset(cfg, split, plugins)
        for split, cfg in splits.items()
        if fetch or not is_hub_id(cfg.path)
    }
    train = loaded.get("train")
    batch = config.train_dataset.batch_size
    if train is not None and len(train) < batch:
        copies = -(-batch * config.train_dataset.repeat // len(train))
        raise ConfigError(
            "train_dataset.batch_size",
            f"{batch} prompts per step, but the train dataset has {len(train)} items (a step would take some "
            f"twice); lower it, use more data, or repeat each item: train_dataset.repeat={copies}",
        )
    return loaded


def hub_notes(config: Config) -> list[str]:
    """What a run fetches from the hub that ``areal config`` does not check."""
    return [
        f"{dataset_key(split)}.path: {cfg.path!r} is fetched from the hub when the run loads data"
        for split, cfg in (("train", config.train_dataset), ("valid", config.valid_dataset))
        if cfg is not None and is_hub_id(cfg.path)
    ]


def check_sequence_parallel(config: Config) -> None:
    """``actor.sequence_parallel`` against a model directory's heads (the tiny model's are checked
    with the config; a hub id's or a source's when the trainer loads the model)."""
    path, sp = config.model.path, config.actor.sequence_parallel
    if sp == 1 or not path or not (Path(path) / "config.json").is_file():
        return
    model = json.loads((Path(path) / "config.json").read_text())
    heads = model.get("num_attention_heads")
    if isinstance(heads, int):
        problem = sequence_parallel_problem(heads, model.get("num_key_value_heads") or heads, sp)
        if problem:
            raise ConfigError("actor.sequence_parallel", problem)


def preflight(config: Config, plugins: Plugins, *, fetch: bool = True) -> dict[str, list[dict[str, Any]]]:
    """Every check above; returns the datasets' items (see :func:`datasets`)."""
    check_model_path(config.model.path, Path(config.fileroot) / "models")
    check_sequence_parallel(config)
    check_fileroot(config.fileroot)
    return datasets(config, plugins, fetch=fetch)
