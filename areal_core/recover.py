"""Recover points: a DCP checkpoint plus what the controller needs to continue the same run.

Layout under ``run_dir/recover/``: ``step{N}/`` (the trainer's checkpoint) and ``latest.json``
(this module's :class:`RecoverInfo`). Both are written to temporary names and renamed, so a
crash at any point leaves the previous recover point intact.

Each recover point stores the :func:`fingerprint` of the config keys a resumed run must keep
(:data:`FIXED_KEYS`): the model's shape and source, which decide whether the checkpoint loads,
and the training data's source, size, order and seed, which give the saved data position its
meaning. :func:`check_fingerprint` refuses a resume that changed any of them.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import attrs

from areal_core.config import Config, to_dict
from areal_core.api.errors import ConfigError

LATEST = "latest.json"

#: Config keys (sections: every key below them) that must not change between a recover point and
#: the run resuming from it. Everything else (learning rate, steps, servers, world size: DCP
#: checkpoints reshard) may change.
FIXED_KEYS: tuple[str, ...] = (
    "model.path",
    "model.tiny",
    "model.dtype",
    "actor.lora",  # a checkpoint holds the adapter alone, of this rank and these targets
    "seed",
    "train_dataset.name",
    "train_dataset.path",
    "train_dataset.size",
    "train_dataset.shuffle",
    "train_dataset.options",
    "train_dataset.repeat",
)


def _flatten(value: Any, key: str) -> dict[str, Any]:
    if isinstance(value, dict) and value:
        return {k: v for name, item in value.items() for k, v in _flatten(item, f"{key}.{name}").items()}
    return {key: value}


def fingerprint(config: Config) -> dict[str, Any]:
    """The values of :data:`FIXED_KEYS` in ``config``, one dotted key per leaf."""
    data = to_dict(config)
    out: dict[str, Any] = {}
    for key in FIXED_KEYS:
        node: Any = data
        for part in key.split("."):
            node = node[part]
        out.update(_flatten(node, key))
    return out


def check_fingerprint(stored: dict[str, Any], config: Config, step: int) -> None:
    """Raise a one-line ConfigError listing every fixed key whose value differs from ``stored``."""
    current = fingerprint(config)
    changed = [
        f"{key} ({stored.get(key)!r} -> {current.get(key)!r})"
        for key in sorted(stored.keys() | current.keys())
        if stored.get(key) != current.get(key)
    ]
    if changed:
        raise ConfigError(
            "recover", f"the recover point at step {step} was written with other values of keys a resumed run must "
            f"keep: {', '.join(changed)}; put them back, or start a new trial (trial_name=...)"
        )  # fmt: skip


@attrs.frozen(kw_only=True)
class RecoverInfo:
    step: int  # train steps completed
    version: int  # weight version the servers serve
    loader_state: dict[str, int]
    in_flight: list[dict[str, Any]]  # dataset items taken from the loader but not yet trained on
    checkpoint: Path
    fingerprint: dict[str, Any] = attrs.Factory(dict)  # see FIXED_KEYS; empty in older recover points


class RecoverStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def latest(self) -> RecoverInfo | None:
        path = self.root / LATEST
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        return RecoverInfo(**{**data, "checkpoint": self.root / data["checkpoint"]})

    def save(self, info: RecoverInfo, write_checkpoint: Callable[[Path], None]) -> RecoverInfo:
        """Write the checkpoint via ``write_checkpoint(tmp_dir)``, then publish ``latest.json``."""
        self.root.mkdir(parents=True, exist_ok=True)
        name = f"step{info.step}"
        tmp = self.root / f".tmp-{name}"
        shutil.rmtree(tmp, ignore_errors=True)
        write_checkpoint(tmp)
        final = self.root / name
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        info = attrs.evolve(info, checkpoint=final)
        record = {**attrs.asdict(info), "checkpoint": name}
        tmp_json = self.root / f".{LATEST}.tmp"
        tmp_json.write_text(json.dumps(record))
        os.replace(tmp_json, self.root / LATEST)
        for old in self.root.glob("step*"):
            if old.name != name:
                shutil.rmtree(old, ignore_errors=True)
        return info
