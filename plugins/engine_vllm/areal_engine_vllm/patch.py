"""The ``vllm.general_plugins`` entry point: vLLM calls :func:`register` in each of its processes.

It registers our CPU weight-transfer backend ``areal_gloo`` in vLLM's two factories (the server's
worker uses the worker half; on CUDA/Ascend the servers use vLLM's ``nccl``/vllm-ascend's ``hccl``
and this registration is unused). The routes live in
:mod:`areal_engine_vllm.routes` (an endpoint plugin) and the disk reload in
:mod:`areal_engine_vllm.worker_ext` (a worker extension); nothing in vLLM's files is edited.
"""

from __future__ import annotations

import logging
import os

from areal_engine_vllm.protocol import TOKEN_ENV

log = logging.getLogger(f"vllm.{__name__}")  # under "vllm", whose handlers write the server log
_registered = False


def register() -> None:
    """Idempotent; a no-op in vLLM processes started without ``AREAL_VLLM_TOKEN`` (not ours)."""
    global _registered
    if _registered or not os.environ.get(TOKEN_ENV):
        return
    from areal_engine_vllm.gloo_common import BACKEND, register_backend

    register_backend()
    _registered = True
    log.info("areal: registered weight-transfer backend %r", BACKEND)
