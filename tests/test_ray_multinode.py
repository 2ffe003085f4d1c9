"""The quickstart on a real two-node Ray cluster on this machine (docs/scale-out.md, multi-node).

Node 1 is the head (127.0.0.3: Ray replaces 127.0.0.1 by the machine's outward IP) with
``{"train": 1, "spot": 1}``, node 2 is a second raylet at 127.0.0.2 with ``{"rollout": 1}``.
With servers on ``{"rollout": 1}`` and the trainer on ``{"train": 1}`` the server must land on
node 2 and the trainer on node 1. With ``AREAL_TEST_RAY_MULTINODE=HEAD:PORT`` (a cluster of that
layout, started beforehand) the tests use that cluster; otherwise (as in CI) a module fixture
starts one and stops it after the module. Tests that lose a node add a node of their own.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from quickstart_runs import CONFIG, LAUNCHER, MARK, SHORT_RUN, marked_pids, run_args, start, wait_until
from ray_nodes import HEAD_IP, dashboard, head, node_of, raylet_pid, worker_node

from areal_core.api.errors import ProcessFailedError
from areal_core.control_endpoint import control_call
from areal_core.rollout.ledger import audit, read_ledger

pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]'")
pytestmark = pytest.mark.slow

NODE2_IP = "127.0.0.2"
DOOMED_IP = "127.0.0.4"  # a node a test adds, then loses
ISOLATED_IP = "127.0.0.5"  # a node a test adds with its own view of the filesystem
TRAINING_IP = "127.0.0.6"  # a training node a test adds (one loses it, then adds it again)
HEAD_RESOURCES = {"train": 1, "spot": 1}  # spot: the spare that replaces a lost node's server
PLACED = ["ray.server_resources={rollout: 1}", "ray.trainer_resources={train: 1}"]
RUN = ["total_train_steps=3", "train_dataset.size=24", "train_dataset.batch_size=4", "stats.eval_every=0"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    if os.environ.get("AREAL_TEST_RAY_MULTINODE"):
        yield os.environ["AREAL_TEST_RAY_MULTINODE"]
        return
    with head(4, HEAD_RESOURCES) as address, worker_node(address, NODE2_IP, 2, {"rollout": 1}):
        yield address


def launch(root: Path, trial: str, address: str, mark: str, *extra: str) -> subprocess.Popen:
    args = run_args(root, trial, *RUN, "scheduler=ray", f"ray.address={address}", *extra)
    return start([*LAUNCHER, *args], mark)


def placement(mark: str, pattern: bytes) -> dict[int, tuple[tuple[str, str] | None, set[str]]]:
    """Marked processes whose command line holds ``pattern``: pid -> (their node, listening IPs)."""
    found = {}
    for pid in marked_pids(mark):
        try:
            if pattern not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            listens = {c.laddr.ip for c in psutil.Process(pid).net_connections("tcp") if c.status == "LISTEN"}
        except (OSError, psutil.Error):
            continue
        found[pid] = (node_of(pid), listens)
    return found


def finish(proc: subprocess.Popen, mark: str) -> str:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    wait_until(lambda: not marked_pids(mark), 60, "every process of the run to exit")
    return out


def steps_done(run_dir: Path) -> int:
    stats = run_dir / "stats.jsonl"
    return len(stats.read_text().splitlines()) if stats.exists() else 0


def events(run_dir: Path, kind: str) -> list[dict]:
    return [row for row in read_ledger(run_dir / "ledger.jsonl") if row["event"] == kind]


def ledger_is_clean(run_dir: Path, episodes: int) -> None:
    result = audit(read_ledger(run_dir / "ledger.jsonl"))
    assert result.problems() == [] and sum(result.consumed.values()) == episodes


@pytest.mark.parametrize("weight_update", ["disk", "xccl"])
def test_servers_on_node_2_trainer_on_node_1_every_address_routable(cluster, tmp_path, marks, weight_update):
    mark = marks()
    run_dir = tmp_path / "quickstart" / weight_update
    proc = launch(tmp_path, weight_update, cluster, mark, *PLACED, f"actor.weight_update={weight_update}")
    seen: dict[str, dict] = {}

    def observe() -> bool:
        seen["server"] = placement(mark, b"areal_core.builtin.engine_hf.server")
        seen["trainer"] = placement(mark, b"areal_core.train.worker")
        return (all(listens for _, listens in seen["server"].values()) and seen["server"] and seen["trainer"]
                and (run_dir / "control.json").exists()) or proc.poll() is not None

    wait_until(observe, 300, "the server listening and the trainer up")
    assert proc.poll() is None, proc.stdout.read()[-3000:]
    members = control_call(run_dir, "GET", "/servers")
    out = finish(proc, mark)

    ((server_node, server_listens),) = seen["server"].values()
    ((trainer_node, _),) = seen["trainer"].values()
    assert server_node[0] == NODE2_IP and trainer_node[0] == HEAD_IP, (server_node, trainer_node)
    assert server_node[1] != trainer_node[1]  # Ray node ids
    assert server_listens == {NODE2_IP}  # binds the node's address, never 127.0.0.1 or 0.0.0.0
    addresses = [s["address"] for s in members["servers"]]
    assert addresses and all(a.startswith(f"{NODE2_IP}:") for a in addresses), members  # advertised
    assert "final model" in out
    ledger_is_clean(run_dir, 3 * 4)  # steps x prompts (an episode is a prompt's group)


def test_fsdp2_training_spans_two_nodes(cluster, tmp_path, marks):
    """``actor.world_size=2`` with one ``{"train": 1}`` per rank: rank 0 on the head, rank 1 on a
    node the test adds; the FSDP2 group meets at rank 0's node address and the run finishes."""
    mark = marks()
    run_dir = tmp_path / "quickstart" / "span"
    with worker_node(cluster, TRAINING_IP, 1, {"train": 1}):
        proc = launch(tmp_path, "span", cluster, mark, *PLACED, "actor.world_size=2")
        seen: dict[int, tuple] = {}

        def observe() -> bool:
            seen.update(placement(mark, b"areal_core.train.worker"))
            return (len(seen) == 2 and all(node for node, _ in seen.values())) or proc.poll() is not None

        wait_until(observe, 300, "both training ranks up")
        out = finish(proc, mark)
    nodes = {node for node, _ in seen.values()}
    assert {ip for ip, _ in nodes} == {HEAD_IP, TRAINING_IP} and len(nodes) == 2, seen  # one rank per node
    assert "final model" in out
    ledger_is_clean(run_dir, 3 * 4)


