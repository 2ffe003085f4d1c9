"""GSM8K-style records ``{"question": ..., "answer": ...}`` from JSONL, parquet or the HF hub.

``path`` is one of:

- a ``.jsonl`` or ``.parquet`` file;
- a directory holding ``{split}.jsonl`` or ``{split}.parquet`` (``valid`` falls back to ``test``),
  or the hub layout ``main/{split}-*.parquet``;
- a hub dataset id such as ``openai/gsm8k`` (when no such local path exists), fetched with
  ``huggingface_hub`` into its cache; offline, the cached copy is used.

Parquet needs ``pyarrow``. Items keep the whole gold solution as ``answer``;
:func:`areal_core.builtin.rewards.math.math_reward` extracts its ``#### N``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from areal_core.api import DatasetConfig
from areal_core.api.dataset import dataset_key, dataset_options
from areal_core.api.errors import ConfigError
from areal_core.api.hub import is_hub_id, snapshot

INSTRUCTION = "Solve step by step, then give the final answer on a last line as '#### <answer>'."
_STEMS = {"train": ("train",), "valid": ("valid", "test")}
_HUB_FILES = ("main/*.parquet",)  # the GSM8K hub layout: main/{train,test}-00000-of-00001.parquet


def _find_in_dir(directory: Path, split: str, key: str) -> Path:
    for stem in _STEMS[split]:
        for candidate in (directory / f"{stem}.jsonl", directory / f"{stem}.parquet"):
            if candidate.is_file():
                return candidate
        shards = sorted(directory.glob(f"main/{stem}-*.parquet"))
        if shards:
            return shards[0]
    wanted = " or ".join(f"{stem}.jsonl" for stem in _STEMS[split])
    raise ConfigError(key, f"{str(directory)!r} holds no {wanted} (or .parquet); point it at a JSONL or parquet file")


def _resolve(config: DatasetConfig, split: str) -> Path:
    key = f"{dataset_key(split)}.path"
    if not config.path:
        raise ConfigError(
            key,
            f"dataset {config.name!r} reads JSONL/parquet or a hub id; set it to a .jsonl file, a directory "
            f"with {split}.jsonl, or openai/gsm8k",
        )
    path = Path(config.path)
    if is_hub_id(config.path):
        path = snapshot(config.path, key, "dataset", list(_HUB_FILES))
    if path.is_dir():
        return _find_in_dir(path, split, key)
    if not path.is_file():
        raise ConfigError(key, f"{str(path)!r} does not exist; give a .jsonl file or a directory with {split}.jsonl")
    return path


def _jsonl_records(path: Path, key: str) -> Iterator[tuple[int, Any]]:
    """Records of a UTF-8 JSONL file (a leading BOM is skipped); other encodings name file:line."""
    with path.open("rb") as lines:
        for lineno, raw in enumerate(lines, 1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise ConfigError(
                    key, f"{path}:{lineno} is not UTF-8 (byte {raw[exc.start]:#04x} at column {exc.start + 1}); "
                    "save the file as UTF-8"
                ) from None  # fmt: skip
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(key, f"{path}:{lineno} is not a {{question, answer}} JSON object ({exc})") from None


def _parquet_records(path: Path, key: str) -> Iterator[tuple[int, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(key, f"{path} is parquet, which needs pyarrow; pip install pyarrow (or use JSONL)") from None
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as exc:  # noqa: BLE001 - a corrupt or non-parquet file
        raise ConfigError(key, f"{path} is not a readable parquet file ({type(exc).__name__}: {exc})") from None
    yield from enumerate(rows, 1)


def load_gsm8k(config: DatasetConfig, split: str) -> list[dict[str, str]]:
    """Items ``{"id", "prompt": question + instruction, "answer": gold solution}``.

    ``size`` > 0 keeps the first ``size`` items; ``options.instruction`` replaces :data:`INSTRUCTION`.
    """
    opts = dataset_options(config, split, {"instruction": INSTRUCTION})
    path = _resolve(config, split)
    key = f"{dataset_key(split)}.path"
    records = _parquet_records(path, key) if path.suffix == ".parquet" else _jsonl_records(path, key)
    items = []
    for number, record in records:
        try:
            question, answer = record["question"], record["answer"]
        except (TypeError, KeyError) as exc:
            reason = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise ConfigError(key, f"{path}:{number} is not a {{question, answer}} JSON object ({reason})") from None
        if not isinstance(question, str) or not isinstance(answer, str):
            raise ConfigError(key, f"{path}:{number}: question and answer must be strings")
        prompt = f"{question}\n{opts['instruction']}"
        items.append({"id": f"{path.stem}-{number}", "prompt": prompt, "answer": answer})
        if len(items) == config.size:
            break
    return items
