"""Worker-side weight loading inside vLLM (``--worker-extension-cls``, a native vLLM hook).

vLLM's in-place reload leaves a tied output layer on the OLD weights on CPU (the embedding is
reloaded, the oneDNN-packed copy the output layer computes with is not), so every reload here
is followed by :func:`refresh_tied_lm_head`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from areal_engine_vllm.vllm_internals import VLLMInternalMissing, internal


def refresh_tied_lm_head(model: Any) -> None:
    """Re-derive the output layer's kernel weights from the (tied, just reloaded) embedding."""
    from vllm.platforms import current_platform

    config = getattr(model, "config", None)
    if not current_platform.is_cpu() or not getattr(config, "tie_word_embeddings", False):
        return
    process = getattr(getattr(getattr(model, "lm_head", None), "quant_method", None), "process_weights_after_loading", None)
    if process is None:
        raise VLLMInternalMissing(
            f"areal-engine-vllm: {type(model).__name__}.lm_head.quant_method.process_weights_after_loading is missing, "
            "so the tied output layer would keep its old weights after a reload; install vllm 0.32.*"
        )
    process(model.lm_head)


def reload_in_place(vllm_config: Any, model: Any, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Load checkpoint-format ``(name, tensor)`` pairs into ``model`` through vLLM's layerwise reload."""
    reload_weights = internal("vllm.model_executor.model_loader.reload.inplace", "reload_weights")
    reload_weights(vllm_config, model, weights_iterator=tensors, weights_path=None, is_checkpoint_format=True)
    refresh_tied_lm_head(model)


class ArealWorkerExtension:
    """Mixed into vLLM's worker class; called through ``collective_rpc("areal_reload_from_dir")``."""

    def areal_reload_from_dir(self, path: str) -> None:
        """Reload HF safetensors from directory ``path`` (vLLM's own loader), then fix the tied head."""
        self.reload_weights(weights_path=path)  # type: ignore[attr-defined]
        refresh_tied_lm_head(self.model_runner.get_model())  # type: ignore[attr-defined]
