"""The ray scheduler against a real local Ray cluster: processes, placement groups, the quickstart.

With ``RAY_ADDRESS`` set the tests use that cluster; otherwise (as in CI) a module fixture starts a
private head node (its own temp dir and ports, every process
marked) and stops exactly those processes afterwards.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from quickstart_runs import (
    LAUNCHER, MARK, assert_same_params, cmdline, marked_pids, rewards, run_args, start, wait_until,
)
from ray_nodes import port_flags, stop_marked

from areal_core.config import Config, load_config
from areal_core.api.errors import ArealError, ConfigError
from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.plugins import load_plugins
from areal_core.scheduler import ProcessDiedError, ProcessSpec, make_scheduler
from areal_core.api.scheduler import free_port
from areal_core.scheduler.ray import ACTOR_LOST, RayScheduler

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]'")
pytestmark = pytest.mark.slow


@contextlib.contextmanager
def private_head(*resources: str) -> Iterator[str]:
    """A Ray head node of our own (temp dir, free ports, every process marked); yields its address."""
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    mark = uuid.uuid4().hex
    ports = port_flags("--port", "--ray-client-server-port", "--dashboard-port", "--dashboard-agent-listen-port",
                       "--metrics-export-port", "--runtime-env-agent-port")
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--node-ip-address=127.0.0.1",
           "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp_dir}", *ports, *resources]
    try:
        started = subprocess.run(cmd, env={**os.environ, MARK: mark}, capture_output=True, text=True, timeout=180)
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
        yield (Path(temp_dir) / "ray_current_cluster").read_text().strip()
    finally:
        stop_marked(mark)  # this head's processes only: `ray stop` would stop every cluster here
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    if os.environ.get("RAY_ADDRESS"):
        yield os.environ["RAY_ADDRESS"]
        return
    with private_head("--num-cpus=4") as address:
        yield address


def ray_config(address: str, *overrides: str) -> Config:
    return load_config(None, ["scheduler=ray", f"ray.address={address}", "rollout.servers=1", "actor.world_size=1",
                              *overrides])


@pytest.fixture
def scheduler(ray_address):
    sched = make_scheduler(ray_config(ray_address), CpuPlatform())
    assert isinstance(sched, RayScheduler)
    with sched:
        yield sched


def live_groups() -> int:
    return sum(g["state"] == "CREATED" for g in ray.util.placement_group_table().values())


def test_a_process_gets_its_threads_env_log_and_stops_with_its_children(scheduler, tmp_path, monkeypatch):
    mark = uuid.uuid4().hex
    monkeypatch.setenv("FROM_CONTROLLER", "yes")  # the controller's environment is forwarded, as with local
    monkeypatch.chdir(tmp_path)
    script = textwrap.dedent("""
        import os, subprocess, time
        print(os.environ["OMP_NUM_THREADS"], os.environ["AREAL_NUM_THREADS"], os.environ["FROM_SPEC"],
              os.environ["FROM_CONTROLLER"], os.getcwd(), flush=True)
        subprocess.Popen(["sleep", "300"])
        time.sleep(300)
    """)
    log = tmp_path / "p.log"
    handle = scheduler.start(ProcessSpec(name="server0", cmd=[sys.executable, "-c", script], threads=1,
                                         env={"FROM_SPEC": "1", MARK: mark}, log_file=str(log)))
    wait_until(lambda: log.exists() and log.read_text().strip(), 60, "the process's first line")
    assert log.read_text().split() == ["1", "1", "1", "yes", str(tmp_path)]
    wait_until(lambda: len(marked_pids(mark)) == 2, 30, "the process and its child")
    assert handle.alive() and handle.returncode() is None and handle.pid in marked_pids(mark)
    assert handle.host == ray.util.get_node_ip_address()
    assert scheduler.handles == [handle]
    scheduler.check_alive()

    handle.stop()
    assert handle.returncode() == -signal.SIGTERM
    wait_until(lambda: not marked_pids(mark), 30, "the process group to exit")


def test_exits_and_lost_actors_are_deaths(scheduler, tmp_path):
    mark = uuid.uuid4().hex
    log = tmp_path / "fails.log"
    fails = scheduler.start(ProcessSpec(name="server0", cmd=["sh", "-c", "echo bye; exit 3"], log_file=str(log)))
    wait_until(lambda: not fails.alive(), 60, "the exit")
    assert fails.returncode() == 3 and log.read_text() == "bye\n"
    with pytest.raises(ProcessDiedError, match=rf"server0 exited with code 3; see {log}"):
        scheduler.check_alive()

    with pytest.raises(ArealError, match=r"^server1: could not start /no/such/program under Ray: .*No such file"):
        scheduler.start(ProcessSpec(name="server1", cmd=["/no/such/program"]))

    sleeper = scheduler.start(ProcessSpec(name="trainer0", cmd=["sleep", "300"], env={MARK: mark}))
    assert marked_pids(mark) == [sleeper.pid]
    ray.kill(sleeper.actor)  # the actor's process dies: its child gets the parent-death signal
    wait_until(lambda: not sleeper.alive(), 60, "the lost actor to show")
    assert sleeper.returncode() == ACTOR_LOST
    wait_until(lambda: not marked_pids(mark), 30, "the orphan to exit")


def test_bundles_are_reused_and_every_group_is_removed(ray_address):
    mark = uuid.uuid4().hex
    sched = RayScheduler(ray_config(ray_address), CpuPlatform())
    try:
        spec = ProcessSpec(name="server0", cmd=["sleep", "300"], env={MARK: mark})
        first = sched.start(spec)
        sched.start(attrs.evolve(spec, name="trainer0"))
        assert live_groups() == 1  # the job's group: one server and one trainer bundle
        extra = sched.start(attrs.evolve(spec, name="server1"))  # added at run time: a group of its own
        assert live_groups() == 2
        extra.stop()
        wait_until(lambda: live_groups() == 1, 30, "the extra group's removal")
        first.stop()
        sched.start(attrs.evolve(spec, name="server0-again"))  # takes the stopped server's bundle
        assert live_groups() == 1
        assert len(marked_pids(mark)) == 2
    finally:
        sched.stop_all()
    assert not ray.is_initialized()
    wait_until(lambda: not marked_pids(mark), 30, "every process to exit")
    ray.init(address=ray_address, log_to_driver=False)
    try:
        wait_until(lambda: live_groups() == 0, 30, "the job's group's removal")
    finally:
        ray.shutdown()


def test_accelerators_are_the_ones_ray_assigns(tmp_path):
    """With the platform's Ray key (Ray accounts for GPUs and NPUs declared at `ray start` without the
    hardware) each process sees the device ids Ray gave its actor, whatever the local layout asked for."""
    with private_head("--num-cpus=4", "--num-gpus=2", '--resources={"NPU": 2}') as address:
        config = ray_config(address, "rollout.server_startup_timeout=5")
        for name in ("cuda", "npu"):
            platform = load_plugins().get("platform", name)()
            with RayScheduler(config, platform) as sched:
                seen = []
                for proc, devices in (("server0", (0,)), ("trainer0", (5,))):
                    log = tmp_path / f"{name}-{proc}.log"
                    cmd = ["sh", "-c", f"echo ${platform.visible_devices_env}; sleep 60"]
                    sched.start(ProcessSpec(name=proc, cmd=cmd, devices=devices, log_file=str(log)))
                    wait_until(lambda: log.exists() and log.read_text(), 60, f"{proc}'s devices")  # noqa: B023
                    seen.append(log.read_text().strip())
                assert sorted(seen) == ["0", "1"], name
                if name == "npu":
                    with pytest.raises(ArealError, match="could not place"):  # both are taken
                        sched.start(ProcessSpec(name="server1", cmd=["sleep", "1"], devices=(0,)))


def test_a_job_too_big_for_the_node_is_one_clear_error(ray_address):
    config = ray_config(ray_address, "rollout.threads_per_server=64", "rollout.server_startup_timeout=3")
    with RayScheduler(config, CpuPlatform()) as sched:
        with pytest.raises(ArealError, match=r"could not place the job .* rollout.server_startup_timeout=3s"):
            sched.start(ProcessSpec(name="server0", cmd=["sleep", "1"], threads=64))
        assert live_groups() == 0 and sched.handles == []


def test_an_address_without_a_cluster_is_a_config_error():
    config = ray_config(f"127.0.0.1:{free_port()}")
    with pytest.raises(ConfigError, match=r"^ray.address: no Ray cluster answers at 127.0.0.1:\d+"):
        RayScheduler(config, CpuPlatform())
    assert not ray.is_initialized()


def test_auto_connects_to_the_cluster_ray_address_names(ray_address, monkeypatch):
    """``ray.address=auto`` (the default) finds the cluster in ``RAY_ADDRESS``, as Ray sets it for a job's driver."""
    monkeypatch.setenv("RAY_ADDRESS", ray_address)
    with RayScheduler(ray_config("auto"), CpuPlatform()):
        # that cluster's GCS port (Ray reports 127.0.0.1 as the machine's outward IP)
        assert ray.get_runtime_context().gcs_address.rsplit(":", 1)[1] == ray_address.rsplit(":", 1)[1]
    assert not ray.is_initialized()


