"""One run per trial directory: a second one refuses with the holder's PID; a dead holder's lock is taken over."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from areal_core.cli import main

HOLD = textwrap.dedent(
    """
    import sys, time
    from areal_core.config import load_config
    from areal_core.run_lock import RunLock
    with RunLock(load_config(None, [f"fileroot={sys.argv[1]}"]).run_dir):
        print("held", flush=True)
        time.sleep(600)
    """
)


def _holder(root: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(root)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_run_on_the_same_trial_refuses_naming_the_pid(tmp_path: Path, capsys) -> None:
    holder = _holder(tmp_path)
    try:
        rc = main(["run", f"fileroot={tmp_path}", "total_train_steps=1", "stats.progress=false"])
        out, err = capsys.readouterr()
        assert rc == 2 and out == ""
        assert err.strip() == (
            f"areal: error: {tmp_path / 'quickstart' / 'trial0'} is in use by another run (PID {holder.pid}); "
            "wait for it to finish, stop it, or choose another trial_name"
        )
        assert sorted(p.name for p in (tmp_path / "quickstart" / "trial0").iterdir()) == ["run.lock"]
    finally:
        holder.kill()
        holder.wait()


def test_a_dead_holders_lock_is_taken_over_and_released(tmp_path: Path) -> None:
    from areal_core.run_lock import RunLock

    holder = _holder(tmp_path)
    holder.kill()
    holder.wait()
    run_dir = tmp_path / "quickstart" / "trial0"
    assert (run_dir / "run.lock").read_text().strip() == str(holder.pid)  # left behind by the dead run
    with RunLock(run_dir):
        assert (run_dir / "run.lock").read_text().strip() == str(os.getpid())
        with pytest.raises(Exception, match=f"in use by another run \\(PID {os.getpid()}\\)"):
            RunLock(run_dir).__enter__()
    with RunLock(run_dir):  # released on exit: the launcher's restart takes it again
        pass


def test_a_stale_pid_file_whose_lock_is_still_held_by_a_leftover_child_is_taken_over(tmp_path: Path) -> None:
    """A process that inherited the lock outlives the run: the recorded PID is dead, so the lock is broken."""
    from areal_core.run_lock import RunLock

    run_dir = tmp_path / "trial"
    run_dir.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock_file = run_dir / "run.lock"
    lock_file.write_text(dead.stdout)
    keeper = subprocess.Popen(
        [sys.executable, "-c", f"import fcntl,time; f=open({str(lock_file)!r}); fcntl.flock(f, fcntl.LOCK_EX); print(1, flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert keeper.stdout is not None and keeper.stdout.readline().strip() == "1"
        with RunLock(run_dir):
            assert lock_file.read_text().strip() == str(os.getpid())
    finally:
        keeper.kill()
        keeper.wait()
