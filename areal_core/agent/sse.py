"""Server-sent events, the streaming wire format all the proxy's API shapes share.

The engine returns whole completions, so a stream carries a finished completion: the events
are built first and then sent, and a failed generation is still a plain JSON error response.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from fastapi.responses import StreamingResponse

#: An event: (SSE event name or None, payload). A ``str`` payload is sent as is (``[DONE]``).
Event = tuple[str | None, dict[str, Any] | str]
DONE: Event = (None, "[DONE]")


def encode(event: Event) -> bytes:
    name, data = event
    head = f"event: {name}\n" if name else ""
    body = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"{head}data: {body}\n\n".encode()


def stream(events: Iterable[Event]) -> StreamingResponse:
    """A ``text/event-stream`` response sending ``events`` in order."""
    chunks = [encode(e) for e in events]
    return StreamingResponse(
        iter(chunks), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
