"""The plugin API: the one part of ``areal_core`` that a plugin imports (import-linter enforces it).

Import names from here (``from areal_core.api import InferenceEngine, hookimpl``) or from the
submodule that defines them (``areal_core.api.engine``); both are the same objects. Names are
loaded on first use, so a plugin's hook module stays cheap to import.

A plugin declares the API versions it supports with a module attribute on its entry-point
module, e.g. ``AREAL_API = ">=1.0,<2"``; ``areal plugins`` flags a plugin outside the range as
``[INCOMPATIBLE]`` and does not load it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from areal_core.config import (  # noqa: F401
        ActorConfig, Config, DatasetConfig, GenerationConfig, LoraConfig, OffPolicyConfig, from_dict, to_dict,
    )

#: The version of this API: the minor grows with additions, the major with breaking changes.
API_VERSION = "1.4"

#: Marks a plugin's hook implementations (the specs are in :mod:`areal_core.hookspecs`).
hookimpl = pluggy.HookimplMarker("areal")

_EXPORTS: dict[str, tuple[str, ...]] = {
    "algorithm": ("Algorithm", "LossInput"),
    "dataset": ("SPLITS", "corpus", "dataset_key", "dataset_options", "reward_data"),
    "devices": ("server_devices", "uses_devices"),
    "engine": (
        "GenerationRequest", "GenerationResponse", "InferenceEngine", "SamplingParams", "StopReason",
        "SupportsElasticFleet", "SupportsKeepPause", "SupportsWeightChannel",
    ),
    "errors": ("ArealError", "ConfigError", "PluginError", "ProcessFailedError"),
    "hub": ("is_hub_id", "snapshot"),
    "lora": ("adapter_parameters", "has_adapter", "peft_config"),
    "offpolicy": ("BehaviourWeights", "behaviour_weights", "m2po_keep"),
    "http_engine": ("HTTPServerEngine", "Segment", "command_line_flags"),
    "http_json": ("answers_ok", "get_json", "post_json"),
    "platform": ("Platform",),
    "reward": ("RewardFn", "call_reward"),
    "stats_sink": ("SAMPLE_COLUMNS", "SampleRow", "SinkRun", "StatsSink", "check_sink_options", "markdown_table"),
    "scheduler": ("ProcessDiedError", "ProcessHandle", "ProcessSpec", "Scheduler", "free_port", "log_tail"),
    "tool_call": ("ToolCall", "ToolParser"),
    "trajectory": ("Trajectory",),
    "weight_channel": (
        "Bucket", "BucketBroadcast", "ChannelSpec", "FlatBucketChannel", "StagedDigest", "TensorSource", "WeightChannel",
        "as_bytes", "bucket_nbytes", "parse_dtype", "plan_buckets", "post_all", "receive_bucket", "tensor_digest",
        "unflatten_bucket", "wire_runs",
    ),
    "weights": ("SupportsStaging", "TrainerHandle", "WeightUpdateError", "WeightUpdater"),
    "wire": (
        "TOKEN_ENV", "GenerateBody", "GenerateResult", "Health", "LoadWeightsBody", "ReceiveWeightsBody",
        "VersionBody", "WeightGroupBody", "check_load_path", "from_json", "to_json",
    ),
    "workflow": (
        "RewardScorer", "TokenSequence", "Workflow", "decode_ids", "encode_chat", "request_seed", "sampling_params",
        "stop_at_strings",
    ),
}  # fmt: skip
#: The config tree a plugin's classes are built with (defined in ``areal_core.config``).
_CONFIG = (
    "ActorConfig", "Config", "DatasetConfig", "GenerationConfig", "LoraConfig", "OffPolicyConfig", "from_dict",
    "to_dict",
)
_WHERE = {name: f"{__name__}.{module}" for module, names in _EXPORTS.items() for name in names}
_WHERE.update({name: "areal_core.config" for name in _CONFIG})

__all__ = ["API_VERSION", "hookimpl", *sorted(_WHERE)]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'areal_core.api' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)


def __dir__() -> list[str]:
    return __all__
