"""End to end through real processes: the quickstart script, recovery after a kill, no orphans."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "quickstart" / "train.py"
MARK = "AREAL_TEST_PROCESS_MARK"

pytestmark = pytest.mark.slow

SHORT_RUN = [
    "total_train_steps=4",
    "rollout.max_head_offpolicyness=0",  # synchronous: the same rollouts in both runs
    "rollout.engine_args={max_batch_size: 1}",  # one request at a time: batch-invariant numerics
    "gconfig.n_samples=4",
    "train_dataset.batch_size=4",
    "train_dataset.size=12",
    "valid_dataset.size=6",
    "stats.eval_every=2",
    "stats.progress=false",
]


def _marked_pids(mark: str) -> list[int]:
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


def _wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


def _start(cmd: list[str], mark: str) -> subprocess.Popen:
    env = {**os.environ, MARK: mark, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture
def marks():
    """Run marks handed out by a test; every marked process is killed afterwards, whatever happened."""
    issued: list[str] = []

    def new() -> str:
        issued.append(uuid.uuid4().hex)
        return issued[-1]

    yield new
    for mark in issued:
        for pid in _marked_pids(mark):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _run_args(tmp_path: Path, trial: str, *extra: str) -> list[str]:
    return ["--config", str(REPO / "examples/quickstart/config.yaml"), f"fileroot={tmp_path}", f"trial_name={trial}", *SHORT_RUN, *extra]


def _final_params(run_dir: Path) -> dict:
    return load_file(run_dir / "checkpoints" / "final" / "model.safetensors")


def _rewards(run_dir: Path) -> list[float]:
    return [json.loads(line)["reward/mean"] for line in (run_dir / "stats.jsonl").read_text().splitlines()]


def test_killed_run_recovers_to_the_uninterrupted_result(tmp_path, marks):
    launcher = [sys.executable, "-m", "areal_core.launcher.local", str(SCRIPT)]
    whole = subprocess.run(launcher + _run_args(tmp_path, "whole"), capture_output=True, text=True, timeout=600)
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]
    whole_dir = tmp_path / "quickstart" / "whole"
    for name in ("config.yaml", "stats.jsonl", "reward_curve.png", "checkpoints/final/model.safetensors"):
        assert (whole_dir / name).exists(), name
    assert list((whole_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert "train reward" in whole.stdout and "final model" in whole.stdout

    # The controller itself is killed with SIGKILL right after its step-2 recover point.
    mark = marks()
    killed_dir = tmp_path / "quickstart" / "killed"
    recover_args = _run_args(tmp_path, "killed", "recover.mode=auto", "recover.freq_steps=2")
    controller = _start([sys.executable, str(SCRIPT), *recover_args], mark)
    latest = killed_dir / "recover" / "latest.json"
    _wait_until(lambda: latest.exists() or controller.poll() is not None, 300, "the step-2 recover point")
    assert controller.poll() is None, controller.stdout.read()[-3000:]
    controller.kill()
    controller.wait()
    _wait_until(lambda: not _marked_pids(mark), 30, "servers and workers to exit after the controller was killed")
    assert json.loads(latest.read_text())["step"] == 2

    resumed = subprocess.run([sys.executable, str(SCRIPT), *recover_args], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "recovered from step 2" in resumed.stderr

    assert _rewards(killed_dir) == _rewards(whole_dir)
    expected, got = _final_params(whole_dir), _final_params(killed_dir)
    assert expected.keys() == got.keys()
    for name in expected:
        assert bool((expected[name] == got[name]).all()), f"{name} differs after recovery"


def _wait_for_first_step(proc: subprocess.Popen, run_dir: Path) -> None:
    stats = run_dir / "stats.jsonl"
    _wait_until(lambda: (stats.exists() and stats.stat().st_size > 0) or proc.poll() is not None, 300, "the first step")
    assert proc.poll() is None, proc.stdout.read()[-3000:]


def test_ctrl_c_stops_every_process(tmp_path, marks):
    mark = marks()
    proc = _start([sys.executable, "-m", "areal_core.launcher.local", str(SCRIPT), *_run_args(tmp_path, "sigint", "total_train_steps=500")], mark)
    _wait_for_first_step(proc, tmp_path / "quickstart" / "sigint")
    assert len(_marked_pids(mark)) >= 4  # launcher, controller, server, trainer worker (+ reward worker)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "interrupted" in out
    _wait_until(lambda: not _marked_pids(mark), 30, "every process of the run to exit")


def test_crash_of_a_training_worker_stops_the_run(tmp_path, marks):
    mark = marks()
    run_dir = tmp_path / "quickstart" / "crash"
    proc = _start([sys.executable, "-m", "areal_core.launcher.local", str(SCRIPT), *_run_args(tmp_path, "crash", "total_train_steps=500")], mark)
    _wait_for_first_step(proc, run_dir)
    workers = [pid for pid in _marked_pids(mark) if b"areal_core.train.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(workers) == 1
    os.kill(workers[0], signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out[-3000:]
    error_lines = [line for line in out.splitlines() if line.startswith("areal: error:")]
    assert len(error_lines) == 1 and "trainer0" in error_lines[0], out[-3000:]
    _wait_until(lambda: not _marked_pids(mark), 30, "every process of the run to exit")
