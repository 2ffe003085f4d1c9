"""Plugin manager: discovery, registration, duplicates, broken plugins, allow-list."""

from __future__ import annotations

import importlib.metadata as md
import sys
import types

import pytest

from areal_core.api import API_VERSION, hookimpl
from areal_core.api.errors import PluginError
from areal_core.plugins import api_mismatch, load_plugins


class _FakeDist:
    def __init__(self, name: str, version: str = "1.0") -> None:
        self.name, self.version = name, version


def _entry_point(name: str, module: str, dist: str) -> md.EntryPoint:
    ep = md.EntryPoint(name=name, value=module, group="areal")
    return ep._for(_FakeDist(dist)) if hasattr(ep, "_for") else ep


@pytest.fixture
def installed(monkeypatch):
    """Pretend these entry points are installed: modules are put in sys.modules for real import."""
    eps: list[md.EntryPoint] = []

    def add(name: str, dist: str, module: types.ModuleType | None = None, module_name: str | None = None) -> None:
        module_name = module_name or f"_areal_test_{name}"
        if module is not None:
            monkeypatch.setitem(sys.modules, module_name, module)
        eps.append(_entry_point(name, module_name, dist))

    monkeypatch.setattr("areal_core.plugins._entry_points", lambda: list(eps))
    return add


def _module(name: str, **hooks) -> types.ModuleType:
    mod = types.ModuleType(name)
    for hook, fn in hooks.items():
        setattr(mod, hook, hookimpl(fn))
    return mod


def test_builtins_register_through_the_same_hooks():
    plugins = load_plugins(autoload=False)
    assert "cpu" in plugins.names("platform")
    assert "hf" in plugins.names("engine")
    assert {"grpo", "ppo", "dr_grpo", "dapo", "rloo", "gspo", "reinforce_pp"} <= set(plugins.names("algorithm"))
    assert {info.distribution for info in plugins.infos} == {"areal-core"}
    assert all(info.hooks for info in plugins.infos)


def test_fresh_manager_per_call():
    assert load_plugins(autoload=False).pm is not load_plugins(autoload=False).pm


def test_entry_point_plugin_is_discovered(installed):
    mod = _module("m", areal_register_rewards=lambda register: register("len", "builtins:len"))
    installed("reward_len", "areal-reward-len", mod)
    plugins = load_plugins()
    assert plugins.get("reward", "len") is len
    info = next(i for i in plugins.infos if i.name == "reward_len")
    assert (info.distribution, info.registered) == ("areal-reward-len", {"reward": ["len"]})


def test_duplicate_name_names_both_distributions(installed):
    installed("engine_a", "areal-engine-a", _module("a", areal_register_inference_engines=lambda register: register("x", object)))
    installed("engine_b", "areal-engine-b", _module("b", areal_register_inference_engines=lambda register: register("x", object)))
    with pytest.raises(PluginError, match=r"engine 'x' is registered twice: by areal-engine-a .* by areal-engine-b"):
        load_plugins()


def test_duplicate_of_a_builtin_name(installed):
    installed("algorithm_grpo2", "areal-algo-dup", _module("d", areal_register_algorithms=lambda register: register("grpo", object)))
    with pytest.raises(PluginError, match="by areal-core .* by areal-algo-dup"):
        load_plugins()


def test_broken_plugin_does_not_stop_others_and_errors_only_when_selected(installed):
    installed("engine_vllm", "areal-engine-vllm", module_name="_areal_test_does_not_exist")
    installed("reward_ok", "areal-reward-ok", _module("ok", areal_register_rewards=lambda register: register("ok", "builtins:abs")))
    plugins = load_plugins()
    (broken,) = plugins.broken
    assert broken.name == "engine_vllm" and "ModuleNotFoundError" in broken.error
    assert plugins.get("reward", "ok") is abs
    assert plugins.registration("engine", "hf").distribution == "areal-core"  # unaffected
    with pytest.raises(PluginError, match="engine 'vllm' comes from plugin 'engine_vllm' .* failed to load: ModuleNotFoundError"):
        plugins.get("engine", "vllm")


