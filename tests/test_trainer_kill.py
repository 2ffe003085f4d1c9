"""Trainer failure: a training worker killed with SIGKILL is noticed at once, whatever the
controller is doing, and with ``recover.mode=auto`` the launcher restarts the run, which resumes
from its last recover point and ends with the uninterrupted run's parameters, bitwise."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
from quickstart_runs import LAUNCHER, assert_same_params, cmdline, marked_pids, rewards, run_args, start, wait_until

from areal_core.config import TinyModelSpec, load_config
from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.scheduler.local import LocalScheduler
from areal_core.tiny_model import ensure_tiny_model
from areal_core.train.worker_group import TrainWorkerGroup, TrainWorkerError
from areal_core.api.trajectory import Trajectory

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    return str(ensure_tiny_model(TinyModelSpec(), ["0123456789+-=? "], tmp_path_factory.mktemp("models"), seed=0))


@pytest.fixture
def trainer(model_path, tmp_path):
    config = load_config(None, [f"model.path={model_path}", "actor.world_size=1"])
    with LocalScheduler(CpuPlatform()) as scheduler:
        controller = TrainWorkerGroup(config, CpuPlatform(), scheduler, model_path, tmp_path)
        controller.start()
        yield controller
        controller.stop()


def trajectories(count: int, length: int) -> list[Trajectory]:
    return [
        Trajectory(uid=str(i), prompt_id=str(i // 2), input_ids=[3 + i % 7] * length,
                   loss_mask=[0, 0] + [1] * (length - 2), logprobs=[0.0] * length,
                   versions=[-1, -1] + [0] * (length - 2), reward=float(i % 2))
        for i in range(count)
    ]


def test_a_command_sent_to_a_dead_worker_reports_its_death(trainer):
    """A command larger than the socket buffers breaks the pipe to a dead worker: reported as its death."""
    os.kill(trainer.handles[0].pid, signal.SIGKILL)
    trainer.handles[0].popen.wait(30)
    with pytest.raises(TrainWorkerError, match=r"trainer0 exited \(code -9\) before ComputeLogprobs"):
        trainer.compute_logprobs(trajectories(10_000, 400))
    assert not trainer.handles[0].alive()


def test_a_worker_killed_during_a_train_step_fails_the_step_at_once(trainer):
    pid = trainer.handles[0].pid
    os.kill(pid, signal.SIGSTOP)  # the step cannot finish before the kill lands
    raised: list[BaseException] = []

    def step() -> None:
        try:
            trainer.train_step(trajectories(4, 8), [1.0, -1.0, 1.0, -1.0], None)
        except BaseException as exc:  # noqa: BLE001 - checked below
            raised.append(exc)

    thread = threading.Thread(target=step)
    thread.start()
    thread.join(1.0)
    assert thread.is_alive(), raised  # waiting on the stopped worker
    os.kill(pid, signal.SIGKILL)
    thread.join(30)
    assert not thread.is_alive(), "the controller kept waiting on a dead worker"
    assert len(raised) == 1 and isinstance(raised[0], TrainWorkerError), raised
    assert "trainer0 exited (code -9) during TrainStep" in str(raised[0])


def _timestamped_lines(proc) -> list[tuple[float, str]]:
    """Read ``proc``'s output in a thread, each line with the monotonic time it arrived."""
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in proc.stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))

    threading.Thread(target=read, daemon=True).start()
    return lines


def _first(lines: list[tuple[float, str]], text: str) -> float | None:
    return next((t for t, line in lines if text in line), None)


def test_a_killed_training_worker_is_recovered_to_the_uninterrupted_result(uninterrupted_run, marks):
    mark = marks()
    run_dir = uninterrupted_run.root / "quickstart" / "worker-killed"
    recover = ["recover.mode=auto", "recover.retries=1", "recover.freq_steps=2"]
    args = run_args(uninterrupted_run.root, "worker-killed", *recover)
    proc = start([*LAUNCHER, *args], mark)
    lines = _timestamped_lines(proc)
    latest = run_dir / "recover" / "latest.json"
    wait_until(lambda: latest.exists() or proc.poll() is not None, 300, "the step-2 recover point")
    assert proc.poll() is None, "\n".join(line for _, line in lines)[-3000:]
    workers = [pid for pid in marked_pids(mark) if "areal_core.train.worker" in cmdline(pid)]
    assert len(workers) == 1
    os.kill(workers[0], signal.SIGKILL)  # mid-run: two steps and the final save still need it
    killed_at = time.monotonic()
    assert proc.wait(600) == 0, "\n".join(line for _, line in lines)[-3000:]
    done_at = time.monotonic()
    wait_until(lambda: not marked_pids(mark), 30, "every process of the run to exit")

    out = [line for _, line in lines]
    errors = [line for line in out if line.startswith("areal: error:")]
    assert len(errors) == 1 and "trainer0" in errors[0], out[-40:]
    assert sum("restarting from the last recover point" in line for line in out) == 1, out[-40:]
    assert any("recovered from step 2" in line for line in out), out[-40:]
    assert json.loads(latest.read_text())["step"] == 4
    assert rewards(run_dir) == rewards(uninterrupted_run.run_dir)
    assert_same_params(uninterrupted_run.run_dir, run_dir)

    exited, resumed = _first(lines, "restarting from the last recover point"), _first(lines, "recovered from step 2")
    print(
        f"\nworker SIGKILL -> controller exited {exited - killed_at:.1f}s -> training resumed from the step-2 "
        f"recover point {resumed - killed_at:.1f}s -> run finished {done_at - killed_at:.1f}s\n{errors[0][:160]}"
    )
