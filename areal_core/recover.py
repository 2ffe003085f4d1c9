"""Recover points: a DCP checkpoint plus what the controller needs to continue the same run.

Layout under ``run_dir/recover/``: ``step{N}/`` (the trainer's checkpoint) and ``latest.json``
(this module's :class:`RecoverInfo`). Both are written to temporary names and renamed, so a
crash at any point leaves the previous recover point intact.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import attrs

LATEST = "latest.json"


@attrs.frozen(kw_only=True)
class RecoverInfo:
    step: int  # train steps completed
    version: int  # weight version the servers serve
    loader_state: dict[str, int]
    in_flight: list[dict[str, Any]]  # dataset items taken from the loader but not yet trained on
    checkpoint: Path


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
