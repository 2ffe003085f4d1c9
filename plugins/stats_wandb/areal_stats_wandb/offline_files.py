"""What an offline W&B run holds before ``wandb sync``: the records of its ``run-<id>.wandb`` files.

``history(RUN_DIR / "wandb")`` gives the run ids and every logged row, to check an offline run (or
one whose upload failed) without a W&B server; the plugin's tests read their runs back with it.
The file is the LevelDB log format (32 KiB blocks of length-prefixed, possibly split chunks) after
a 7-byte ``:W&B`` header; each record is a ``wandb_internal_pb2.Record`` of wandb's own protocol,
decoded with wandb's protobuf classes (wandb 0.2x moved its own reader into its Go core).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
CHUNK_HEADER = struct.Struct("<IHB")  # crc32, length, kind
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic) == (b":W&B", 0xBEE1), f"{path} is not a W&B transaction log"
    pos, pending = 7, b""
    while pos + CHUNK_HEADER.size <= len(data):
        left = BLOCK - pos % BLOCK
        if left < CHUNK_HEADER.size:
            pos += left  # a block's zero-filled tail
            continue
        _crc, length, kind = CHUNK_HEADER.unpack_from(data, pos)
        if kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + CHUNK_HEADER.size : pos + CHUNK_HEADER.size + length], pos + CHUNK_HEADER.size + length
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def history(run_root: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """(run ids, history rows) of every offline run directory under ``run_root``, oldest first;
    a row maps each logged key to its decoded value, ``_step`` included."""
    ids, rows = [], []
    for path in sorted(run_root.glob("offline-run-*/run-*.wandb")):
        for record in records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                ids.append(record.run.run_id)
            elif kind == "history":
                items = record.history.item
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items})
    return ids, rows


def config(run_root: Path) -> dict[str, Any]:
    """The config the first run record carried."""
    for path in sorted(run_root.glob("offline-run-*/run-*.wandb")):
        for record in records(path):
            if record.WhichOneof("record_type") == "run":
                return {item.key: json.loads(item.value_json) for item in record.run.config.update}
    return {}
