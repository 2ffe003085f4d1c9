"""Plugin-aware config checks: every selected name exists, algorithm needs hold, plugins agree."""

from __future__ import annotations

import attrs

from areal_core.config import Config
from areal_core.api.engine import SupportsKeepPause
from areal_core.api.errors import ConfigError, PluginError
from areal_core.api.platform import Platform
from areal_core.active_platform import resolve_platform
from areal_core.plugins import Plugins

#: (dotted config key, plugin kind) for every name a config selects.
SELECTED_NAMES: tuple[tuple[str, str], ...] = (
    ("rollout.engine", "engine"),
    ("actor.weight_update", "weight_updater"),
    ("actor.algorithm", "algorithm"),
    ("reward.name", "reward"),
    ("train_dataset.name", "dataset"),
    ("valid_dataset.name", "dataset"),
    ("agent.tool_parser", "tool_parser"),
)
#: Values that pick a plugin at run time instead of naming one.
AUTO_NAMES: frozenset[tuple[str, str]] = frozenset({("agent.tool_parser", "auto")})


def _get_dotted(config: Config, key: str) -> str | None:
    node = config
    for part in key.split("."):
        node = getattr(node, part, None)
        if node is None:
            return None
    return node


def resolve_config(config: Config, plugins: Plugins, *, require_available: bool = True) -> tuple[Config, Platform]:
    """Check ``config`` against the installed plugins; return the final config and its platform.

    The final config is what plugins' ``areal_configure`` made of it, with ``platform: auto``
    resolved and LoRA over ``xccl`` to an engine that loads adapters from disk set to ``disk``
    (:func:`adapter_weight_path_note`).

    ``require_available=False`` (``areal config``) accepts a platform this machine cannot run, so a
    config for another machine validates here; every run path keeps the default.
    """
    platform = resolve_platform(config.platform, plugins, config.plugins, require_available=require_available)
    for key, kind in SELECTED_NAMES:
        name = _get_dotted(config, key)
        if name is None or (key, name) in AUTO_NAMES:
            continue
        try:
            plugins.registration(kind, name)
        except PluginError as exc:
            raise ConfigError(key, str(exc)) from None
    for name in config.stats.sinks:
        try:
            plugins.registration("stats_sink", name)
        except PluginError as exc:
            raise ConfigError("stats.sinks", str(exc)) from None
    engine = plugins.get("engine", config.rollout.engine)
    engine.check_engine_args(config.rollout.engine_args)
    if config.rollout.pause_mode == "keep" and not issubclass(engine, SupportsKeepPause):
        raise ConfigError(
            "rollout.pause_mode",
            f"keep: engine {config.rollout.engine!r} cannot hold requests through a weight update "
            "(no areal_core.api.SupportsKeepPause); set rollout.pause_mode=abort or rollout.engine=hf",
        )
    if config.rollout.pause_mode == "keep" and config.actor.lora is not None and engine.adapters_by_name:
        raise ConfigError(
            "rollout.pause_mode",
            f"keep: engine {config.rollout.engine!r} holds each request on the LoRA adapter it started with, "
            "which an update replaces; set rollout.pause_mode=abort with actor.lora",
        )
    try:
        algorithm = plugins.get("algorithm", config.actor.algorithm)
    except PluginError as exc:
        raise ConfigError("actor.algorithm", str(exc)) from None
    if config.gconfig.n_samples < algorithm.min_group_size:
        raise ConfigError(
            "gconfig.n_samples",
            f"{config.gconfig.n_samples} samples per prompt, but algorithm "
            f"{config.actor.algorithm!r} needs at least {algorithm.min_group_size}; "
            f"set gconfig.n_samples>={algorithm.min_group_size}",
        )
    config = plugins.configure(config)
    if not isinstance(config, Config):
        raise PluginError(f"a plugin's areal_configure returned {type(config).__name__}, not a Config")
    if adapter_weight_path_note(config, plugins) is not None:
        config = attrs.evolve(config, actor=attrs.evolve(config.actor, weight_update="disk"))
    return attrs.evolve(config, platform=platform.name) if config.platform == "auto" else config, platform


def adapter_weight_path_note(config: Config, plugins: Plugins) -> str | None:
    """Why a LoRA config's ``actor.weight_update=xccl`` takes the ``disk`` path (None: it does not).

    ``xccl`` broadcasts the adapter's tensors alone only into engines whose channel takes them
    (``channel_takes_adapter``: hf); vLLM and SGLang load adapters from disk, so the adapter goes
    there, and :func:`resolve_config`'s config says ``disk``. Raises a ConfigError naming
    ``actor.weight_update`` when the disk updater is not installed.
    """
    if config.actor.lora is None or config.actor.weight_update != "xccl":
        return None
    engine = config.rollout.engine
    if plugins.get("engine", engine).channel_takes_adapter:
        return None
    try:
        plugins.registration("weight_updater", "disk")
    except PluginError as exc:
        raise ConfigError(
            "actor.weight_update", f"xccl: engine {engine!r} loads LoRA adapters from disk only, and {exc}"
        ) from None
    return f"engine {engine!r} loads LoRA adapters from disk only: actor.weight_update=xccl uses the disk path for the adapter"
