"""areal-engine-vllm: registers the ``vllm`` inference engine (``rollout.engine: vllm``).

Only "module:attr" strings here: discovery must not import vLLM or torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from areal_core.api import hookimpl

if TYPE_CHECKING:
    from areal_core.api import Config

AREAL_API = ">=1.0,<2"  # the areal_core.api versions this plugin supports


@hookimpl
def areal_register_inference_engines(register):
    register("vllm", "areal_engine_vllm.client:VLLMEngine")


@hookimpl
def areal_configure(config: Config) -> None:
    """``rollout.pause_mode: keep`` with ``actor.lora`` is refused for vLLM: a held request decodes on
    the adapter it started with, after the update has unloaded it."""
    from areal_core.api.errors import ConfigError

    rollout = config.rollout
    if rollout.engine == "vllm" and rollout.pause_mode == "keep" and config.actor.lora is not None:
        raise ConfigError(
            "rollout.pause_mode",
            "keep: vLLM holds each request on the LoRA adapter it started with, which an update replaces; "
            "set rollout.pause_mode=abort with actor.lora",
        )
