"""The `areal` CLI: one-line errors with exit 2, plugin listing that stays light."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _areal(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "areal_core.cli", *args], capture_output=True, text=True, timeout=120, **kw)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["config", "actor.wrld_size=2"], "actor.wrld_size: unknown key; did you mean 'actor.world_size'?"),
        (["config", "actor.world_size=two"], "actor.world_size: expected an integer, got 'two'"),
        (["config", "rollout.max_head_offpolicyness=-2"], "rollout.max_head_offpolicyness: must be >= 0, got -2"),
        (["config", "gconfig.n_samples=1"], "gconfig.n_samples: 1 samples per prompt, but algorithm 'grpo' needs at least 2"),
        (["config", "rollout.engine=sglang"], "rollout.engine: engine 'sglang' is installed (plugin 'engine_sglang' from areal-engine-sglang) but AREAL_PLUGINS=reshard_disk filters it out"),
        (["config", "actor.algorithm=ppx"], "actor.algorithm: algorithm 'ppx' is not installed (installed algorithms: "),
        (["config", "platform=npu"], "platform: platform 'npu' is installed (plugin 'platform_npu' from areal-platform-npu) but AREAL_PLUGINS=reshard_disk filters it out"),
        (["config", "stats.sinks=[jsonl, wandbb]"], "stats.sinks: stats_sink 'wandbb' is not installed (installed stats_sinks: jsonl, tensorboard)"),
        (["config", "stats.sinks=[jsonl, wandb]"], "stats.sinks: stats_sink 'wandb' is installed (plugin 'stats_wandb' from areal-stats-wandb) but AREAL_PLUGINS=reshard_disk filters it out"),
        (["config", "missing.yaml"], "config file 'missing.yaml' does not exist"),
        (["config", "rollout.pause_mode=hold"], "rollout.pause_mode: must be one of 'abort', 'keep', got 'hold'"),
        (["config", "train_dataset.options={max_operand: -1}"], "train_dataset.options.max_operand: must be >= min_operand (0), got -1"),
        (["config", "valid_dataset.name=gsm8k", "valid_dataset.path=/nonexistent"], "valid_dataset.path"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, message):
    import os

    result = _areal(*args, env={**os.environ, "AREAL_PLUGINS": "reshard_disk"})  # whatever else is installed
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("areal: error: ")
    assert message in lines[0]


def test_a_keep_pause_needs_an_engine_that_holds_requests(areal_plugins):
    from areal_core.api.engine import InferenceEngine
    from areal_core.api.errors import ConfigError
    from areal_core.config import load_config
    from areal_core.resolve import resolve_config

    class HoldlessEngine(InferenceEngine):  # no pause_keeping: requests can only be aborted
        name = "holdless"

    areal_plugins.add_hooks(
        "holdless", areal_register_inference_engines=lambda register: register("holdless", HoldlessEngine)
    )
    config = load_config(None, ["rollout.engine=holdless", "rollout.pause_mode=keep"])
    with pytest.raises(ConfigError) as info:
        resolve_config(config, areal_plugins.load(autoload=True))
    assert str(info.value) == (
        "rollout.pause_mode: keep: engine 'holdless' cannot hold requests through a weight update "
        "(no areal_core.api.SupportsKeepPause); set rollout.pause_mode=abort or rollout.engine=hf"
    )
    assert _areal("config", "rollout.pause_mode=keep").returncode == 0  # hf holds them


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_vllm_and_sglang_hold_requests_through_an_update_but_not_on_a_lora_adapter(engine):
    pytest.importorskip(f"areal_engine_{engine}", reason=f"needs plugins/engine_{engine} installed")
    keep = (f"rollout.engine={engine}", "rollout.pause_mode=keep")
    assert _areal("config", *keep).returncode == 0
    result = _areal("config", *keep, "actor.lora.rank=4")
    assert result.returncode == 2 and result.stderr.strip() == (
        f"areal: error: rollout.pause_mode: keep: engine {engine!r} holds each request on the LoRA adapter it "
        "started with, which an update replaces; set rollout.pause_mode=abort with actor.lora"
    )
    assert _areal("config", "rollout.pause_mode=keep", "actor.lora.rank=4").returncode == 0  # hf: in place


def test_config_prints_resolved_yaml_that_loads_back(tmp_path):
    result = _areal("config", "actor.world_size=2", "seed=5")
    assert result.returncode == 0, result.stderr
    path = tmp_path / "resolved.yaml"
    path.write_text(result.stdout)
    from areal_core.config import load_config

    config = load_config(path)
    assert (config.actor.world_size, config.seed, config.platform) == (2, 5, "cpu")


def test_plugins_lists_builtins_without_heavy_imports():
    code = (
        "import sys, json; from areal_core.cli import main; main(['plugins', '--json']); "
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'vllm', 'sglang', 'torch_npu', 'transformers', 'wandb', 'swanlab', 'mlflow'}); "
        "print(json.dumps(heavy), file=sys.stderr)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    by_name = {row["name"]: row for row in rows}
    assert by_name["builtin-engine_hf"]["registered"] == {"engine": ["hf"]}
    assert by_name["builtin-platform_cpu"]["distribution"] == "areal-core"
    assert json.loads(result.stderr.strip().splitlines()[-1]) == []


def test_plugins_shows_broken_plugin(tmp_path):
    """A real installed distribution whose module fails to import is listed as broken."""
    dist = tmp_path / "site" / "areal_broken_demo-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: areal-broken-demo\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[areal]\nengine_demo = areal_broken_demo\n")
    (tmp_path / "site" / "areal_broken_demo.py").write_text("raise ImportError('needs libdemo.so')\n")
    import os

    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    result = _areal("plugins", env=env)
    assert result.returncode == 0, result.stderr
    assert "engine_demo  (areal-broken-demo 1.0)  [BROKEN]" in result.stdout
    assert "error: ImportError: needs libdemo.so" in result.stdout
    result = _areal("config", "rollout.engine=demo", env=env)
    assert result.returncode == 2
    assert "rollout.engine: engine 'demo' comes from plugin 'engine_demo' (areal-broken-demo 1.0), which failed to load: ImportError: needs libdemo.so" in result.stderr



def test_plugins_shows_incompatible_plugin_in_one_line(tmp_path):
    """An installed plugin whose AREAL_API range excludes this API is listed, not loaded, and the
    listing goes on."""
    dist = tmp_path / "site" / "areal_old_demo-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: areal-old-demo\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[areal]\nreward_old = areal_old_demo\n")
    (tmp_path / "site" / "areal_old_demo.py").write_text(
        "from areal_core.api import hookimpl\nAREAL_API = '<1'\n\n@hookimpl\n"
        "def areal_register_rewards(register):\n    register('old', 'builtins:abs')\n"
    )
    import os

    result = _areal("plugins", env={**os.environ, "PYTHONPATH": str(tmp_path / "site")})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    at = lines.index("reward_old  (areal-old-demo 1.0)  [INCOMPATIBLE]")
    assert lines[at + 1].strip().startswith("it supports areal_core.api <1, this areal-core has API ")
    assert "builtin-engine_hf  (areal-core" in result.stdout

CONFIG = "examples/quickstart/config.yaml"


def test_config_file_as_argument_or_after_dash_dash_config_is_the_same(tmp_path):
    positional = _areal("config", CONFIG, "seed=5")
    flag = _areal("config", "--config", CONFIG, "seed=5")
    assert positional.returncode == flag.returncode == 0, positional.stderr + flag.stderr
    assert flag.stdout == positional.stdout and "experiment_name: quickstart" in flag.stdout


def test_overrides_on_both_sides_of_dash_dash_config_apply_in_order():
    from areal_core.cli import parse

    ns = parse(["run", "seed=1", "--config", CONFIG, "seed=2", "total_train_steps=3"])
    assert (ns.config, ns.args) == (CONFIG, ["seed=1", "seed=2", "total_train_steps=3"])
    both = _areal("config", "seed=1", "--config", CONFIG, "seed=2", "total_train_steps=3")
    assert both.returncode == 0, both.stderr
    assert "seed: 2\n" in both.stdout and "total_train_steps: 3\n" in both.stdout
    stray = _areal("config", "seed=1", "--config", CONFIG, "--nope")
    assert stray.returncode == 2 and "unrecognized arguments: --nope" in stray.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--config", CONFIG, CONFIG], "two config files given"),
        (["seed=5", CONFIG], f"'{CONFIG}' is not a key=value override; give the config file first, once"),
    ],
)
def test_config_file_given_twice_or_late_is_one_line(args, message):
    result = _areal("config", *args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and message in lines[0], result.stderr
