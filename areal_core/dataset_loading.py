"""Load a split through its registered dataset loader, check the items, fit them to the context."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from areal_core.api.dataset import dataset_key
from areal_core.api.errors import ArealError, ConfigError, PluginError

if TYPE_CHECKING:
    from areal_core.config import DatasetConfig
    from areal_core.plugins import Plugins


def load_dataset(config: DatasetConfig, split: str, plugins: Plugins | None = None) -> list[dict[str, Any]]:
    """Load ``config.name`` through its registered loader and check the items it returns; with
    ``config.repeat`` K, K copies of them under distinct ids (``<id>#<copy>``)."""
    if plugins is None:
        from areal_core.plugins import load_plugins

        plugins = load_plugins()
    items = _call_loader(config, split, plugins)
    seen: set[str] = set()
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not isinstance(item.get("prompt"), str):
            raise PluginError(
                f"dataset {config.name!r} item {i} must be a dict with str 'id' and 'prompt', got {item!r:.120}"
            )
        if item["id"] in seen:
            raise PluginError(f"dataset {config.name!r} repeats item id {item['id']!r}; ids must be unique")
        seen.add(item["id"])
    if config.repeat > 1:
        items = [{**item, "id": f"{item['id']}#{k}"} for k in range(config.repeat) for item in items]
    if not items:
        where = f" in {config.path!r}" if config.path else ""
        key = f"{dataset_key(split)}.{'path' if config.path else 'name'}"
        raise ConfigError(key, f"dataset {config.name!r} has no {split} items{where}")
    return items


def fit_context(
    items: list[dict[str, Any]], tokenizer: Any, context: int, max_new_tokens: int, config: DatasetConfig, split: str
) -> list[dict[str, Any]]:
    """``items`` whose chat-rendered prompt leaves ``max_new_tokens`` room in a ``context``-token window.

    The others are dropped with one warning that counts them (``overlong: drop``) or refused
    (``overlong: error``); a split left empty is always refused.
    """
    import logging

    from areal_core.api.workflow import encode_chat

    def n_tokens(prompt: str) -> int:
        return len(encode_chat(tokenizer, [{"role": "user", "content": prompt}], add_generation_prompt=True))

    budget = context - max_new_tokens
    if budget < 1:  # no prompt can fit: name the setting, not a negative prompt length
        shortest = min(n_tokens(item["prompt"]) for item in items)
        room = f"at most {context - shortest} leaves room for" if shortest < context else "no value fits"
        raise ConfigError(
            "gconfig.max_new_tokens",
            f"{max_new_tokens} alone fills the model's context of {context} tokens; {room} the shortest "
            f"{split} prompt ({shortest} tokens)",
        )
    at_most = _token_bound(tokenizer)  # most prompts fit by far: only the others are tokenized
    kept = [item for item in items if at_most(item["prompt"]) <= budget or n_tokens(item["prompt"]) <= budget]
    dropped = len(items) - len(kept)
    if not dropped:
        return items
    key = f"{dataset_key(split)}.overlong"
    what = (
        f"{dropped} of {len(items)} {split} prompts are longer than {budget} tokens (the model's context of "
        f"{context} minus gconfig.max_new_tokens={max_new_tokens})"
    )
    if config.overlong == "error" or not kept:
        raise ConfigError(key, f"{what}; shorten them, lower gconfig.max_new_tokens, or set {key}=drop")
    logging.getLogger(__name__).warning("%s: %s; dropped them", key, what)
    return kept


def _token_bound(tokenizer: Any) -> Callable[[str], float]:
    """An upper bound on a prompt's chat-rendered token count that tokenizes nothing (rendering the
    template and normalizing cost about a seventh of tokenizing): inf for tokenizers without a
    ``tokenizers`` backend.

    Every token covers at least one byte of the normalized text, except one that a normalizer or
    pre-tokenizer may prepend to each piece between special tokens (Metaspace's "▁"); a piece holds
    at least one byte, so twice the normalized bytes bound the count.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return lambda prompt: math.inf
    normalize = backend.normalizer.normalize_str if backend.normalizer is not None else str

    def bound(prompt: str) -> float:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        return 2 * len(normalize(text).encode()) + 1

    return bound


def _call_loader(config: DatasetConfig, split: str, plugins: Plugins) -> list[dict[str, Any]]:
    """The registered loader's items; a loader that raises or returns no list is named with its plugin."""
    key = f"{dataset_key(split)}.name"
    loader = plugins.get("dataset", config.name)
    reg = plugins.registration("dataset", config.name)
    origin = f"dataset {config.name!r} from plugin {reg.plugin!r} ({reg.distribution})"
    try:
        items = loader(config, split)
    except ArealError:
        raise
    except Exception as exc:  # noqa: BLE001 - a plugin's bug, reported with its name
        raise ConfigError(key, f"{origin} failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(items, list):
        raise ConfigError(key, f"{origin} returned {type(items).__name__}, not a list of items")
    return items
