"""Tiny models for CPU runs and tests: a character tokenizer trained locally and a random Qwen3.

Nothing is downloaded. ``ensure_tiny_model`` builds both once and caches them as a normal
Hugging Face directory, so servers and trainers load it like any other model path.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from areal_core.config import TinyModelSpec

PAD, EOS = "<pad>", "<eos>"
#: The chat template keeps prompts raw: a tiny model learns the task, not a conversation format.
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def build_char_tokenizer(corpus: list[str]):
    """Train a character-level ``tokenizers`` model on ``corpus``; returns a HF fast tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()  # characters join back without spaces
    trainer = trainers.WordLevelTrainer(special_tokens=[PAD, EOS], min_frequency=1)
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_qwen3(spec: TinyModelSpec, vocab_size: int, *, pad_id: int, eos_id: int, seed: int):
    """A randomly initialised Qwen3 causal LM with tied embeddings."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=eos_id,
        torch_dtype="float32",
        initializer_range=spec.initializer_range,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen3ForCausalLM(cfg)


def ensure_tiny_model(spec: TinyModelSpec, corpus: list[str], cache_root: str | os.PathLike, seed: int) -> Path:
    """Build (once) and return a HF directory holding the tiny model and its tokenizer.

    The directory name hashes the spec, the corpus alphabet and the seed, so a change of any of
    them builds a new model instead of silently reusing an old one. Written to a temp dir and
    renamed, so a crash never leaves a half-written model.
    """
    alphabet = "".join(sorted(set("".join(corpus))))
    key = json.dumps([sorted(vars_of(spec).items()), alphabet, seed])
    out = Path(cache_root) / f"tiny-qwen3-{hashlib.sha1(key.encode()).hexdigest()[:10]}"
    if (out / "config.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-tiny-", dir=out.parent))
    try:
        tokenizer = build_char_tokenizer([alphabet])
        model = build_tiny_qwen3(
            spec, len(tokenizer), pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id, seed=seed
        )
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        with _no_progress_bars():  # save_pretrained draws a "Writing model shards" bar
            model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.rename(tmp, out)
        except OSError:  # another process built it first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    """Transformers' tqdm bars off for the block (they are process-wide), then as they were."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def vars_of(spec: TinyModelSpec) -> dict[str, float]:
    """The spec's fields, the default ``initializer_range`` left out (so models built before it
    existed keep their cache directory)."""
    import attrs

    fields = attrs.asdict(spec)
    if fields["initializer_range"] == attrs.fields(TinyModelSpec).initializer_range.default:
        del fields["initializer_range"]
    return fields
