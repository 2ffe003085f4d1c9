"""The plugin contract: every hook a plugin may implement.

Registration hooks hand the plugin a ``register`` callback; the host owns the registries.
A registered object may be the class/function itself or a ``"module:attr"`` string, so a plugin
can register heavy classes (vLLM, torch_npu) without importing them at discovery time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import pluggy

if TYPE_CHECKING:
    from areal_core.config import Config

hookspec = pluggy.HookspecMarker("areal")

#: ``register(platform_cls)``: the class carries ``name``, ``priority`` and ``is_available()``.
RegisterPlatform = Callable[[Any], None]
#: ``register(name, obj_or_path)``: ``obj_or_path`` is a class/callable or a ``"module:attr"`` string.
RegisterNamed = Callable[[str, Any], None]


@hookspec
def areal_register_platforms(register: RegisterPlatform) -> None:
    """Register Platform subclasses (see :class:`areal_core.api.platform.Platform`).

    :param register: call ``register(PlatformCls)`` once per platform; ``PlatformCls.name`` is
        what ``platform:`` selects and ``is_available()`` must not import heavy libraries.
    """


@hookspec
def areal_register_inference_engines(register: RegisterNamed) -> None:
    """Register inference engines (clients of generation servers).

    :param register: call ``register("vllm", EngineCls)``; the name is what ``rollout.engine``
        selects. ``EngineCls`` implements :class:`areal_core.api.engine.InferenceEngine`.
    """


@hookspec
def areal_register_weight_updaters(register: RegisterNamed) -> None:
    """Register trainer-to-server weight paths.

    :param register: call ``register("disk", UpdaterCls)``; the name is what
        ``actor.weight_update`` selects. ``UpdaterCls`` implements
        :class:`areal_core.api.weights.WeightUpdater`.
    """


@hookspec
def areal_register_algorithms(register: RegisterNamed) -> None:
    """Register RL algorithms (advantage estimator + policy loss).

    :param register: call ``register("grpo", AlgorithmCls)``; the name is what
        ``actor.algorithm`` selects. ``AlgorithmCls`` implements
        :class:`areal_core.api.algorithm.Algorithm`.
    """


@hookspec
def areal_register_rewards(register: RegisterNamed) -> None:
    """Register reward functions.

    :param register: call ``register("gsm8k", fn)`` where ``fn(prompt, completion, **data) ->
        float`` (sync or async, picklable for the reward process pool); the name is what
        ``reward.name`` selects.
    """


@hookspec
def areal_register_datasets(register: RegisterNamed) -> None:
    """Register datasets (prompt sources with the fields their reward needs).

    :param register: call ``register("arith", loader)`` where ``loader(config: DatasetConfig,
        split: str) -> list[dict]``; each dict has ``"id"``, ``"prompt"`` and reward fields. The
        name is what ``train_dataset.name`` selects.
    """


@hookspec
def areal_configure(config: Config) -> Config | None:
    """Validate or adjust the resolved config once plugins are loaded.

    Called for every plugin in registration order; each sees the previous one's result.
    Raise :class:`areal_core.api.errors.ConfigError` naming the dotted key to reject a config.

    :param config: the config so far (frozen; use ``attrs.evolve`` to change it).
    :return: an updated config, or ``None`` to keep it as is.
    """


@hookspec
def areal_register_tool_parsers(register: RegisterNamed) -> None:
    """Register tool-call parsers for the agent proxy (:mod:`areal_core.builtin.tool_parsers.parsers`).

    :param register: call ``register("hermes", parse)`` where ``parse(text) -> (content, calls)``
        takes the output decoded with special tokens kept and returns the remaining content and a
        list of :class:`areal_core.api.tool_call.ToolCall`; text it does not recognise comes
        back unchanged with no calls. The name is what ``agent.tool_parser`` selects.
    """


@hookspec
def areal_register_stats_sinks(register: RegisterNamed) -> None:
    """Register stats sinks: where a run's scalars and sample tables go (trackers, files).

    :param register: call ``register("wandb", SinkCls)``; the name is what ``stats.sinks`` lists.
        ``SinkCls(run: SinkRun)`` implements :class:`areal_core.api.stats_sink.StatsSink`; its
        options come from the config's ``plugins.<name>`` section.
    """
