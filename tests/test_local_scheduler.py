"""The local scheduler stops a process's whole group, also after its leader died first (a SIGKILLed
vLLM server leaves its engine-core child running otherwise), and pins a process to its ``cpus``; the
controller runs on the servers' cores when both planes are pinned."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from areal_core.api.scheduler import ProcessSpec
from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.config import load_config
from areal_core.scheduler import controller_cpus
from areal_core.scheduler.local import LocalScheduler, pinned

# The leader starts a child that outlives it (as vLLM's EngineCore does), writes its pid, then waits.
_PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(120)
"""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has stopped running
    except FileNotFoundError:
        return False


def _start_parent(scheduler: LocalScheduler, tmp_path: Path, name: str) -> tuple[object, int]:
    pid_file = tmp_path / f"{name}.pid"
    handle = scheduler.start(ProcessSpec(name=name, cmd=[sys.executable, "-c", _PARENT, str(pid_file)]))
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, f"{name} did not start its child"
        time.sleep(0.05)
    return handle, int(pid_file.read_text())


@pytest.mark.parametrize("stop", ["handle", "stop_all"])
def test_stopping_a_process_whose_leader_was_killed_stops_its_orphaned_child(tmp_path, stop):
    scheduler = LocalScheduler(CpuPlatform())
    handle, child = _start_parent(scheduler, tmp_path, "server0")
    try:
        os.kill(handle.pid, signal.SIGKILL)
        handle.popen.wait(10)
        assert _running(child), "the child should outlive its SIGKILLed leader (else this test shows nothing)"
        handle.stop(timeout=2.0) if stop == "handle" else scheduler.stop_all()
        deadline = time.monotonic() + 5
        while _running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(child), f"pid {child} (the dead leader's child) still runs after {stop}"
    finally:
        scheduler.stop_all()
        if _running(child):
            os.kill(child, signal.SIGKILL)


def test_a_process_runs_on_its_cpus_with_its_threads_and_children(tmp_path):
    available = sorted(os.sched_getaffinity(0))
    cpus = (available[-1],)
    out = tmp_path / "affinity"
    # the process reports its own affinity, a thread's and a child's (all inherit the pin)
    script = (
        "import os, subprocess, sys, threading\n"
        "seen = [os.sched_getaffinity(0)]\n"
        "t = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0))); t.start(); t.join()\n"
        "child = subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'],"
        " capture_output=True, text=True).stdout.strip()\n"
        "open(sys.argv[1], 'w').write(repr([sorted(s) for s in seen] + [eval(child)]))\n"
    )
    scheduler = LocalScheduler(CpuPlatform())
    try:
        handle = scheduler.start(ProcessSpec(name="pinned", cmd=[sys.executable, "-c", script, str(out)], cpus=cpus))
        assert handle.popen.wait(30) == 0
        unpinned = scheduler.start(ProcessSpec(name="free", cmd=[sys.executable, "-c", script, str(tmp_path / "free")]))
        assert unpinned.popen.wait(30) == 0
    finally:
        scheduler.stop_all()
    assert eval(out.read_text()) == [list(cpus)] * 3
    assert eval((tmp_path / "free").read_text()) == [available] * 3


def test_pinned_moves_every_thread_and_what_starts_meanwhile_then_restores_them():
    available = os.sched_getaffinity(0)
    cpus = {max(available)}
    release, seen = threading.Event(), {}
    running = threading.Thread(target=release.wait)  # started before: Linux pins threads one by one
    running.start()
    try:
        with pinned(sorted(cpus)):
            seen["main"] = os.sched_getaffinity(0)
            seen["running"] = os.sched_getaffinity(running.native_id)
            started = threading.Thread(target=lambda: seen.update(started=os.sched_getaffinity(0)))
            started.start()
            started.join()
            child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                                   capture_output=True, text=True, check=True)  # fmt: skip
            seen["child"] = set(eval(child.stdout))
        after = {"main": os.sched_getaffinity(0), "running": os.sched_getaffinity(running.native_id)}
    finally:
        release.set()
        running.join()
    assert seen == dict.fromkeys(("main", "running", "started", "child"), cpus)
    assert after == dict.fromkeys(("main", "running"), available)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [([], ()), (["rollout.cpus=[0]"], ()), (["actor.cpus=[0]"], ()), (["rollout.cpus=[0]", "actor.cpus=[0]"], (0,))],
)
def test_the_controller_runs_on_the_servers_cores_when_both_planes_are_pinned(overrides, expected):
    assert controller_cpus(load_config(None, overrides)) == expected
