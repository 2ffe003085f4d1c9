"""What the client and the in-vLLM patch agree on: env vars, names, routes and JSON bodies.

Light on purpose (attrs only): both sides import it without loading vLLM or torch.
"""

from __future__ import annotations

import attrs

from areal_core.api.errors import ConfigError
from areal_core.api.wire import VersionBody, from_json, to_json

# shared with the hf server: JSON helpers and the version body (same wire format)
__all__ = ["VersionBody", "from_json", "to_json"]

#: The bearer token of the /areal/* routes (and ``--api-key``). Its presence turns the patch on:
#: vLLM processes started without it are left untouched.
TOKEN_ENV = "AREAL_VLLM_TOKEN"
#: Disk updates may only load directories under this root (unset: any directory).
ALLOWED_ROOT_ENV = "AREAL_VLLM_ALLOWED_ROOT"
#: Test hook: a server whose environment sets this to versions ("12,42") fails their commit or disk load.
FAIL_COMMIT_ENV = "AREAL_VLLM_FAIL_COMMIT"
#: Name of the entry points in ``vllm.general_plugins``/``vllm.endpoint_plugins`` (for ``VLLM_PLUGINS``).
VLLM_PLUGIN_NAME = "areal"
#: ``--worker-extension-cls`` that adds the disk reload (with the tied-embedding refresh) to workers.
WORKER_EXTENSION = "areal_engine_vllm.worker_ext.ArealWorkerExtension"
#: vLLM's label of the weights a server started with (before any ``/areal/set_version``): version 0.
INITIAL_WEIGHT_LABEL = "default"
#: The model name the servers answer to (``--served-model-name``).
SERVED_NAME = "areal"
#: The weight-transfer backend per platform ``device_type``: ours on CPU (``areal_gloo``, registered
#: by this plugin), vLLM's own on CUDA, vllm-ascend's on Ascend.
TRANSFER_BACKENDS = {"cpu": "areal_gloo", "cuda": "nccl", "npu": "hccl"}


def transfer_backend(device_type: str) -> str:
    """The vLLM weight-transfer backend for a platform's ``device_type``."""
    try:
        return TRANSFER_BACKENDS[device_type]
    except KeyError:
        known = ", ".join(f"{k} -> {v}" for k, v in TRANSFER_BACKENDS.items())
        raise ConfigError(
            "platform", f"device type {device_type!r} has no vLLM weight-transfer backend (known: {known})"
        ) from None


@attrs.frozen(kw_only=True)
class DiskUpdateBody:
    """``POST /areal/update_weights_from_disk``: reload HF safetensors from ``path`` as ``version``."""

    path: str
    version: int


@attrs.frozen(kw_only=True)
class ServerState:
    """Reply to ``GET /areal/state``."""

    version: int
    paused: bool
