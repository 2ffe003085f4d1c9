"""End to end through real processes: the quickstart script, recovery after a kill, no orphans."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from quickstart_runs import (
    LAUNCHER, SCRIPT, assert_same_params, cmdline, marked_pids, rewards, run_args, start, wait_for_first_step, wait_until,
)

from areal_core.api.errors import ProcessFailedError

pytestmark = pytest.mark.slow


def test_killed_run_recovers_to_the_uninterrupted_result(uninterrupted_run, marks):
    tmp_path, whole_dir, whole = uninterrupted_run.root, uninterrupted_run.run_dir, uninterrupted_run.proc
    for name in ("config.yaml", "stats.jsonl", "reward_curve.png", "checkpoints/final/model.safetensors"):
        assert (whole_dir / name).exists(), name
    assert list((whole_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert "train reward" in whole.stdout and "final model" in whole.stdout
    rows = [json.loads(line) for line in (whole_dir / "stats.jsonl").read_text().splitlines()]
    parts = ("rollout_wait", "train_fwd_bwd", "prox_logp", "optimizer", "rpc", "weight_update", "step")
    assert all(row[f"time/{part}_s"] >= 0 for row in rows for part in parts)
    assert all(row["time/prox_logp_s"] == 0 for row in rows)  # one minibatch: fused into the update

    # The controller itself is killed with SIGKILL right after its step-2 recover point.
    mark = marks()
    killed_dir = tmp_path / "quickstart" / "killed"
    recover_args = run_args(tmp_path, "killed", "recover.mode=auto", "recover.freq_steps=2")
    controller = start([sys.executable, str(SCRIPT), *recover_args], mark)
    latest = killed_dir / "recover" / "latest.json"
    wait_until(lambda: latest.exists() or controller.poll() is not None, 300, "the step-2 recover point")
    assert controller.poll() is None, controller.stdout.read()[-3000:]
    controller.kill()
    controller.wait()
    wait_until(lambda: not marked_pids(mark), 30, "servers and workers to exit after the controller was killed")
    assert json.loads(latest.read_text())["step"] == 2

    resumed = subprocess.run([sys.executable, str(SCRIPT), *recover_args], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "recovered from step 2" in resumed.stderr

    assert rewards(killed_dir) == rewards(whole_dir)
    assert_same_params(whole_dir, killed_dir)
    # the sample tables were cut back to the recover point and written again: each step once, as uninterrupted
    samples = [(whole_dir / "samples.jsonl").read_text(), (killed_dir / "samples.jsonl").read_text()]
    assert samples[0] == samples[1] and '"split": "train"' in samples[0] and '"step": 0' in samples[0]


@pytest.mark.parametrize("sigint_ignored", [False, True], ids=["foreground", "background-job"])
def test_ctrl_c_stops_every_process(tmp_path, marks, sigint_ignored):
    """SIGINT to the launcher stops every process, also where SIGINT was inherited ignored (a
    shell's background job: the controller must not keep ignoring the launcher's forwarded SIGINT)."""
    mark = marks()
    proc = start([*LAUNCHER, *run_args(tmp_path, "sigint", "total_train_steps=500")], mark, sigint_ignored=sigint_ignored)
    wait_for_first_step(proc, tmp_path / "quickstart" / "sigint")
    assert len(marked_pids(mark)) >= 4  # launcher, controller, server, trainer worker (+ reward worker)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "interrupted" in out
    wait_until(lambda: not marked_pids(mark), 30, "every process of the run to exit")


def test_crash_of_a_training_worker_stops_the_run(tmp_path, marks):
    mark = marks()
    run_dir = tmp_path / "quickstart" / "crash"
    proc = start([*LAUNCHER, *run_args(tmp_path, "crash", "total_train_steps=500")], mark)
    wait_for_first_step(proc, run_dir)
    workers = [pid for pid in marked_pids(mark) if "areal_core.train.worker" in cmdline(pid)]
    assert len(workers) == 1
    os.kill(workers[0], signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == ProcessFailedError.exit_code, out[-3000:]  # restartable (recover is off)
    error_lines = [line for line in out.splitlines() if line.startswith("areal: error:")]
    assert len(error_lines) == 1 and "trainer0" in error_lines[0], out[-3000:]
    wait_until(lambda: not marked_pids(mark), 30, "every process of the run to exit")
