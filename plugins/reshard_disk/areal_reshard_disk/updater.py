"""The ``disk`` weight path: the trainer writes HF safetensors, every server loads them.

``stage(v)`` has the trainer save into ``{run_dir}/weights/.tmp-v{v}-*`` (a leading dot, which
servers refuse to load) and renames it to ``weights/v{v}``, while the servers go on generating on
the weights they hold. ``update(v)`` asks each server to load it (staging it first when
``stage(v)`` did not), then prunes the older version: it becomes ``weights/.spare``, whose files
the next save overwrites in place (rewriting pages that are already there costs a third of
freeing a file and writing a new one); any further ones are deleted in the background. ``close``
deletes the spare. A crash of any process leaves either no ``v{v}`` or a complete one (the rename
is atomic). Nothing is fsynced: the files are a hand-off between running processes, and after a
machine crash the servers are gone too and the run publishes again from its recover point, so
durability would buy nothing (it cost a third of a 500 MB update). A server that cannot load
``v{v}`` aborts the update: every server loads the last published version again and ``v{v}`` is
removed (:class:`WeightUpdateError`).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from areal_core.api.errors import ArealError
from areal_core.api.weights import WeightUpdateError, WeightUpdater

if TYPE_CHECKING:
    from areal_core.api import Config
    from areal_core.api.engine import InferenceEngine
    from areal_core.api.platform import Platform
    from areal_core.api.weights import TrainerHandle

_TMP_PREFIX = ".tmp-v"
_PRUNED_PREFIX = ".pruned-"
_SPARE = ".spare"
_VERSION_DIR = re.compile(r"v\d+")


class DiskWeightUpdater(WeightUpdater):
    """Publishes weights through ``{run_dir}/weights/v{version}``; keeps only the newest."""

    name = "disk"

    def __init__(self, config: Config, platform: Platform) -> None:
        super().__init__(config, platform)
        self.weights_dir = Path(config.run_dir).resolve() / "weights"
        self._trainer: TrainerHandle | None = None
        self._engine: InferenceEngine | None = None
        self._published: tuple[Path, int] | None = None  # the last version every server loaded
        self._staged: int | None = None  # the version whose files stage() wrote for the next update
        self._deleter: ThreadPoolExecutor | None = None  # deletes pruned versions in the background

    def connect(self, trainer: TrainerHandle, engine: InferenceEngine) -> None:
        self._trainer, self._engine = trainer, engine
        self.weights_dir.mkdir(parents=True, exist_ok=True)
        for prefix in (_TMP_PREFIX, _PRUNED_PREFIX, _SPARE):  # left by a crashed writer, a prune or a run
            for stale in self.weights_dir.glob(f"{prefix}*"):
                shutil.rmtree(stale, ignore_errors=True)

    def version_dir(self, version: int) -> Path:
        return self.weights_dir / f"v{version}"

    def stage(self, version: int) -> None:
        """Write ``version``'s files (servers load nothing yet): the trainer's part of the update."""
        trainer, _ = self._require()
        self._staged = None
        tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{version}-", dir=self.weights_dir))
        spare = self.weights_dir / _SPARE
        if spare.is_dir():  # its files are rewritten in place
            os.rename(spare, tmp)
        try:
            trainer.save_hf(str(tmp))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        final = self.version_dir(version)
        if final.exists():  # re-publishing a version (e.g. after recovery): replace it whole
            shutil.rmtree(final)
        os.rename(tmp, final)
        self._staged = version

    def update(self, version: int) -> None:
        _, engine = self._require()
        if self._staged != version:
            self.stage(version)
        self._staged = None  # a retry of this update writes the files again
        final = self.version_dir(version)
        try:
            engine.load_weights_from_disk(str(final), version)
        except ArealError as exc:
            self._abort(final, version, exc)
        self._published = (final, version)
        self._prune(keep=final)

    def _require(self) -> tuple[TrainerHandle, InferenceEngine]:
        if self._trainer is None or self._engine is None:
            raise RuntimeError("DiskWeightUpdater used before connect(trainer, engine)")
        return self._trainer, self._engine

    def _abort(self, final: Path, version: int, error: ArealError) -> NoReturn:
        """A server could not load ``version``: every server loads the last published version
        again (those that loaded ``version`` go back), ``version`` is removed, the update aborts."""
        assert self._engine is not None
        served = "its previous weights"
        if self._published is not None:
            previous, previous_version = self._published
            self._engine.load_weights_from_disk(str(previous), previous_version)
            served = f"version {previous_version}"
        shutil.rmtree(final, ignore_errors=True)
        raise WeightUpdateError(f"the servers could not load version {version}, so every server serves {served}: {error}")

    def _prune(self, keep: Path) -> None:
        """Older versions leave ``weights/`` at once: the first becomes the spare the next save
        rewrites, any others are renamed under a dot name (so no later publish of the same version
        meets them) and deleted in the background (freeing the files' pages costs as much as
        loading them)."""
        for old in self.weights_dir.iterdir():
            if old != keep and old.is_dir() and _VERSION_DIR.fullmatch(old.name):
                spare = self.weights_dir / _SPARE
                if not spare.exists():
                    os.rename(old, spare)
                    continue
                pruned = Path(tempfile.mkdtemp(prefix=_PRUNED_PREFIX, dir=self.weights_dir))
                os.rename(old, pruned / old.name)
                if self._deleter is None:
                    self._deleter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weights-prune")
                self._deleter.submit(shutil.rmtree, pruned, ignore_errors=True)

    def close(self) -> None:
        """Delete the spare; wait for the background deletes."""
        shutil.rmtree(self.weights_dir / _SPARE, ignore_errors=True)
        deleter, self._deleter = self._deleter, None
        if deleter is not None:
            deleter.shutdown(wait=True)