def test_a_killed_controller_leaves_no_process(ray_address, marks):
    mark = marks()
    driver = textwrap.dedent(f"""
        import time
        from areal_core.config import load_config
        from areal_core.builtin.platform_cpu.platform import CpuPlatform
        from areal_core.scheduler import ProcessSpec, make_scheduler
        config = load_config(None, ["scheduler=ray", "ray.address={ray_address}"])
        sched = make_scheduler(config, CpuPlatform())
        for name in ("server0", "trainer0"):
            sched.start(ProcessSpec(name=name, cmd=["sleep", "300"]))
        print("started", flush=True)
        time.sleep(300)
    """)
    proc = start([sys.executable, "-c", driver], mark)
    out = []
    for line in proc.stdout:  # Ray may log first
        out.append(line)
        if line.strip() == "started":
            break
    assert out and out[-1].strip() == "started", "".join(out)[-3000:]
    assert sum(cmdline(pid).startswith("sleep ") for pid in marked_pids(mark)) == 2
    proc.kill()
    proc.wait()
    wait_until(lambda: not marked_pids(mark), 60, "the processes of a killed controller to exit")


def test_the_quickstart_runs_on_ray_with_the_local_result(ray_address, uninterrupted_run, marks):
    mark = marks()
    run_dir = uninterrupted_run.root / "quickstart" / "on-ray"
    t0 = time.monotonic()
    args = run_args(uninterrupted_run.root, "on-ray", "scheduler=ray", f"ray.address={ray_address}")
    proc = start([*LAUNCHER, *args], mark)
    out, _ = proc.communicate(timeout=600)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, out[-3000:]
    assert "final model" in out
    wait_until(lambda: not marked_pids(mark), 30, "every process of the run to exit")
    assert len(rewards(run_dir)) == 4 and (run_dir / "reward_curve.png").exists()
    assert rewards(run_dir) == rewards(uninterrupted_run.run_dir)  # the same controller code, the same run
    assert_same_params(uninterrupted_run.run_dir, run_dir)
    print(f"\nquickstart (4 steps): local {uninterrupted_run.wall_s:.1f}s, ray {wall:.1f}s "
          f"(ray/local {wall / uninterrupted_run.wall_s:.2f})")
