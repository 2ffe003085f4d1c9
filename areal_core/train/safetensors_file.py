"""Write a safetensors file from host tensors, reusing the file's pages when it exists.

``safetensors.torch.save_file`` serialises every tensor into one bytes object, then creates the
file anew. A weight update that publishes a model each step (the ``disk`` path) then copies the
weights twice and makes the kernel free the old file's pages and allocate new ones, which cost
more than the bytes. :func:`write_safetensors` writes the same format straight from the tensors'
memory into the existing file (truncated only to the new length), so a file rewritten with the
same shapes costs one copy into pages that are already there. Readers are ``safetensors``' own.

Format: an 8-byte little-endian header length, the JSON header (``name -> {dtype, shape,
data_offsets}`` and optional ``__metadata__``, padded with spaces to 8 bytes), then the tensors'
bytes back to back. Tensors are laid out by element size, largest first, so each starts aligned
to its dtype (the data section starts 8-aligned).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping

import torch

_DTYPE_CODES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}  # fmt: skip


def write_safetensors(tensors: Mapping[str, torch.Tensor], path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """Write ``tensors`` (on the host) to ``path`` in the safetensors format, overwriting an
    existing file in place. Not atomic: write into a directory readers do not look at yet."""
    order = sorted(tensors.items(), key=lambda item: -item[1].element_size())  # stable: names keep their order
    header: dict[str, object] = {}
    offset = 0
    for name, tensor in order:
        if tensor.dtype not in _DTYPE_CODES:
            raise ValueError(f"{name}: dtype {tensor.dtype} has no safetensors code; cast it to one of {sorted(map(str, _DTYPE_CODES))}")
        if tensor.device.type != "cpu":
            raise ValueError(f"{name}: on {tensor.device}; move it to the host first")
        nbytes = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _DTYPE_CODES[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    if metadata:
        header["__metadata__"] = metadata
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)  # no O_TRUNC: the pages already there are reused
    with os.fdopen(fd, "wb") as out:
        out.write(struct.pack("<Q", len(encoded)))
        out.write(encoded)
        for _, tensor in order:
            if tensor.numel():
                out.write(memoryview(tensor.detach().contiguous().view(-1).view(torch.uint8).numpy()))
        out.truncate()
