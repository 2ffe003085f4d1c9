"""Publishing each new version of the trainer's weights to the inference fleet (:class:`WeightPublisher`).

A publish is the updater's own part first (``stage``, where it can: the disk path writes its
files while generation goes on), then generation pauses, every server loads the version, and
generation resumes. With ``overlap`` and an updater that stages, only the first part holds the
training loop: pause, load and resume run on a thread while the next step trains (the trainer
takes no part in them). That pays where generation has a load's worth of slack: the staleness
bound starts the next batch's episodes only once the servers serve the version just trained, so a
run bound by generation gets nothing from it (examples/smollm2/README.md, "Asynchrony").
Whatever needs the servers on the new version or the fleet to itself (the next publish,
evaluation, recover points, fleet tending, the run's end) calls :meth:`WeightPublisher.wait` first.

Synchronous runs (``max_head_offpolicyness: 0``) gain nothing from it, since their next batch
waits for the new version anyway, so the trainer overlaps only asynchronous ones.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from areal_core.api.weights import SupportsStaging, WeightUpdateError
from areal_core.controller_tuning import collect_all_soon

if TYPE_CHECKING:
    from areal_core.api.trajectory import Trajectory
    from areal_core.api.weights import WeightUpdater
    from areal_core.rollout.fleet import ServerFleet
    from areal_core.rollout.runner import RolloutRunner
    from areal_core.timeline import Timeline

logger = logging.getLogger(__name__)


class WeightPublisher:
    """Publishes versions through ``updater`` to ``fleet``, pausing ``rollout`` around the load."""

    def __init__(
        self, rollout: RolloutRunner, fleet: ServerFleet, updater: WeightUpdater, timeline: Timeline, *, overlap: bool
    ) -> None:
        self.rollout, self.fleet, self.updater, self.timeline = rollout, fleet, updater, timeline
        self.aborted = 0  # publishes that left the servers on their previous weights
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="weight-load") if overlap else None
        self._pending: Future[None] | None = None

    def publish(self, version: int, step: int, done_with: list[Trajectory] | None = None) -> float:
        """Publish ``version`` (the ``done_with`` batch is freed while generation is paused, see
        :func:`collect_all_soon`); returns the seconds the caller was held. An aborted update
        leaves every server on its previous weights and version, and the run goes on (the next
        step publishes newer ones)."""
        staged = isinstance(self.updater, SupportsStaging)
        with self.timeline.span("weight_update", step, version=version) as held:
            self.wait()
            if staged:
                with self.timeline.span("weight_stage", step, parent="weight_update"):
                    self.updater.stage(version)  # type: ignore[attr-defined]
            if staged and self._loader is not None:
                self._pending = self._loader.submit(self._load, version, step, done_with, retry=False)
            else:
                self._load(version, step, done_with, retry=True)
        return held.seconds

    def wait(self) -> None:
        """Return once the last publish has finished; raises what it raised (a lost fleet)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Wait for the last publish, logging (not raising) its failure: for the run's cleanup,
        where the loop's own error, if any, is the one to report."""
        try:
            self.wait()
        except Exception:  # noqa: BLE001 - the loop has stopped already; say why the publish failed
            logger.exception("the last weight publish failed")
        if self._loader is not None:
            self._loader.shutdown(wait=True)

    def _load(self, version: int, step: int, done_with: list[Trajectory] | None, *, retry: bool) -> None:
        """Pause, load ``version`` on every server, resume. ``retry=False``: a server lost during
        the load aborts the update instead of re-publishing on the survivors, because the updater
        would stage again from a trainer that has moved on to the next step."""
        rollout, timeline = self.rollout, self.timeline
        with timeline.span("pause", step, parent="weight_update"):
            rollout.pause()
        cleaned = collect_all_soon(done_with)  # the controller's own garbage, while generation waits anyway
        try:  # servers that joined get the weights too; one lost meanwhile is left out
            with timeline.span("weight_load", step, parent="weight_update"):
                self.fleet.update_weights(self.updater.update, rollout.set_version, version, retry_on_survivors=retry)
        except WeightUpdateError as exc:
            self.aborted += 1
            logger.warning("weight update to version %d aborted; servers keep version %d: %s", version, rollout.version, exc)
        finally:
            with timeline.span("heap_collect", step, parent="weight_update"):
                cleaned.wait()  # with requests going, it would share the core with the rollout loop
            with timeline.span("resume", step, parent="weight_update"):
                rollout.resume()

