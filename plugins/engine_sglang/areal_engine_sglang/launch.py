"""The command line and environment of one SGLang server process (started by our scheduler).

``python -m sglang.launch_server`` on the node's address with ``--api-key`` (SGLang then requires the
bearer token on every route but ``/health``, ``/ready`` and ``/metrics``) and ``--weight-version 0``
(replies carry integer versions). ``rollout.engine_args`` adds or overrides any SGLang flag:
``{"mem_fraction_static": 0.5}`` -> ``--mem-fraction-static 0.5``; ``true`` -> a bare flag;
``false`` -> dropped. With ``actor.lora``: ``--enable-lora``, ``--max-lora-rank`` and
``--lora-target-modules`` (adapters are then loaded at run time, ``/load_lora_adapter``).
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

from areal_core.api.http_engine import command_line_flags
from areal_core.api.errors import ConfigError

if TYPE_CHECKING:
    from areal_core.api import Config
    from areal_core.api.platform import Platform

SERVER_MODULE = "sglang.launch_server"
INSTALL_HINT = (
    "pip install 'areal-engine-sglang[cuda]' (or pip install -e 'plugins/engine_sglang[cuda]') on a CUDA machine"
)


def require_sglang() -> None:
    """ConfigError for ``rollout.engine`` unless the ``sglang`` package is importable here."""
    if importlib.util.find_spec("sglang") is None:
        raise ConfigError(
            "rollout.engine", f"'sglang' needs the sglang package, which is not installed: {INSTALL_HINT}"
        )


def server_command(config: Config, port: int | str, seed: int, token: str, host: str = "127.0.0.1") -> list[str]:
    """Arguments after the Python executable (SGLang reads its API key from the command line only);
    ``host``/``port`` are what the server binds (or the scheduler's placeholders for them)."""
    flags: dict[str, Any] = {
        "model-path": config.model.path,
        "host": host,
        "port": port,
        "dtype": config.model.dtype,
        "random-seed": seed,
        "weight-version": "0",
        "tp-size": config.rollout.devices_per_server,
    }
    lora = config.actor.lora
    if lora is not None:
        flags.update({"enable-lora": True, "max-lora-rank": lora.rank})
    # the client's bearer token, whatever engine_args say
    cmd = ["-m", SERVER_MODULE, *command_line_flags(flags, {**config.rollout.engine_args, "api-key": token})]
    return cmd if lora is None else [*cmd, "--lora-target-modules", *lora.target_modules]  # nargs="*"


def server_env(platform: Platform) -> dict[str, str]:
    """The platform's engine env, the offline hub, and a cheap ``/health``.

    By default SGLang's ``/health`` generates one token and answers after a second at the
    earliest; with ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0`` it answers 200 at once when the
    server is up (503 while it starts).
    """
    return {**platform.engine_env("sglang"), "HF_HUB_OFFLINE": "1", "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0"}
