"""Look-ups of the vLLM internals this plugin touches (not vLLM's documented APIs).

Each one goes through :func:`internal`, so a vLLM that moved or renamed one fails with one line
naming it and the tested series, instead of skipping silently. The list, with why each is needed
and what breaks, is in this plugin's README ("vLLM internals touched").
"""

from __future__ import annotations

import importlib
from typing import Any

from areal_core.api.errors import PluginError

#: The vLLM series this plugin is tested with (the ``[cuda]`` extra pins ``vllm==0.32.*``).
TESTED_SERIES = "0.32"


class VLLMInternalMissing(PluginError):
    """A vLLM internal this plugin relies on is gone: the installed vLLM is not the tested series."""


def internal(module: str, path: str) -> Any:
    """``module``'s attribute ``path`` (dotted: ``"Class.attr"``), or one line naming what is missing."""
    try:
        value: Any = importlib.import_module(module)
        for part in path.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError) as exc:
        raise VLLMInternalMissing(
            f"areal-engine-vllm: vLLM internal {module}.{path} is missing ({type(exc).__name__}: {exc}); "
            f"installed vllm {_installed()}, tested with vllm=={TESTED_SERIES}.*: install that series"
        ) from None
    return value


def _installed() -> str:
    try:
        import vllm

        return str(vllm.__version__)
    except Exception:  # noqa: BLE001 - only for the message
        return "(not importable)"
