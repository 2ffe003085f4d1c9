"""Worker-side weight loading inside vLLM (``--worker-extension-cls``, a native vLLM hook).

vLLM's in-place reload leaves a tied output layer on the OLD weights on CPU (the embedding is
reloaded, the oneDNN-packed copy the output layer computes with is not), so every reload here
is followed by :func:`refresh_tied_lm_head`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def refresh_tied_lm_head(model: Any) -> None:
    """Re-derive the output layer's kernel weights from the (tied, just reloaded) embedding."""
    from vllm.platforms import current_platform

    config = getattr(model, "config", None)
    lm_head = getattr(model, "lm_head", None)
    if not current_platform.is_cpu() or lm_head is None or not getattr(config, "tie_word_embeddings", False):
        return
    method = getattr(lm_head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(lm_head)


def reload_in_place(vllm_config: Any, model: Any, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Load checkpoint-format ``(name, tensor)`` pairs into ``model`` through vLLM's layerwise reload."""
    from vllm.model_executor.model_loader.reload.inplace import reload_weights

    reload_weights(vllm_config, model, weights_iterator=tensors, weights_path=None, is_checkpoint_format=True)
    refresh_tied_lm_head(model)


class ArealWorkerExtension:
    """Mixed into vLLM's worker class; called through ``collective_rpc("areal_reload_from_dir")``."""

    def areal_reload_from_dir(self, path: str) -> None:
        """Reload HF safetensors from directory ``path`` (vLLM's own loader), then fix the tied head."""
        self.reload_weights(weights_path=path)  # type: ignore[attr-defined]
        refresh_tied_lm_head(self.model_runner.get_model())  # type: ignore[attr-defined]
