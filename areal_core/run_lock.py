"""One run per trial directory: ``run_dir/run.lock`` holds an exclusive ``flock`` and the holder's PID.

The kernel drops the lock when its process ends, so a launcher's restart (which starts after the
previous controller exited) takes it again. A second run on the same directory gets an
:class:`ArealError` naming the holder's PID. A lock still held after its recorded PID died (a
leftover child inherited it) is broken: the file is replaced and the new one locked.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from areal_core.api.errors import ArealError

LOCK_FILE = "run.lock"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


def _recorded_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


class RunLock:
    """``with RunLock(run_dir):`` the run owns ``run_dir`` (created if missing) until the block ends."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def _try_lock(self) -> int | None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    def __enter__(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = self._try_lock()
        if fd is None:
            pid = _recorded_pid(self.path)
            if pid is not None and _pid_alive(pid):
                raise ArealError(
                    f"{self.path.parent} is in use by another run (PID {pid}); wait for it to finish, stop it, "
                    "or choose another trial_name"
                )
            self.path.unlink(missing_ok=True)  # the recorded holder is gone: break its lock
            fd = self._try_lock()
            if fd is None:  # another run took it in between
                raise ArealError(f"{self.path.parent} is in use by another run (PID {_recorded_pid(self.path)})")
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock; the file stays, holding the last PID
            self._fd = None
