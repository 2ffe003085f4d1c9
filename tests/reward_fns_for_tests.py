"""Module-level reward functions for reward-runner tests (workers import them by name)."""

from __future__ import annotations

import os
import time


def completion_length(prompt: str, completion: str, **_: object) -> float:
    return float(len(completion))


def worker_pid(prompt: str, completion: str, **_: object) -> float:
    return float(os.getpid())


async def async_length(prompt: str, completion: str, **_: object) -> float:
    return float(len(completion))


def raises_on_bad(prompt: str, completion: str, **_: object) -> float:
    """Raises for the completion "bad"; otherwise returns its worker's pid."""
    if completion == "bad":
        raise ValueError("bad completion")
    return float(os.getpid())


def exits_on_bad(prompt: str, completion: str, **_: object) -> float:
    """Kills its own worker process for the completion "bad"; otherwise returns the worker's pid."""
    if completion == "bad":
        os._exit(3)
    return float(os.getpid())


def hangs_on_bad(prompt: str, completion: str, pid_file: str = "", **_: object) -> float:
    """For "bad", writes the worker's pid to ``pid_file`` and hangs; otherwise returns the pid."""
    if completion == "bad":
        with open(pid_file, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(600)
    return float(os.getpid())


def returns_nan(prompt: str, completion: str, **_: object) -> float:
    return float("nan")


def _fail_outside(pid: int) -> object:
    if os.getpid() != pid:
        raise ImportError("this reward cannot be loaded in a worker")
    return completion_length


class BrokenInWorkers:
    """Pickles fine, but unpickling it in any other process fails (like a module import error)."""

    def __reduce__(self):
        return (_fail_outside, (os.getpid(),))


def always_raises(prompt: str, completion: str, **_: object) -> float:
    return 1 / 0


def always_exits(prompt: str, completion: str, **_: object) -> float:
    os._exit(3)


def fails_by_completion(prompt: str, completion: str, pid_file: str = "", **_: object) -> float:
    """"raise" raises, "exit" kills the worker, "hang" writes the pid to ``pid_file`` and hangs;
    otherwise returns the worker's pid."""
    if completion == "raise":
        raise ValueError("bad completion")
    if completion == "exit":
        os._exit(3)
    if completion == "hang":
        return hangs_on_bad(prompt, "bad", pid_file)
    return float(os.getpid())


def pid_and_length(prompt: str, completion: str, **_: object) -> float:
    """The worker's pid * 1000 + the completion's length."""
    return float(os.getpid() * 1000 + len(completion))
