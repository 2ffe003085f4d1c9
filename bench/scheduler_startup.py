"""Start-up cost of the ray scheduler against local, on this machine.

    python bench/scheduler_startup.py --ray-address HOST:PORT [--repeats 3]

(Start a cluster first: ``ray start --head --num-cpus=4 --include-dashboard=false``.) Two
measures per scheduler, local and ray runs alternating so load drift hits both alike:

- primitives: build the scheduler (ray: connect), start two processes and wait until each has
  printed its first line, then ``stop_all``;
- the quickstart shortened to 2 steps, launcher start to exit (most of it is process start-up).

Prints the mean of each and the ray/local ratio.
"""

from __future__ import annotations

import argparse
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
    "train_dataset.batch_size=4", "train_dataset.size=8", "valid_dataset.size=4", "stats.eval_every=0",
    "stats.progress=false", "stats.tensorboard=false",
]


def primitives(overrides: list[str], root: Path) -> tuple[float, float, float]:
    """Seconds to build the scheduler, to start two processes (first line printed), to stop them."""
    t0 = time.perf_counter()
    scheduler = make_scheduler(load_config(None, overrides), CpuPlatform())
    t1 = time.perf_counter()
    logs = [root / f"p{i}.{time.time_ns()}.log" for i in range(2)]
    for i, log in enumerate(logs):
        cmd = [sys.executable, "-c", "print('up', flush=True); import time; time.sleep(60)"]
        scheduler.start(ProcessSpec(name=f"server{i}" if i == 0 else "trainer0", cmd=cmd, log_file=str(log)))
    while not all(log.exists() and log.read_text() for log in logs):
        time.sleep(0.01)
    t2 = time.perf_counter()
    scheduler.stop_all()
    return t1 - t0, t2 - t1, time.perf_counter() - t2


def quickstart(overrides: list[str], root: Path, trial: str) -> float:
    cmd = [sys.executable, "-m", "areal_core.launcher.local", str(REPO / "examples/quickstart/train.py"),
           *QUICKSTART, f"fileroot={root}", f"trial_name={trial}", *overrides]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ray-address", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    ns = parser.parse_args()
    schedulers = {"local": ["scheduler=local"], "ray": ["scheduler=ray", f"ray.address={ns.ray_address}"]}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        quickstart(schedulers["local"], root, "warm-up")  # builds the tiny model once
        prim: dict[str, list[tuple[float, float, float]]] = {name: [] for name in schedulers}
        runs: dict[str, list[float]] = {name: [] for name in schedulers}
        for i in range(ns.repeats):
            for name, overrides in schedulers.items():
                prim[name].append(primitives(overrides, root))
                runs[name].append(quickstart(overrides, root, f"{name}{i}"))
    means = {name: [statistics.mean(col) for col in zip(*rows)] for name, rows in prim.items()}
    for name in schedulers:
        build, up, stop = means[name]
        print(f"{name:5s}  build {build:6.2f}s  2 processes up {up:6.2f}s  stop_all {stop:6.2f}s  "
              f"quickstart (2 steps) {statistics.mean(runs[name]):6.1f}s")
    ratio = statistics.mean(runs["ray"]) / statistics.mean(runs["local"])
    extra = sum(means["ray"]) - sum(means["local"])
    print(f"ray/local: quickstart {ratio:.2f}x; scheduler overhead +{extra:.2f}s per start-up")


if __name__ == "__main__":
    main()
