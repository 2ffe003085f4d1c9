"""LoRA on the policy (``actor.lora``) with peft: build the adapted model, name its adapter
tensors as peft saves them, and write an adapter directory that peft, vLLM and SGLang load.

Only the adapter trains; the base weights stay frozen (and are what the reference policy uses,
with the adapter disabled). The tensors a weight update sends are the adapter's alone, named as
in peft's ``adapter_model.safetensors`` (``base_model.model.<module>.lora_A.weight``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_core.api.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn

    from areal_core.config import LoraConfig

#: The adapter name peft gives the policy's one adapter (it appears in parameter names).
ADAPTER = "default"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: What peft puts before a wrapped model's parameter names in an adapter file.
PEFT_PREFIX = "base_model.model."
_ADAPTER_IN_NAME = re.compile(rf"\.{ADAPTER}(?=\.weight$)")
_ADAPTER_PARAM = re.compile(rf"\.lora_[AB]\.{ADAPTER}\.weight$")


def peft_config(lora: LoraConfig, base_model: str = "") -> Any:
    """peft's ``LoraConfig`` for ``actor.lora`` (causal LM, no bias)."""
    import peft

    return peft.LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_model or None,
    )


def apply_lora(lm: nn.Module, lora: LoraConfig, base_model: str) -> nn.Module:
    """``lm`` with a fresh adapter on ``lora.target_modules``; only the adapter requires grad.

    A target that matches no module is a :class:`ConfigError` naming ``actor.lora.target_modules``.
    """
    import peft

    linear = sorted({name.rsplit(".", 1)[-1] for name, m in lm.named_modules() if type(m).__name__ == "Linear"})
    try:
        model = peft.get_peft_model(lm, peft_config(lora, base_model))
    except ValueError as exc:
        if "target modules" not in str(exc).lower():
            raise
        raise ConfigError(
            "actor.lora.target_modules",
            f"{list(lora.target_modules)} matches no layer of {type(lm).__name__}; its linear layers are {linear}",
        ) from None
    if hasattr(model.get_output_embeddings(), "lora_A"):  # log-probs read the head's weight directly
        raise ConfigError(
            "actor.lora.target_modules", f"{list(lora.target_modules)} adapts the output layer; leave lm_head out"
        )
    if len(adapter_parameters(model)) != sum(p.requires_grad for p in model.parameters()):
        raise ConfigError(
            "actor.lora.target_modules", f"{list(lora.target_modules)}: only linear layers can be adapted, e.g. {linear}"
        )
    return model


@contextmanager
def adapter_disabled(lm: nn.Module) -> Iterator[None]:
    """Inside, ``lm`` computes as its base model (the reference policy).

    peft's own ``disable_adapter()`` also sets ``requires_grad`` on the adapter layers, which under
    FSDP2 lands on whichever parameter object is registered at that moment (sharded or gathered)
    and leaves the optimizer's parameters frozen; this flips only the layers' disabled flag.
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in lm.modules() if isinstance(m, BaseTunerLayer)]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer in layers:
            layer._disable_adapters = False


def saved_name(param_name: str) -> str:
    """peft's file name of an adapter parameter: under peft's prefix, the adapter name dropped."""
    name = _ADAPTER_IN_NAME.sub("", param_name)
    return name if name.startswith(PEFT_PREFIX) else PEFT_PREFIX + name


def adapter_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(saved name, parameter) of every adapter tensor, in model order, of a peft model or of the
    model it wraps (whose layers peft adapted in place)."""
    return [(saved_name(n), p) for n, p in model.named_parameters() if _ADAPTER_PARAM.search(n)]


def has_adapter(model: nn.Module) -> bool:
    return any(_ADAPTER_PARAM.search(n) for n, _ in model.named_parameters())


def write_adapter(out: Path, tensors: dict[str, Any], lm: nn.Module) -> None:
    """Write ``adapter_model.safetensors`` (``tensors``, saved names) and ``adapter_config.json``
    (with the base model's name or path) into ``out``."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    lm.peft_config[ADAPTER].save_pretrained(str(out))
