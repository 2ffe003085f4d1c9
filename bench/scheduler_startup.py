"""Start-up cost of the ray scheduler against local, and of two-node placement against one node.

    python bench/scheduler_startup.py --ray-address HOST:PORT [--repeats 3]
    python bench/scheduler_startup.py --ray-address HEAD:PORT --two-node [--repeats 3]

(Start a cluster first: ``ray start --head --num-cpus=4 --include-dashboard=false``.) Two
measures per layout, the layouts' runs alternating so load drift hits them alike:

- primitives: build the scheduler (ray: connect), start a server and a trainer process and wait
  until each has printed its first line, then ``stop_all``;
- the quickstart shortened to ``--steps`` steps: launcher start to exit, the mean step time
  (``time/step_s``) and start-up (wall minus the steps).

The default layouts are ``local`` and ``ray``. ``--two-node`` compares, on one cluster, the server
on the trainer's node against the server on another node; it expects the head started with
``--resources='{"train": 1, "spot": 1}'`` and a second node with ``--resources='{"rollout": 1}'``
(servers ask for ``spot`` or ``rollout``, the trainer for ``train``). Prints the means and the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from areal_core.config import load_config
from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.scheduler import ProcessSpec, make_scheduler

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = [
    "--config", str(REPO / "examples/quickstart/config.yaml"), "total_train_steps=2", "gconfig.n_samples=4",
    "train_dataset.batch_size=4", "train_dataset.size=16", "valid_dataset.size=4", "stats.eval_every=0",
    "stats.progress=false", "stats.sinks=[jsonl]",
]


def primitives(overrides: list[str], root: Path) -> tuple[float, float, float]:
    """Seconds to build the scheduler, to start two processes (first line printed), to stop them."""
    t0 = time.perf_counter()
    scheduler = make_scheduler(load_config(None, overrides), CpuPlatform())
    t1 = time.perf_counter()
    logs = [root / f"p{i}.{time.time_ns()}.log" for i in range(2)]
    for i, log in enumerate(logs):
        cmd = [sys.executable, "-c", "print('up', flush=True); import time; time.sleep(60)"]
        role = "server" if i == 0 else "trainer"
        scheduler.start(ProcessSpec(name=f"{role}0", cmd=cmd, log_file=str(log), role=role))
    while not all(log.exists() and log.read_text() for log in logs):
        time.sleep(0.01)
    t2 = time.perf_counter()
    scheduler.stop_all()
    return t1 - t0, t2 - t1, time.perf_counter() - t2


def quickstart(overrides: list[str], root: Path, trial: str, steps: int) -> tuple[float, float, float]:
    """Seconds of the whole run, of its start-up (wall minus the steps) and of a step on average."""
    cmd = [sys.executable, "-m", "areal_core.launcher.local", str(REPO / "examples/quickstart/train.py"),
           *QUICKSTART, f"total_train_steps={steps}", f"fileroot={root}", f"trial_name={trial}", *overrides]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    wall = time.perf_counter() - t0
    rows = (root / "quickstart" / trial / "stats.jsonl").read_text().splitlines()
    step_s = [json.loads(row)["time/step_s"] for row in rows]
    return wall, wall - sum(step_s), statistics.mean(step_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ray-address", required=True)
    parser.add_argument("--two-node", action="store_true", help="server on another node vs on the trainer's")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2)
    ns = parser.parse_args()
    ray = ["scheduler=ray", f"ray.address={ns.ray_address}"]
    if ns.two_node:
        trainer = "ray.trainer_resources={train: 1}"
        layouts = {"one node": [*ray, trainer, "ray.server_resources={spot: 1}"],
                   "two nodes": [*ray, trainer, "ray.server_resources={rollout: 1}"]}
    else:
        layouts = {"local": ["scheduler=local"], "ray": ray}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        quickstart(["scheduler=local"], root, "warm-up", 1)  # builds the tiny model once
        prim: dict[str, list[tuple[float, float, float]]] = {name: [] for name in layouts}
        runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in layouts}
        for i in range(ns.repeats):
            for j, (name, overrides) in enumerate(layouts.items()):
                prim[name].append(primitives(overrides, root))
                runs[name].append(quickstart(overrides, root, f"run{i}-{j}", ns.steps))
    means = {name: [statistics.mean(col) for col in zip(*rows)] for name, rows in prim.items()}
    run_means = {name: [statistics.mean(col) for col in zip(*rows)] for name, rows in runs.items()}
    for name in layouts:
        build, up, stop = means[name]
        wall, startup, step = run_means[name]
        print(f"{name:9s}  build {build:6.2f}s  2 processes up {up:6.2f}s  stop_all {stop:6.2f}s  "
              f"quickstart ({ns.steps} steps) {wall:6.1f}s: start-up {startup:6.1f}s, {step:5.2f}s/step")
    base, other = layouts
    ratios = [run_means[other][k] / run_means[base][k] for k in range(3)]
    print(f"{other}/{base}: quickstart {ratios[0]:.2f}x, start-up {ratios[1]:.2f}x, per step {ratios[2]:.2f}x; "
          f"processes up {means[other][1] / means[base][1]:.2f}x")


if __name__ == "__main__":
    main()
