"""Schedulers start compute-plane processes (inference servers, training workers)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from areal_core.api.scheduler import ProcessDiedError, ProcessHandle, ProcessSpec, Scheduler

if TYPE_CHECKING:
    from areal_core.config import Config
    from areal_core.api.platform import Platform

__all__ = ["ProcessDiedError", "ProcessHandle", "ProcessSpec", "Scheduler", "controller_cpus", "make_scheduler"]


def make_scheduler(config: Config, platform: Platform) -> Scheduler:
    """The scheduler named by ``config.scheduler``; the controller code above it is the same."""
    if config.scheduler == "ray":
        from areal_core.scheduler.ray import RayScheduler

        return RayScheduler(config, platform)
    from areal_core.scheduler.local import LocalScheduler

    return LocalScheduler(platform, config.cluster.bind_host)


def controller_cpus(config: Config) -> tuple[int, ...]:
    """The cores the controller runs on: ``rollout.cpus`` when ``actor.cpus`` is set too (its work,
    streaming requests and scoring rewards, is the rollout plane's, and the trainers' cores stay
    theirs alone); () otherwise (not pinned)."""
    return tuple(config.rollout.cpus) if config.rollout.cpus and config.actor.cpus else ()