def test_unknown_name_lists_installed_and_suggests_distribution():
    plugins = load_plugins(autoload=False)
    with pytest.raises(PluginError) as err:
        plugins.get("engine", "vllm")
    assert str(err.value) == "engine 'vllm' is not installed; pip install areal-engine-vllm (installed engines: hf)"
    with pytest.raises(PluginError, match=r"algorithm 'nope' is not installed \(installed algorithms: dapo, "):
        plugins.get("algorithm", "nope")


def test_allow_list_and_disable_autoload(installed, monkeypatch):
    installed("reward_one", "areal-reward-one", _module("one", areal_register_rewards=lambda register: register("one", "builtins:abs")))
    installed("reward_two", "areal-reward-two", _module("two", areal_register_rewards=lambda register: register("two", "builtins:abs")))
    monkeypatch.setenv("AREAL_PLUGINS", "reward_one")
    assert {"one"} <= set(load_plugins().names("reward")) and "two" not in load_plugins().names("reward")
    monkeypatch.setenv("AREAL_PLUGINS", "areal-reward-two")  # distribution names work too
    assert "two" in load_plugins().names("reward") and "one" not in load_plugins().names("reward")
    monkeypatch.delenv("AREAL_PLUGINS")
    monkeypatch.setenv("AREAL_DISABLE_PLUGIN_AUTOLOAD", "1")
    names = load_plugins().names("reward")
    assert "one" not in names and "two" not in names and "arith" in names


def test_check_pending_rejects_unknown_hooks(areal_plugins):
    areal_plugins.add_hooks("typo", areal_register_reward=lambda register: None)
    with pytest.raises(PluginError, match="typo.*unknown hook"):
        areal_plugins.load()


def test_lazy_target_import_failure_is_clear(areal_plugins):
    areal_plugins.add_hooks("lazy", areal_register_rewards=lambda register: register("ghost", "no_such_module_xyz:fn"))
    plugins = areal_plugins.load()
    with pytest.raises(PluginError, match="reward 'ghost' from <inline> failed to import no_such_module_xyz:fn"):
        plugins.get("reward", "ghost")


def test_configure_hook_threads_config(areal_plugins):
    import attrs

    from areal_core.config import Config

    areal_plugins.add_hooks("seed", areal_configure=lambda config: attrs.evolve(config, seed=config.seed + 1))
    areal_plugins.add_hooks("noop", areal_configure=lambda config: None)
    assert areal_plugins.load().configure(Config(seed=4)).seed == 5


def test_plugin_outside_its_api_range_is_incompatible_and_skipped(installed, areal_plugins):
    old = _module("old", areal_register_rewards=lambda register: register("old", "builtins:abs"))
    old.AREAL_API = ">=0.1,<1"
    installed("reward_old", "areal-reward-old", old)
    plugins = load_plugins()
    info = next(i for i in plugins.infos if i.name == "reward_old")
    assert info.incompatible == f"it supports areal_core.api >=0.1,<1, this areal-core has API {API_VERSION}; install a matching version"
    assert "old" not in plugins.names("reward") and not plugins.broken
    with pytest.raises(PluginError, match="reward 'old' comes from plugin 'reward_old' .* is incompatible: it supports"):
        plugins.get("reward", "old")
    current = _module("current", areal_register_rewards=lambda register: register("now", "builtins:abs"))
    current.AREAL_API = f">={API_VERSION},<{int(API_VERSION.split('.')[0]) + 1}"
    areal_plugins.add(current, name="reward_now")
    areal_plugins.add(old, name="reward_old_inline")
    inline = areal_plugins.load()
    assert inline.get("reward", "now") is abs and "old" not in inline.names("reward")


@pytest.mark.parametrize(
    ("declared", "fits"),
    [(None, True), (">=1.0,<2", True), (f"=={API_VERSION}", True), (f">{API_VERSION}", False), ("<1", False),
     (f"!={API_VERSION}", False)],
)
def test_api_range_check(declared, fits):
    mod = types.ModuleType("m")
    if declared is not None:
        mod.AREAL_API = declared
    assert (api_mismatch(mod) is None) is fits


def test_api_range_that_is_not_a_range_is_named():
    mod = types.ModuleType("m")
    mod.AREAL_API = "one point oh"
    assert api_mismatch(mod) == "AREAL_API = 'one point oh' is not a version range like '>=1.0,<2'"
