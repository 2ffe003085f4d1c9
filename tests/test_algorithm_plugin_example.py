"""The example algorithm plugin, installed as a real distribution and found by its entry point."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "plugins" / "areal-algorithm-example"

# Runs with only the pip --target directory added to the path: discovery must go through the
# installed distribution's entry point, not through the source tree.
PROBE = textwrap.dedent(
    """
    import json, sys
    import torch
    from areal_core.api.algorithm import Algorithm, LossInput
    from areal_core.config import load_config
    from areal_core.plugins import load_plugins

    plugins = load_plugins()
    info = next(i for i in plugins.infos if i.name == "algorithm_example")
    lazy = "areal_algorithm_example.cispo" not in sys.modules
    config = load_config(None, ["actor.algorithm=cispo"])
    cls = plugins.get("algorithm", config.actor.algorithm)
    algo = cls(config.actor)
    advantages = algo.compute_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([0, 0, 1, 1]))
    logprobs = torch.tensor([-1.0, -0.7, -1.3, -0.2, -2.0], requires_grad=True)
    batch = LossInput(
        old_logprobs=torch.tensor([-1.1, -0.7, -1.0, -0.2, -2.0]),
        prox_logprobs=None,
        advantages=advantages[torch.tensor([0, 0, 1, 1, 1])],
        loss_mask=torch.tensor([False, True, True, True, True]),
        seq_ids=torch.tensor([0, 0, 0, 1, 1]),
        n_seqs=2,
        token_normalizer=4.0,
        seq_normalizer=2.0,
        max_new_tokens=3,
    )
    loss, stats = algo.loss(logprobs, batch)
    loss.backward()
    print(json.dumps({
        "names": plugins.names("algorithm"),
        "distribution": info.distribution,
        "version": info.version,
        "hooks": info.hooks,
        "registered": info.registered,
        "registration_distribution": plugins.registration("algorithm", "cispo").distribution,
        "lazy": lazy,
        "module": cls.__module__,
        "is_algorithm": issubclass(cls, Algorithm),
        "advantages": advantages.tolist(),
        "loss_finite": bool(torch.isfinite(loss)),
        "grad": logprobs.grad.tolist(),
        "stats": sorted(stats),
    }))
    """
)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The example pip-installed (no deps) into a private --target directory; returns it."""
    root = tmp_path_factory.mktemp("plugin")
    source = root / "src"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("tests", "build", "*.egg-info", "__pycache__"))
    target = root / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(source)],
        check=True,
        timeout=300,
    )
    return target


@pytest.fixture(scope="module")
def report(installed) -> dict:
    """What the probe saw in a fresh interpreter with the example on its path."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("AREAL_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(installed), os.environ.get("PYTHONPATH")]))
    env["AREAL_PLUGINS"] = "areal-algorithm-example"  # allow-list by distribution name
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120, cwd=installed
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_example_is_discovered_through_its_entry_point(report):
    assert "cispo" in report["names"] and "grpo" in report["names"]
    assert report["distribution"] == report["registration_distribution"] == "areal-algorithm-example"
    assert report["version"] == "0.1.0"
    assert report["hooks"] == ["areal_register_algorithms"]
    assert report["registered"] == {"algorithm": ["cispo"]}
    assert report["lazy"], "the plugin's __init__ must not import the algorithm module"
    assert report["module"] == "areal_algorithm_example.cispo" and report["is_algorithm"]


def test_example_trains_on_a_small_batch(report):
    # rewards [1, 0] per group -> GRPO advantages +-1 / (0.5 + eps)
    assert report["advantages"] == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-4)
    assert report["loss_finite"]
    grad = report["grad"]
    assert grad[0] == 0.0  # prompt token
    assert all(g != 0.0 for g in grad[1:])
    assert {"loss", "clip_frac", "imp_weight_mean", "imp_weight_max", "ratio_mean"} <= set(report["stats"])


@pytest.mark.slow
def test_example_algorithm_trains_one_step_through_areal_run(installed: Path, tmp_path: Path):
    """The installed plugin is selected by name and drives a real train step (servers, worker)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("AREAL_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(installed), os.environ.get("PYTHONPATH")]))
    config = Path(__file__).resolve().parents[1] / "examples" / "quickstart" / "config.yaml"
    done = subprocess.run(
        [sys.executable, "-m", "areal_core.cli", "run", str(config), "actor.algorithm=cispo", "total_train_steps=1",
         f"fileroot={tmp_path}", "train_dataset.batch_size=4", "gconfig.n_samples=4", "valid_dataset.size=4",
         "stats.progress=false"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    run_dir = tmp_path / "quickstart" / "trial0"
    (row,) = [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines()]
    assert row["step"] == 1 and row["train/n_seqs"] == 16
    assert "actor:\n  algorithm: cispo" in (run_dir / "config.yaml").read_text()
