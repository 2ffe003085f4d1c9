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
    """Mixed into vLLM's worker class; its methods are called through ``collective_rpc``.

    Phase two of a collective update (``areal_commit_staged``) and its undo (``areal_rollback``)
    go to the weight-transfer engine when it stages (our ``areal_gloo``). vLLM's ``nccl`` engine
    loads as the buckets arrive: its commit only reports that, and it cannot roll back.
    """

    def areal_reload_from_dir(self, path: str) -> None:
        """Reload HF safetensors from directory ``path`` (vLLM's own loader), then fix the tied head."""
        self._areal_load(path)
        self._areal_weights_dir = path  # what a rollback past the next commit loads again
        forget = getattr(self.weight_transfer_engine, "forget_kept", None)  # type: ignore[attr-defined]
        if forget is not None:
            forget()

    def areal_commit_staged(self) -> str | None:
        """Load the staged update; its digest, or None when the engine loaded it on arrival."""
        commit = getattr(self.weight_transfer_engine, "commit", None)  # type: ignore[attr-defined]
        return None if commit is None else commit()

    def areal_rollback(self) -> None:
        """Serve again what the last commit replaced (a kept copy, or the files it was loaded from)."""
        rollback = getattr(self.weight_transfer_engine, "rollback", None)  # type: ignore[attr-defined]
        if rollback is None:
            engine = type(self.weight_transfer_engine).__name__  # type: ignore[attr-defined]
            raise RuntimeError(f"{engine} loads weights as they arrive and keeps no copy: it cannot roll back")
        if not rollback():
            self._areal_load(getattr(self, "_areal_weights_dir", None) or self.vllm_config.model_config.model)  # type: ignore[attr-defined]

    def areal_abandon_update(self) -> bool:
        """End a weight-update session whose trainer is gone (it died or left between vLLM's
        ``start_weight_update`` and ``finish_weight_update``): the staged part is dropped and vLLM's
        own ``finish_weight_update`` closes the session, loading nothing. True if there was one.
        Without it the worker refuses every later start and the trainer's release. vLLM's ``nccl``
        loaded part of it on arrival: that server fails here and is replaced."""
        if not self._areal_update_active():
            return False
        engine = self.weight_transfer_engine  # type: ignore[attr-defined]
        if not hasattr(engine, "commit"):
            raise RuntimeError(
                f"{type(engine).__name__} loaded part of an abandoned weight update on arrival: "
                "this server serves mixed weights; replace it"
            )
        engine.start_weight_update()  # drops what was staged
        self.finish_weight_update()  # type: ignore[attr-defined]
        return True

    def _areal_update_active(self) -> bool:
        if not hasattr(self, "_weight_update_active"):
            raise VLLMInternalMissing(
                f"areal-engine-vllm: {type(self).__name__}._weight_update_active is missing, so an update "
                "abandoned by a dead trainer cannot be ended; install vllm 0.32.*"
            )
        return bool(self._weight_update_active)

    def areal_weights_digest(self) -> dict[str, str]:
        """sha256 of every parameter this worker serves (vLLM's layout), by name."""
        from areal_core.api.weight_channel import tensor_digest

        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        return {name: tensor_digest(param) for name, param in model.named_parameters()}

    def _areal_load(self, path: str) -> None:
        self.reload_weights(weights_path=path)  # type: ignore[attr-defined]
        refresh_tied_lm_head(self.model_runner.get_model())  # type: ignore[attr-defined]
