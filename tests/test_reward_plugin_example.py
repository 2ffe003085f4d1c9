"""The example reward plugin, installed as its own distribution, is found and used through its entry point."""

from __future__ import annotations

import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PLUGIN_DIR = Path(__file__).resolve().parents[1] / "examples" / "plugins" / "areal-reward-example"

CHECK = textwrap.dedent(
    """
    import asyncio, sys
    from areal_core.config import load_config
    from areal_core.plugins import load_plugins
    from areal_core.rollout.reward_runner import RewardRunner

    plugins = load_plugins()
    assert {"answer_format", "arith_length_penalty"} <= set(plugins.names("reward")), plugins.names("reward")
    (info,) = [i for i in plugins.infos if i.name == "reward_example"]
    assert info.distribution == "areal-reward-example" and info.version == "0.1.0", info
    assert not info.broken and info.registered == {"reward": ["answer_format", "arith_length_penalty"]}, info
    assert "areal_reward_example.rewards" not in sys.modules  # discovery imports only the hook module

    config = load_config(None, ["reward.name=arith_length_penalty"])
    fn = plugins.get("reward", config.reward.name)
    assert fn("3+4=", "7", answer="7") == 1.0
    assert abs(fn("3+4=", "7 ok", answer="7") - 0.7) < 1e-9
    assert fn("3+4=", "8", answer="7") == 0.0

    with RewardRunner(plugins.get("reward", "answer_format"), workers=1, timeout=60.0) as runner:
        good = asyncio.run(runner.score("q", "so\\n#### 18", {"answer": "#### 18"}))
        bad = asyncio.run(runner.score("q", "it is 18", {"answer": "#### 18"}))
    assert (good, bad) == (1.0, 0.0) and runner.stats.errors == 0, (good, bad, runner.stats)
    print("ok")
    """
)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("src") / PLUGIN_DIR.name  # a copy: the build writes next to its sources
    shutil.copytree(PLUGIN_DIR, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".*"))
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target)]
        + [str(source)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return target


@pytest.mark.slow
def test_example_plugin_is_discovered_and_selectable_by_config(installed: Path, tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(installed), os.environ.get("PYTHONPATH")]))}
    env.pop("AREAL_PLUGINS", None)
    env.pop("AREAL_DISABLE_PLUGIN_AUTOLOAD", None)
    result = subprocess.run(
        [sys.executable, "-c", CHECK], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


@pytest.mark.slow
def test_areal_plugins_lists_the_installed_example(installed: Path):
    env = {key: value for key, value in os.environ.items() if not key.startswith("AREAL_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(installed), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-m", "areal_core.cli", "plugins"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "reward_example  (areal-reward-example 0.1.0)  [ok]" in done.stdout
    assert "reward: answer_format, arith_length_penalty" in done.stdout


def test_example_plugin_is_absent_unless_installed():
    # Guards the test above: without the install, the rewards are not registered.
    from areal_core.plugins import load_plugins

    try:
        md.distribution("areal-reward-example")
    except md.PackageNotFoundError:
        pass
    else:
        pytest.skip("areal-reward-example is installed in this environment: pip uninstall areal-reward-example to run it")
    assert "arith_length_penalty" not in load_plugins().names("reward")
