"""Synthetic verifiable tasks for CPU runs: ``arith`` ("3+4=" -> "7") and ``reverse`` ("rev 123=" -> "321").

Every task is a finite space of items numbered ``0..total-1``; a split is a seeded sample of that
space. ``options.valid_size`` items are held out for ``valid``; with the default 0, ``valid`` is the
training set itself (these tasks are small enough that accuracy on them is the measure).
"""

from __future__ import annotations

import random
from typing import Any

from areal_core.api import DatasetConfig
from areal_core.api.dataset import dataset_key, dataset_options
from areal_core.api.errors import ConfigError

#: ``size: 0`` (all items) is refused above this many, so a typo cannot build millions of items.
MAX_ENUMERATED = 100_000


def _select(total: int, config: DatasetConfig, split: str, opts: dict[str, Any]) -> list[int]:
    """Indices of the items in ``split``: held-out ``valid`` first, then ``size`` for training."""
    key, valid_size = dataset_key(split), opts["valid_size"]
    if valid_size < 0 or valid_size >= total:
        raise ConfigError(f"{key}.options.valid_size", f"must be in [0, {total - 1}] for this task, got {valid_size}")
    if config.size == 0 and total > MAX_ENUMERATED:
        raise ConfigError(f"{key}.size", f"0 means all {total} {config.name} items; set a size <= {MAX_ENUMERATED}")
    n_train = config.size or total - valid_size
    if valid_size + n_train > total:
        raise ConfigError(
            f"{key}.size",
            f"{config.size} items (+{valid_size} held out) exceed the {total} distinct {config.name} items; "
            "lower it or widen the task options",
        )
    order = random.Random(opts["seed"]).sample(range(total), valid_size + n_train)
    return order[:valid_size] if split == "valid" and valid_size else order[valid_size:]


def _require(ok: bool, split: str, option: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{dataset_key(split)}.options.{option}", message)


def load_arith(config: DatasetConfig, split: str) -> list[dict[str, str]]:
    """Additions ``a+b=`` with operands in ``[min_operand, max_operand]``; answer is the sum."""
    opts = dataset_options(config, split, {"min_operand": 0, "max_operand": 4, "seed": 0, "valid_size": 0})
    low, high = opts["min_operand"], opts["max_operand"]
    _require(low >= 0, split, "min_operand", f"must be >= 0, got {low}")
    _require(high >= low, split, "max_operand", f"must be >= min_operand ({low}), got {high}")
    width = high - low + 1

    def item(i: int) -> dict[str, str]:
        a, b = (low + x for x in divmod(i, width))
        return {"id": f"arith-{a}+{b}", "prompt": f"{a}+{b}=", "answer": str(a + b)}

    return [item(i) for i in _select(width * width, config, split, opts)]


def load_reverse(config: DatasetConfig, split: str) -> list[dict[str, str]]:
    """Digit strings of length ``[min_len, max_len]`` (uniform over all of them) to write backwards."""
    opts = dataset_options(config, split, {"min_len": 1, "max_len": 3, "seed": 0, "valid_size": 0})
    low, high = opts["min_len"], opts["max_len"]
    _require(low >= 1, split, "min_len", f"must be >= 1, got {low}")
    _require(high >= low, split, "max_len", f"must be >= min_len ({low}), got {high}")
    counts = [10**n for n in range(low, high + 1)]

    def item(i: int) -> dict[str, str]:
        length = low
        for count in counts:
            if i < count:
                break
            i -= count
            length += 1
        digits = str(i).zfill(length)
        return {"id": f"reverse-{digits}", "prompt": f"rev {digits}=", "answer": digits[::-1]}

    return [item(i) for i in _select(sum(counts), config, split, opts)]


_NAMES = ("Tom", "Anna", "Ben", "Lily", "Sam", "Mia", "Max", "Zoe")
_THINGS = ("apples", "pencils", "stickers", "marbles", "cookies", "books", "cards", "shells")
#: One-step word problems: (kind, question template, answer). ``x`` and ``y`` are the operands.
_WORD_KINDS = {
    "add": ("{n} has {x} {t} and buys {y} more. How many {t} does {n} have now?", lambda x, y: x + y),
    "sub": ("{n} has {s} {t} and gives {y} of them away. How many {t} does {n} have left?", lambda x, y: x),
    "mul": ("{n} has {x} boxes with {y} {t} in each box. How many {t} does {n} have in total?", lambda x, y: x * y),
}
WORD_INSTRUCTION = "Put the final answer in \\boxed{}."


def load_word_problems(config: DatasetConfig, split: str) -> list[dict[str, str]]:
    """One-step word problems in English ("Tom has 7 apples and buys 12 more. How many ...?") of
    the ``kinds`` add, sub (a difference ``(x + y) - y``) and mul, operands in ``[2, max_operand]``,
    each prompt ending with ``instruction``; the answer is the number."""
    opts = dataset_options(
        config, split,
        {"kinds": ["add", "sub", "mul"], "max_operand": 20, "instruction": WORD_INSTRUCTION, "seed": 0, "valid_size": 0},
    )  # fmt: skip
    kinds, high = list(opts["kinds"]), opts["max_operand"]
    unknown = sorted(set(kinds) - set(_WORD_KINDS))
    _require(bool(kinds) and not unknown, split, "kinds", f"must be a non-empty list of {sorted(_WORD_KINDS)}, got {kinds}")
    _require(high >= 2, split, "max_operand", f"must be >= 2, got {high}")
    width = high - 1  # operands 2..high
    per_kind = len(_NAMES) * len(_THINGS) * width * width

    def item(i: int) -> dict[str, str]:
        kind, i = kinds[i // per_kind], i % per_kind
        i, x = divmod(i, width)
        i, y = divmod(i, width)
        name, thing = _NAMES[i // len(_THINGS)], _THINGS[i % len(_THINGS)]
        x, y = x + 2, y + 2
        template, answer = _WORD_KINDS[kind]
        question = template.format(n=name, t=thing, x=x, y=y, s=x + y)
        prompt = f"{question} {opts['instruction']}".strip()
        return {"id": f"word-{kind}-{name}-{thing}-{x}-{y}", "prompt": prompt, "answer": str(answer(x, y))}

    return [item(i) for i in _select(per_kind * len(kinds), config, split, opts)]
