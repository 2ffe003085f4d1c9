"""GSM8K-style JSONL: one ``{"question": ..., "answer": ...}`` object a line.

``path`` is a file, or a directory holding ``{split}.jsonl`` (``valid`` falls back to ``test.jsonl``).
Items keep the whole gold solution as ``answer``; :func:`areal_core.rewards.math.math_reward`
extracts its ``#### N``.
"""

from __future__ import annotations

import json
from pathlib import Path

from areal_core.config import DatasetConfig
from areal_core.datasets import dataset_key, dataset_options
from areal_core.errors import ConfigError

INSTRUCTION = "Solve step by step, then give the final answer on a last line as '#### <answer>'."
_FILES = {"train": ("train.jsonl",), "valid": ("valid.jsonl", "test.jsonl")}


def _resolve(config: DatasetConfig, split: str) -> Path:
    key = f"{dataset_key(split)}.path"
    if not config.path:
        raise ConfigError(
            key, f"dataset {config.name!r} reads JSONL; set it to a .jsonl file or a directory with {split}.jsonl"
        )
    path = Path(config.path)
    if path.is_dir():
        for name in _FILES[split]:
            if (path / name).is_file():
                return path / name
        raise ConfigError(key, f"{str(path)!r} holds no {' or '.join(_FILES[split])}; point it at a JSONL file")
    if not path.is_file():
        raise ConfigError(key, f"{str(path)!r} does not exist; give a .jsonl file or a directory with {split}.jsonl")
    return path


def load_gsm8k(config: DatasetConfig, split: str) -> list[dict[str, str]]:
    """Items ``{"id", "prompt": question + instruction, "answer": gold solution}``.

    ``size`` > 0 keeps the first ``size`` items; ``options.instruction`` replaces :data:`INSTRUCTION`.
    """
    opts = dataset_options(config, split, {"instruction": INSTRUCTION})
    path = _resolve(config, split)
    key = f"{dataset_key(split)}.path"
    items = []
    with path.open(encoding="utf-8") as lines:
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                question, answer = record["question"], record["answer"]
            except (json.JSONDecodeError, TypeError, KeyError) as exc:
                reason = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
                raise ConfigError(
                    key, f"{path}:{lineno} is not a {{question, answer}} JSON object ({reason})"
                ) from None
            if not isinstance(question, str) or not isinstance(answer, str):
                raise ConfigError(key, f"{path}:{lineno}: question and answer must be strings")
            prompt = f"{question}\n{opts['instruction']}"
            items.append({"id": f"{path.stem}-{lineno}", "prompt": prompt, "answer": answer})
            if len(items) == config.size:
                break
    return items
