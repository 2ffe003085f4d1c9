"""What the client and the in-vLLM patch agree on: env vars, names, routes and JSON bodies.

Light on purpose (attrs only): both sides import it without loading vLLM or torch.
"""

from __future__ import annotations

import attrs

from areal_core.hf_engine.protocol import ReceiveWeightsBody, VersionBody, bucket_body, from_json, to_json

# shared with the hf server: JSON helpers and the bucket/version bodies (same wire format)
__all__ = ["ReceiveWeightsBody", "VersionBody", "bucket_body", "from_json", "to_json"]

#: The bearer token of the /areal/* routes (and ``--api-key``). Its presence turns the patch on:
#: vLLM processes started without it are left untouched.
TOKEN_ENV = "AREAL_VLLM_TOKEN"
#: Disk updates may only load directories under this root (unset: any directory).
ALLOWED_ROOT_ENV = "AREAL_VLLM_ALLOWED_ROOT"
#: Name of the entry points in ``vllm.general_plugins``/``vllm.endpoint_plugins`` (for ``VLLM_PLUGINS``).
VLLM_PLUGIN_NAME = "areal"
#: The weight-transfer backend the patch registers with vLLM's ``WeightTransferEngineFactory``.
TRANSFER_BACKEND = "areal_collective"
#: ``--worker-extension-cls`` that adds the disk reload (with the tied-embedding refresh) to workers.
WORKER_EXTENSION = "areal_engine_vllm.worker_ext.ArealWorkerExtension"
#: Response header of ``/v1/completions``: the weight version when the request arrived.
VERSION_HEADER = "X-Areal-Weight-Version"
#: The model name the servers answer to (``--served-model-name``).
SERVED_NAME = "areal"

@attrs.frozen(kw_only=True)
class DiskUpdateBody:
    """``POST /areal/update_weights_from_disk``: reload HF safetensors from ``path`` as ``version``."""

    path: str
    version: int


@attrs.frozen(kw_only=True)
class WeightGroupBody:
    """``POST /areal/init_weight_group``: join the trainer's weight group as ``rank`` (rank 0 sends)
    over ``backend`` (the trainer platform's: gloo, nccl, hccl)."""

    master_addr: str
    master_port: int
    rank: int
    world_size: int
    group_name: str
    backend: str = "gloo"
    timeout_s: float = 300.0


@attrs.frozen(kw_only=True)
class ServerState:
    """Reply to ``GET /areal/state``."""

    version: int
    paused: bool
