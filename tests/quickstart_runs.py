"""Helpers for tests that run the quickstart script as real processes (short runs, kills, marks).

Every process a test starts carries ``AREAL_TEST_PROCESS_MARK=<mark>`` in its environment, and so
does everything it starts in turn, which is how a test finds a run's workers and checks that
nothing is left behind. The fixtures (``marks``, ``uninterrupted_run``) are served by conftest.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Callable

import attrs
import pytest
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "quickstart" / "train.py"
CONFIG = REPO / "examples" / "quickstart" / "config.yaml"
LAUNCHER = [sys.executable, "-m", "areal_core.launcher.local", str(SCRIPT)]
MARK = "AREAL_TEST_PROCESS_MARK"

SHORT_RUN = [
    "total_train_steps=4",
    "rollout.max_head_offpolicyness=0",  # synchronous: the same rollouts in both runs
    "rollout.engine_args={max_batch_size: 1}",  # one request at a time: batch-invariant numerics
    "gconfig.n_samples=4",
    "actor.optimizer.lr=6.0e-4",  # the rate these short runs were sized with (the quickstart's is 3e-4 for groups of 16)
    "train_dataset.batch_size=4",
    "train_dataset.size=12",
    "valid_dataset.size=6",
    "stats.eval_every=2",
    "stats.samples_every=1",  # a table of training samples every step: samples.jsonl is compared after a recovery
    "stats.progress=false",
]


def marked_pids(mark: str) -> list[int]:
    """Processes whose environment carries ``mark`` (everything a run started)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"{MARK}={mark}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


def start(cmd: list[str], mark: str, *, sigint_ignored: bool = False) -> subprocess.Popen:
    """Start ``cmd`` with ``mark`` in its environment; stdout and stderr together as text.
    ``sigint_ignored``: it inherits SIGINT ignored, as a shell's background job does."""
    env = {**os.environ, MARK: mark, "PYTHONUNBUFFERED": "1"}
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=ignore)


@pytest.fixture
def marks():
    """Run marks handed out by a test; every marked process is killed afterwards, whatever happened."""
    issued: list[str] = []

    def new() -> str:
        issued.append(uuid.uuid4().hex)
        return issued[-1]

    yield new
    for mark in issued:
        kill_marked(mark)


def kill_marked(mark: str) -> None:
    for pid in marked_pids(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@attrs.frozen
class FinishedRun:
    root: Path  # fileroot: later runs under it share the tiny model
    run_dir: Path
    proc: subprocess.CompletedProcess
    wall_s: float


@pytest.fixture(scope="session")
def uninterrupted_run(tmp_path_factory) -> FinishedRun:
    """The short quickstart run through the launcher, uninterrupted: the reference of the recovery tests."""
    root = tmp_path_factory.mktemp("quickstart")
    t0 = time.monotonic()
    proc = subprocess.run(LAUNCHER + run_args(root, "whole"), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return FinishedRun(root, root / "quickstart" / "whole", proc, time.monotonic() - t0)


def run_args(root: Path, trial: str, *extra: str) -> list[str]:
    """The quickstart's config shortened by :data:`SHORT_RUN`, writing under ``root/quickstart/trial``."""
    return ["--config", str(CONFIG), f"fileroot={root}", f"trial_name={trial}", *SHORT_RUN, *extra]


def final_params(run_dir: Path) -> dict:
    return load_file(run_dir / "checkpoints" / "final" / "model.safetensors")


def rewards(run_dir: Path) -> list[float]:
    return [json.loads(line)["reward/mean"] for line in (run_dir / "stats.jsonl").read_text().splitlines()]


def assert_same_params(expected_dir: Path, got_dir: Path) -> None:
    """The two runs' final models are bitwise equal."""
    expected, got = final_params(expected_dir), final_params(got_dir)
    assert expected.keys() == got.keys()
    for name in expected:
        assert bool((expected[name] == got[name]).all()), f"{name} differs"


def wait_for_first_step(proc: subprocess.Popen, run_dir: Path) -> None:
    stats = run_dir / "stats.jsonl"
    wait_until(lambda: (stats.exists() and stats.stat().st_size > 0) or proc.poll() is not None, 300, "the first step")
    assert proc.poll() is None, proc.stdout.read()[-3000:]
