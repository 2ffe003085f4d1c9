"""Blocking JSON over HTTP with one-line errors: what the controller's engine clients and the
trainer's weight channels use for control calls to inference servers."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from areal_core.api.errors import ArealError


def answers_ok(address: str, endpoint: str = "/health", timeout: float = 1.0) -> bool:
    """True if ``GET http://{address}{endpoint}`` answers 200 within ``timeout`` seconds."""
    try:
        with urllib.request.urlopen(f"http://{address}{endpoint}", timeout=timeout) as resp:
            return resp.status == 200
    except OSError:
        return False


def get_json(address: str, endpoint: str, headers: dict[str, str], timeout: float, label: str) -> dict[str, Any]:
    """``GET http://{address}{endpoint}`` as JSON; ArealError naming ``label`` on failure."""
    request = urllib.request.Request(f"http://{address}{endpoint}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError) as exc:
        raise ArealError(f"{label} {address} {endpoint} failed: {exc}") from None


def post_json(
    address: str, endpoint: str, body: dict[str, Any], headers: dict[str, str], timeout: float, label: str
) -> dict[str, Any]:
    """POST ``body`` to ``http://{address}{endpoint}``; ArealError naming ``label`` (e.g. "hf server") on failure.

    A success whose body is not JSON (vLLM's LoRA routes answer in plain text) is ``{"text": ...}``."""
    request = urllib.request.Request(
        f"http://{address}{endpoint}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            decoded = json.loads(raw)
            message = decoded.get("error") or decoded.get("detail") or decoded if isinstance(decoded, dict) else decoded
        except ValueError:
            message = raw.decode(errors="replace")[:500] or exc.reason
        raise ArealError(f"{label} {address} {endpoint} failed ({exc.code}): {message}") from None
    except OSError as exc:
        raise ArealError(f"{label} {address} {endpoint} is unreachable: {exc}") from None
    try:
        return json.loads(raw or b"{}")
    except ValueError:
        return {"text": raw.decode(errors="replace")}
