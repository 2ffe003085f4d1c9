"""The ``vllm.general_plugins`` entry point: vLLM calls :func:`register` in each of its processes.

It registers the ``areal_collective`` weight-transfer backend with vLLM's factory. The routes live in
:mod:`areal_engine_vllm.routes` (an endpoint plugin) and the disk reload in
:mod:`areal_engine_vllm.worker_ext` (a worker extension); nothing in vLLM's files is edited.
"""

from __future__ import annotations

import logging
import os

from areal_engine_vllm.protocol import TOKEN_ENV, TRANSFER_BACKEND

log = logging.getLogger(f"vllm.{__name__}")  # under "vllm", whose handlers write the server log
_registered = False


def register() -> None:
    """Idempotent; a no-op in vLLM processes started without ``AREAL_VLLM_TOKEN`` (not ours)."""
    global _registered
    if _registered or not os.environ.get(TOKEN_ENV):
        return
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    try:
        WeightTransferEngineFactory.register_engine(
            TRANSFER_BACKEND, "areal_engine_vllm.collective_transfer", "CollectiveWeightTransferEngine"
        )
    except ValueError:  # registered already (e.g. by an earlier import in this process)
        pass
    _registered = True
    log.info("areal: registered weight-transfer backend %r", TRANSFER_BACKEND)
