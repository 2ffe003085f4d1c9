"""Schedulers start compute-plane processes (inference servers, training workers)."""

from areal_core.scheduler.base import ProcessDiedError, ProcessHandle, ProcessSpec, Scheduler

__all__ = ["ProcessDiedError", "ProcessHandle", "ProcessSpec", "Scheduler"]
