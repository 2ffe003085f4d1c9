"""Config: YAML + dotted overrides, round-trips, and one-line errors that name the dotted key."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_core.config import Config, OptimizerConfig, dump_yaml, from_dict, load_config, to_dict
from areal_core.api.errors import ConfigError


def test_defaults_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("actor:\n  world_size: 2\nrollout:\n  engine: hf\n")
    config = load_config(path, ["actor.optimizer.lr=1e-3", 'gconfig.stop=["\\n"]', "valid_dataset.name=arith"])
    assert config.actor.world_size == 2
    assert config.actor.optimizer.lr == 1e-3
    assert config.gconfig.stop == ["\n"]
    assert config.valid_dataset is not None and config.valid_dataset.batch_size == 8
    assert config.run_dir.parts[-2:] == ("quickstart", "trial0")


def test_yaml_round_trip(tmp_path):
    config = load_config(None, ["actor.eps_clip_higher=0.3", "rollout.engine_args={a: 1}", "seed=7"])
    path = tmp_path / "resolved.yaml"
    path.write_text(dump_yaml(config))
    assert load_config(path) == config


_overrides = st.fixed_dictionaries(
    {},
    optional={
        "seed": st.integers(0, 2**31),
        "actor.world_size": st.integers(1, 8),
        "actor.optimizer.lr": st.floats(1e-7, 1.0),
        "actor.adv_norm": st.sampled_from(["group", "batch", "none"]),
        "actor.eps_clip_higher": st.none() | st.floats(0.2, 1.0),
        "rollout.max_head_offpolicyness": st.integers(0, 16),
        "gconfig.temperature": st.floats(0.01, 2.0),
        "gconfig.stop": st.lists(st.text(min_size=1, max_size=3), max_size=3),
        "model.dtype": st.sampled_from(["float32", "bfloat16"]),
        "experiment_name": st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True),
    },
)


@settings(max_examples=60, deadline=None)
@given(_overrides)
def test_round_trip_property(values):
    data: dict = {}
    for key, value in values.items():
        node = data
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    config = from_dict(data)
    assert from_dict(to_dict(config)) == config
    assert from_dict(yaml.safe_load(dump_yaml(config))) == config


BAD_INPUTS = [
    # (overrides, expected message)
    (["actor.wrld_size=2"], "actor.wrld_size: unknown key; did you mean 'actor.world_size'?"),
    (["rollot.engine=hf"], "rollot: unknown key; did you mean 'rollout'?"),
    (["actor.world_size=two"], "actor.world_size: expected an integer, got 'two'"),
    (["gconfig.temperature=hot"], "gconfig.temperature: expected a number, got 'hot'"),
    (["stats.progress=maybe"], "stats.progress: expected true/false, got 'maybe'"),
    (["model.dtype=fp8"], "model.dtype: must be one of 'float32', 'bfloat16', got 'fp8'"),
    (["rollout.max_head_offpolicyness=-1"], "rollout.max_head_offpolicyness: must be >= 0, got -1"),
    (["gconfig.top_p=1.5"], "gconfig.top_p: must be <= 1, got 1.5"),
    (["model.tiny.head_dim=16"], "model.tiny.head_dim: must be >= 32, got 16"),
    (["actor.eps_clip=0.2", "actor.eps_clip_higher=0.1"], "actor.eps_clip_higher: 0.1 is below actor.eps_clip=0.2"),
    (["train_dataset.batch_size=1", "gconfig.n_samples=2", "actor.ppo_n_minibatches=4"], "actor.ppo_n_minibatches: 4 minibatches"),
    (["actor=3"], "actor: expected a mapping, got 3"),
    (["actor.world_size.x=1"], "actor.world_size: expected an integer, got {'x': 1}"),
    (["actor.world_size=1", "actor.world_size.x=1"], "actor.world_size: is a value, not a section"),
    (["trial_name=off"], """trial_name: expected a string, got False: YAML read the unquoted value as a bool; quote it ('trial_name="..."'"""),
    (["noequals"], "overrides look like dotted.key=value"),
    (["rollout.cpus=[100000]"], "rollout.cpus: CPU 100000 is not available here; give distinct CPUs from ["),
    (["actor.cpus=[0, 0]"], "actor.cpus: [0, 0] repeats a CPU; give distinct CPUs from ["),
    (["scheduler=ray", "actor.cpus=[0]"], "actor.cpus: pins processes under the local scheduler only (scheduler: ray)"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_INPUTS)
def test_bad_config_names_the_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_quoted_override_keeps_a_yaml_keyword_as_a_string():
    assert load_config(None, ['trial_name="off"']).trial_name == "off"


def test_bad_yaml_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("actor: [1, 2\n")
    with pytest.raises(ConfigError, match="is not valid YAML at line"):
        load_config(path)
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(path)


def test_config_is_frozen():
    config = Config()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        config.seed = 3  # type: ignore[misc]


# --------------------------------------------------------------------------- dict overrides merge


QUICKSTART = Path(__file__).resolve().parents[1] / "examples" / "quickstart" / "config.yaml"


def test_a_mapping_override_merges_key_by_key():
    """``actor.optimizer={lr: 1e-3}`` changes lr and keeps the YAML's cosine schedule."""
    config = load_config(QUICKSTART, ["actor.optimizer={lr: 1e-3}", "model={tiny: {num_layers: 3}}"])
    assert config.actor.optimizer == OptimizerConfig(lr=1e-3, schedule="cosine", min_lr_ratio=0.1, grad_clip=1.0)
    assert (config.model.tiny.num_layers, config.model.tiny.hidden_size) == (3, 128)


def test_colon_equals_replaces_a_section():
    config = load_config(QUICKSTART, ["actor.optimizer:={lr: 1e-3}"])
    assert config.actor.optimizer == OptimizerConfig(lr=1e-3)
    merged = load_config(None, ["rollout.engine_args={max_batch_size: 2}", "rollout.engine_args={group_timeout: 5}"])
    assert merged.rollout.engine_args == {"max_batch_size": 2, "group_timeout": 5}
    replaced = load_config(None, ["rollout.engine_args={max_batch_size: 2}", "rollout.engine_args:={group_timeout: 5}"])
    assert replaced.rollout.engine_args == {"group_timeout": 5}


_optimizer_values = st.fixed_dictionaries(
    {},
    optional={
        "lr": st.floats(1e-7, 1.0),
        "warmup_steps": st.integers(0, 100),
        "schedule": st.sampled_from(["constant", "cosine"]),
        "grad_clip": st.floats(0.0, 10.0),
    },
)


@settings(max_examples=40, deadline=None)
@given(_optimizer_values)
def test_a_mapping_override_equals_one_override_per_key(values):
    as_mapping = load_config(QUICKSTART, [f"actor.optimizer={yaml.safe_dump(values, default_flow_style=True).strip()}"])
    one_by_one = load_config(QUICKSTART, [f"actor.optimizer.{k}={yaml.safe_dump(v).splitlines()[0]}" for k, v in values.items()])
    assert as_mapping == one_by_one


def test_an_empty_stop_string_is_refused():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["gconfig.stop=['\\n', '']"])
    assert str(err.value).startswith("gconfig.stop[1]: ")
    assert "empty" in str(err.value)
