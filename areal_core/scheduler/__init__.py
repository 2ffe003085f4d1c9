"""Schedulers start compute-plane processes (inference servers, training workers)."""

from areal_core.scheduler.base import ProcessHandle, ProcessSpec, Scheduler

__all__ = ["ProcessHandle", "ProcessSpec", "Scheduler"]