@contextlib.contextmanager
def holding(address: str, shape: dict[str, float]) -> Iterator[Callable[[], None]]:
    """A placement group of one ``shape`` bundle, held by a driver of its own; yields its release."""
    driver = textwrap.dedent(f"""
        import sys, ray
        from ray.util.placement_group import placement_group
        ray.init(address={address!r}, log_to_driver=False)
        ray.get(placement_group([{shape!r}]).ready(), timeout=120)
        print("held", flush=True)
        sys.stdin.read()  # the group goes with this driver
    """)
    proc = subprocess.Popen([sys.executable, "-c", driver], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def release() -> None:
        if proc.poll() is None:
            proc.stdin.close()
            proc.wait(60)

    try:
        assert any(line.strip() == "held" for line in proc.stdout), "the spare could not be held"
        yield release
    finally:
        release()


def test_a_dead_node_s_server_is_replaced_on_node_1_and_no_sample_is_lost(cluster, tmp_path, marks):
    """Node 3 holds the only server; node 1's spare ``spot`` is held until the run is up (else Ray
    would pack the server next to the trainer). Node 3's raylet is killed mid-run."""
    steps = 40
    mark = marks()
    run_dir = tmp_path / "quickstart" / "lost-node"
    with worker_node(cluster, DOOMED_IP, 1, {"spot": 1}) as node3, holding(cluster, {"spot": 1, f"node:{HEAD_IP}": 0.01}) as release_spare:
        proc = launch(tmp_path, "lost-node", cluster, mark, "ray.server_resources={spot: 1}",
                      "ray.trainer_resources={train: 1}", "rollout.restart_failed=true",
                      "rollout.health_check_interval=1", f"total_train_steps={steps}")  # synchronous:
        # the kill lands with most steps' rollouts still to generate (a step takes well under a second)
        wait_until(lambda: steps_done(run_dir) >= 1 or proc.poll() is not None, 300, "step 1")
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        ((before, _),) = placement(mark, b"areal_core.builtin.engine_hf.server").values()
        assert before[0] == DOOMED_IP
        os.kill(raylet_pid(node3), signal.SIGKILL)  # the node is gone with its server
        killed_at = time.time()
        assert steps_done(run_dir) < steps  # the kill landed mid-run
        release_spare()  # only now: the replacement can go to node 1's spare
        finish(proc, mark)

    ledger_is_clean(run_dir, steps * 4)
    (lost,) = events(run_dir, "server_lost")
    (added,) = events(run_dir, "server_added")
    assert lost["address"].startswith(f"{DOOMED_IP}:") and added["address"].startswith(f"{HEAD_IP}:")
    print(f"\nnode lost -> server_lost {lost['t'] - killed_at:.1f}s, replacement added {added['t'] - killed_at:.1f}s")


def test_a_fileroot_another_node_does_not_see_fails_at_start_with_one_line(cluster, tmp_path, marks):
    """Node 4 runs in a mount namespace of its own where ``fileroot`` is another directory."""
    if subprocess.run(["unshare", "--mount", "true"], check=False, capture_output=True).returncode != 0:
        pytest.skip("needs `unshare --mount` to give a node its own view of fileroot: run as root (as CI does)")
    fileroot, node_local = tmp_path / "runs", tmp_path / "node-local"
    fileroot.mkdir()
    node_local.mkdir()
    own_view = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mount --bind "$1" "$2" && shift 2 && exec "$@"', "sh", str(node_local), str(fileroot)]
    mark = marks()
    with worker_node(cluster, ISOLATED_IP, 1, {"isolated": 1}, wrap=own_view):
        args = run_args(fileroot, "unshared", *RUN, "scheduler=ray", f"ray.address={cluster}",
                        "ray.server_resources={isolated: 1}", "rollout.server_startup_timeout=120")
        proc = subprocess.run([*LAUNCHER, *args], check=False, env={**os.environ, MARK: mark}, capture_output=True,
                              text=True, timeout=600)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("areal: error:")]
    assert f"fileroot: '{fileroot}' is not shared with node {ISOLATED_IP}" in line
    assert line.endswith("use a shared filesystem or actor.weight_update=xccl")
    assert not list(node_local.iterdir())  # nothing written where the node looked
    wait_until(lambda: not marked_pids(mark), 60, "every process of the run to exit")


