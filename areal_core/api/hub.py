"""Hugging Face hub ids in place of local paths (``model.path: Qwen/Qwen3-0.6B``, ``openai/gsm8k``).

A value that is no existing local path but reads ``org/name`` is a hub id. :func:`snapshot`
returns its local copy through ``huggingface_hub`` (downloaded, or the cached copy when offline)
and turns every failure into one :class:`ConfigError` line naming the key.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from areal_core.api.errors import ConfigError

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def is_hub_id(value: str) -> bool:
    """``org/name`` and not an existing local path."""
    return bool(_HUB_ID.fullmatch(value)) and not Path(value).exists()


def snapshot(
    repo_id: str, key: str, repo_type: Literal["model", "dataset"] = "model", allow_patterns: list[str] | None = None
) -> Path:
    """The local directory of hub repo ``repo_id``; ``key`` is the config key errors name."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ConfigError(
            key, f"{repo_id!r} is no local path, and hub ids need huggingface_hub; pip install huggingface_hub, "
            "or give a local path"
        ) from None  # fmt: skip
    try:
        return Path(snapshot_download(repo_id, repo_type=repo_type, allow_patterns=allow_patterns))
    except Exception as exc:  # noqa: BLE001 - offline, unknown repo, network: one line for the user
        reason = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(
            key, f"{repo_id!r} is no local path and could not be fetched from the hub ({type(exc).__name__}: "
            f"{reason}); download it once where the hub is reachable, or give a local path"
        ) from None  # fmt: skip
