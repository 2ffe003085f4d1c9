"""WeightPublisher: in asynchronous runs the servers' load runs while the next step trains.

The rollout, fleet and updater here are doubles that follow the calls the real ones make (the
fleet re-publishes on the survivors once when a server is lost, as ``ServerFleet`` does); the
publisher in real runs is covered by the quickstart and elastic runs."""

from __future__ import annotations

import logging
import threading

import pytest

from areal_core.api.errors import ArealError
from areal_core.api.weights import WeightUpdateError
from areal_core.timeline import Timeline
from areal_core.weight_publisher import WeightPublisher


class RecordingRollout:
    def __init__(self, events: list) -> None:
        self.events, self.version = events, 0

    def pause(self) -> None:
        self.events.append("pause")

    def resume(self) -> None:
        self.events.append("resume")

    def set_version(self, version: int) -> None:
        self.events.append(("set_version", version))
        self.version = version


class RetryOnceFleet:
    """``ServerFleet.update_weights``' protocol: publish, once more if a server was lost, tag."""

    def __init__(self, lose_a_server: bool = False) -> None:
        self.lose_a_server = lose_a_server

    def update_weights(self, publish, set_version, version: int, *, retry_on_survivors: bool = True) -> None:
        try:
            publish(version)
        except ArealError as exc:
            if not self.lose_a_server:
                raise
            if not retry_on_survivors:
                raise WeightUpdateError(f"version {version} is not re-published on the surviving servers") from exc
            publish(version)  # on the survivors
        set_version(version)


class StagingUpdater:
    """The disk path's shape: ``stage`` is the trainer's part, ``update`` the servers' load (which
    stages again itself when the last stage was for another version or was used up)."""

    def __init__(self, events: list, fail_first: Exception | None = None) -> None:
        self.events, self.fail_first = events, fail_first
        self.release = threading.Event()
        self.release.set()
        self.loading = threading.Event()  # set once a load has begun
        self.staged: int | None = None

    def stage(self, version: int) -> None:
        self.events.append(("stage", version))
        self.staged = version

    def update(self, version: int) -> None:
        if self.staged != version:
            self.stage(version)
        self.staged = None
        self.loading.set()
        self.release.wait(timeout=30)
        failure, self.fail_first = self.fail_first, None
        if failure is not None:
            raise failure
        self.events.append(("load", version))


class InlineUpdater(StagingUpdater):
    stage = None  # type: ignore[assignment] - no SupportsStaging: it sends as it goes (the xccl path)

    def update(self, version: int) -> None:
        self.release.wait(timeout=30)
        self.events.append(("load", version))


def publisher(events: list, updater, *, overlap: bool, fleet=None) -> WeightPublisher:
    return WeightPublisher(RecordingRollout(events), fleet or RetryOnceFleet(), updater, Timeline(None), overlap=overlap)


def test_an_overlapped_publish_holds_the_caller_for_staging_only_and_the_next_one_waits_for_it():
    events: list = []
    updater = StagingUpdater(events)
    pub = publisher(events, updater, overlap=True)
    updater.release.clear()
    pub.publish(1, step=1)
    assert updater.loading.wait(timeout=30)
    assert events == [("stage", 1), "pause"]  # the servers are still loading: the caller goes on
    events.append("next step trains")
    updater.release.set()
    pub.publish(2, step=2)
    pub.wait()
    assert events == [
        ("stage", 1), "pause", "next step trains", ("load", 1), ("set_version", 1), "resume",
        ("stage", 2), "pause", ("load", 2), ("set_version", 2), "resume",
    ]  # fmt: skip
    pub.close()


@pytest.mark.parametrize("overlap, updater_type", [(False, StagingUpdater), (True, InlineUpdater)])
def test_without_overlap_or_staging_the_publish_returns_once_the_servers_serve_it(overlap, updater_type):
    events: list = []
    pub = publisher(events, updater_type(events), overlap=overlap)
    pub.publish(1, step=1)
    assert events[-3:] == [("load", 1), ("set_version", 1), "resume"]
    pub.close()


@pytest.mark.parametrize(
    "overlap, version_served, expected",
    [
        (True, 0, [("stage", 1), "pause", "resume"]),  # aborted: the trainer is not asked to stage again
        (False, 1, [("stage", 1), "pause", ("stage", 1), ("load", 1), ("set_version", 1), "resume"]),
    ],
)
def test_a_server_lost_mid_load_re_publishes_on_the_survivors_unless_the_next_step_trains(
    overlap, version_served, expected
):
    events: list = []
    updater = StagingUpdater(events, fail_first=WeightUpdateError("a server died mid-load"))
    pub = publisher(events, updater, overlap=overlap, fleet=RetryOnceFleet(lose_a_server=True))
    pub.publish(1, step=1)
    pub.wait()
    assert (pub.aborted, pub.rollout.version) == (1 - version_served, version_served)
    assert events == expected
    pub.close()


def test_a_load_that_fails_otherwise_raises_from_wait_and_is_only_logged_by_close(caplog):
    events: list = []
    updater = StagingUpdater(events, fail_first=RuntimeError("every server is gone"))
    pub = publisher(events, updater, overlap=True)
    pub.publish(1, step=1)
    with pytest.raises(RuntimeError, match="every server is gone"):
        pub.wait()
    assert events[-1] == "resume" and pub.rollout.version == 0
    updater.fail_first = RuntimeError("lost again")
    pub.publish(2, step=2)
    with caplog.at_level(logging.ERROR):
        pub.close()  # the run's cleanup, after its loop stopped: the loop's own error is the one raised
    assert "the last weight publish failed" in caplog.text and "lost again" in caplog.text