def test_ray_job_submit_runs_the_controller_as_the_job_s_driver(cluster, tmp_path, marks, monkeypatch):
    """``ray job submit --working-dir DIR -- areal run config.yaml``: through the head's dashboard
    (``ray[default]``), the controller is the job's driver on the head, ``ray.address=auto`` (the
    default) finds the job's cluster and the run finishes."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # the job client would take it over --address
    address = dashboard(cluster)
    assert address, f"the cluster at {cluster} has no dashboard: install areal-core[ray] (ray[default])"
    job_dir = tmp_path / "job"  # what --working-dir ships: the config
    job_dir.mkdir()
    shutil.copy(CONFIG, job_dir / "config.yaml")
    mark = marks()
    run_dir = tmp_path / "quickstart" / "job"
    submission = f"areal-test-{mark[:12]}"
    # the job's processes carry the mark, and its `areal` is this Python's even where its venv is not activated
    this_python_first = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    overrides = [f"fileroot={tmp_path}", "trial_name=job", *SHORT_RUN, *RUN, "scheduler=ray", *PLACED]
    submit = [sys.executable, "-m", "ray.scripts.scripts", "job", "submit", f"--address=http://{address}",
              f"--submission-id={submission}", f"--working-dir={job_dir}",
              f"--runtime-env-json={json.dumps({'env_vars': {MARK: mark, 'PATH': this_python_first}})}",
              "--", "areal", "run", "config.yaml", *overrides]
    proc = start(submit, mark)
    control = run_dir / "control.json"
    wait_until(lambda: control.exists() or proc.poll() is not None, 300, "the controller's control.json")
    assert control.exists(), proc.stdout.read()[-3000:]
    controller_pid = json.loads(control.read_text())["pid"]
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]  # `ray job submit` exits 0 when the job succeeded
    wait_until(lambda: not marked_pids(mark), 60, "every process of the job to exit")

    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(f"http://{address}")
    info = client.get_job_info(submission)
    assert info.status == JobStatus.SUCCEEDED, info
    assert info.driver_info is not None and int(info.driver_info.pid) == controller_pid  # the controller is the driver
    assert info.driver_info.node_ip_address == cluster.rsplit(":", 1)[0]  # on the head
    logs = client.get_job_logs(submission)
    assert "steps 3" in logs and "final model" in logs, logs[-3000:]
    ledger_is_clean(run_dir, 3 * 4)


def test_a_lost_training_node_fails_the_run_and_the_rerun_recovers_from_the_last_recover_point(cluster, tmp_path,
                                                                                                marks):
    """The trainer runs on a node of its own (``{"training": 1}``), whose raylet is killed after the
    first recover point: a trainer failure (exit 3, restartable), nothing left running. A training
    node comes back (started while the run stops) and the rerun (``recover.mode=auto``) resumes from
    the last recover point and finishes; no sample is lost. The controller is frozen (SIGSTOP) from
    the recover point until the node's processes are gone, so that the loss lands mid-run however
    fast the steps are. The controller publishes the recover points: the one it was frozen at is read
    after the freeze, and the run may publish one more after it resumes, when the trainer finished
    that step's checkpoint before its node went (its reply waits in the controller's socket). The
    rerun must resume from whichever was published last."""
    steps = 4
    mark = marks()
    run_dir = tmp_path / "quickstart" / "lost-trainer"
    latest = run_dir / "recover" / "latest.json"
    args = ["ray.server_resources={rollout: 1}", "ray.trainer_resources={training: 1}", "recover.mode=auto",
            "recover.freq_steps=1", f"total_train_steps={steps}"]
    with contextlib.ExitStack() as nodes:
        node = nodes.enter_context(worker_node(cluster, TRAINING_IP, 1, {"training": 1}))
        proc = launch(tmp_path, "lost-trainer", cluster, mark, *args)
        wait_until(lambda: latest.exists() or proc.poll() is not None, 300, "the first recover point")
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        controller = json.loads((run_dir / "control.json").read_text())["pid"]
        os.kill(controller, signal.SIGSTOP)
        frozen_at = json.loads(latest.read_text())["step"]
        assert frozen_at < steps, f"the run reached its last recover point (step {frozen_at}) before the freeze"
        trainer = placement(mark, b"areal_core.train.worker")
        ((trainer_node, _),) = trainer.values()
        assert trainer_node[0] == TRAINING_IP
        os.kill(raylet_pid(node), signal.SIGKILL)  # the node is gone with the training worker
        wait_until(lambda: not set(trainer) & set(marked_pids(mark)), 60, "the training worker to go with its node")
        os.kill(controller, signal.SIGCONT)
        resumed_at = time.monotonic()
        first = collect(proc)
        nodes.enter_context(worker_node(cluster, TRAINING_IP, 1, {"training": 1}))  # the node is back
        out, exited_at = first()
        assert proc.returncode == ProcessFailedError.exit_code, out[-4000:]  # restartable
        (error,) = [line for line in out.splitlines() if line.startswith("areal: error:")]
        assert error.startswith("areal: error: trainer0 exited"), out[-3000:]
        wait_until(lambda: not marked_pids(mark), 60, "every process of the run to exit")  # no orphan
        lost_at = json.loads(latest.read_text())["step"]
        assert frozen_at <= lost_at < steps, f"frozen at step {frozen_at}, failed with recover point {lost_at}"
        assert (run_dir / "recover" / f"step{lost_at}").is_dir()

        mark = marks()
        out = finish(launch(tmp_path, "lost-trainer", cluster, mark, *args), mark)
    assert f"recovered from step {lost_at}" in out, out[-3000:]
    assert json.loads(latest.read_text())["step"] == steps
    ledger_is_clean(run_dir, steps * 4)
    print(f"\ntraining node lost at the step-{frozen_at} recover point (the rerun resumed from step {lost_at}) "
          f"-> controller exited "
          f"{exited_at - resumed_at:.1f}s after it resumed; {error[:120]}")


def collect(proc: subprocess.Popen) -> Callable[[], tuple[str, float]]:
    """Read ``proc``'s output in a thread until it exits; the returned call waits for its output and exit time."""
    result: list[tuple[str, float]] = []
    reader = threading.Thread(target=lambda: result.append((proc.communicate(timeout=300)[0], time.monotonic())))
    reader.start()

    def done() -> tuple[str, float]:
        reader.join(300)
        assert result, "the run did not exit"
        return result[0]

    return done
