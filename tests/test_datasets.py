"""Dataset loaders: synthetic tasks (exact, seeded splits) and GSM8K JSONL files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from areal_core.api import hookimpl
from areal_core.config import DatasetConfig, load_config
from areal_core.api.dataset import corpus, reward_data
from areal_core.dataset_loading import load_dataset
from areal_core.builtin.datasets.gsm8k import load_gsm8k
from areal_core.builtin.datasets.synthetic import load_arith, load_reverse, load_word_problems
from areal_core.api.errors import ConfigError, PluginError
from areal_core.plugins import load_plugins
from areal_core.builtin.rewards.synthetic import exact_match

SHARED_GSM8K = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "gsm8k"


def arith(size: int = 0, **options) -> DatasetConfig:
    return DatasetConfig(name="arith", size=size, options=options)


def reverse(size: int = 0, **options) -> DatasetConfig:
    return DatasetConfig(name="reverse", size=size, options=options)


# --------------------------------------------------------------------------- synthetic


def word_problems(size: int = 0, **options) -> DatasetConfig:
    return DatasetConfig(name="word_problems", size=size, options=options)


def test_word_problems_state_their_operands_and_the_answer_follows_from_them():
    import re

    from areal_core.builtin.rewards.math import math_reward

    items = load_word_problems(word_problems(size=60, max_operand=9, valid_size=30), "train")
    valid = load_word_problems(word_problems(size=60, max_operand=9, valid_size=30), "valid")
    assert len(items) == 60 and len(valid) == 30 and not {i["id"] for i in items} & {i["id"] for i in valid}
    for item in items:
        _, kind, *_, x, y = item["id"].split("-")
        numbers = [int(n) for n in re.findall(r"\d+", item["prompt"])]
        expected = {"add": numbers[0] + numbers[1], "sub": numbers[0] - numbers[1], "mul": numbers[0] * numbers[1]}
        assert item["answer"] == str(expected[kind]) and item["prompt"].endswith("Put the final answer in \\boxed{}.")
        assert 2 <= int(x) <= 9 and 2 <= int(y) <= 9
        assert math_reward(item["prompt"], f"So the answer is \\boxed{{{item['answer']}}}.", answer=item["answer"]) == 1.0


def test_word_problems_kinds_and_instruction_are_options_and_bad_kinds_name_the_key():
    items = load_word_problems(word_problems(size=20, kinds=["mul"], instruction=""), "train")
    assert all(i["id"].startswith("word-mul-") and i["prompt"].endswith("in total?") for i in items)
    with pytest.raises(ConfigError, match=r"train_dataset.options.kinds: must be a non-empty list of \['add', 'mul', 'sub'\], got \['div'\]"):
        load_word_problems(word_problems(kinds=["div"]), "train")


def test_arith_default_is_every_pair_of_operands_0_to_4():
    items = load_arith(arith(), "train")
    pairs = {tuple(map(int, item["prompt"].rstrip("=").split("+"))) for item in items}
    assert pairs == {(a, b) for a in range(5) for b in range(5)} and len(items) == 25
    for item in items:
        a, b = map(int, item["prompt"].rstrip("=").split("+"))
        assert item["answer"] == str(a + b) and item["id"] == f"arith-{a}+{b}"


def test_splits_are_deterministic_and_seeded():
    assert load_arith(arith(max_operand=9), "train") == load_arith(arith(max_operand=9), "train")
    assert load_arith(arith(max_operand=9, seed=1), "train") != load_arith(arith(max_operand=9), "train")


def test_valid_defaults_to_the_training_items_and_valid_size_holds_items_out():
    assert load_arith(arith(), "valid") == load_arith(arith(), "train")
    train, valid = load_arith(arith(valid_size=5), "train"), load_arith(arith(valid_size=5), "valid")
    assert len(valid) == 5 and len(train) == 20
    assert not {i["id"] for i in train} & {i["id"] for i in valid}


@settings(max_examples=30, deadline=None)
@given(
    task=st.sampled_from(["arith", "reverse"]),
    high=st.integers(0, 3),
    seed=st.integers(0, 5),
    valid_size=st.integers(0, 4),
    size=st.integers(0, 6),
)
def test_synthetic_items_are_well_formed_and_scored_exactly(task, high, seed, valid_size, size):
    if task == "arith":
        load, total = load_arith, (high + 1) ** 2
        config = arith(size, max_operand=high, seed=seed, valid_size=valid_size)
    else:
        load, total = load_reverse, sum(10**n for n in range(1, high + 2))
        config = reverse(size, max_len=high + 1, seed=seed, valid_size=valid_size)
    assume(valid_size + (size or 1) <= total)
    train, valid = load(config, "train"), load(config, "valid")
    for items in (train, valid):
        assert len({i["id"] for i in items}) == len(items)
        for item in items:
            assert set(item) == {"id", "prompt", "answer"}
            assert exact_match(item["prompt"], item["answer"], **reward_data(item)) == 1.0
            assert exact_match(item["prompt"], item["answer"] + "0", **reward_data(item)) == 0.0
    if size:
        assert len(train) == size
    if valid_size:
        assert len(valid) == valid_size and not {i["id"] for i in train} & {i["id"] for i in valid}


def test_reverse_items():
    items = load_reverse(reverse(min_len=2, max_len=3), "train")
    assert len(items) == 100 + 1000
    for item in items:
        digits = item["prompt"][len("rev ") : -1]
        assert 2 <= len(digits) <= 3 and digits.isdigit() and item["answer"] == digits[::-1]


@pytest.mark.parametrize(
    "config, key, message",
    [
        (arith(size=26), "train_dataset.size", "exceed the 25 distinct"),
        (arith(colour=1), "train_dataset.options.colour", "unknown option"),
        (arith(max_operand="9"), "train_dataset.options.max_operand", "expected int"),
        (arith(min_operand=5, max_operand=4), "train_dataset.options.max_operand", "must be >= min_operand"),
        (arith(valid_size=25), "train_dataset.options.valid_size", "must be in [0, 24]"),
        (reverse(max_len=9), "train_dataset.size", "set a size"),
        (reverse(min_len=0), "train_dataset.options.min_len", "must be >= 1"),
    ],
)
def test_synthetic_config_errors_name_the_key(config, key, message):
    loader = load_arith if config.name == "arith" else load_reverse
    with pytest.raises(ConfigError) as err:
        loader(config, "train")
    assert err.value.key == key and message in str(err.value)


def test_large_reverse_space_samples_the_requested_size():
    items = load_reverse(reverse(size=50, min_len=6, max_len=8), "train")
    assert len(items) == 50 and all(6 <= len(i["answer"]) <= 8 for i in items)


def test_corpus_covers_every_prompt_and_answer_character():
    items = load_arith(arith(max_operand=9), "train")
    alphabet = set("".join(corpus(items)))
    assert alphabet == set("0123456789+=")


# --------------------------------------------------------------------------- gsm8k


def write_jsonl(path: Path, records: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_gsm8k_from_a_file_and_from_a_directory(tmp_path: Path):
    records = [{"question": f"What is {i}+1?", "answer": f"{i}+1={i + 1}\n#### {i + 1}"} for i in range(3)]
    write_jsonl(tmp_path / "train.jsonl", records)
    write_jsonl(tmp_path / "test.jsonl", records[:1])
    items = load_gsm8k(DatasetConfig(name="gsm8k", path=str(tmp_path)), "train")
    assert [i["id"] for i in items] == ["train-1", "train-2", "train-3"]
    assert items[1]["prompt"].startswith("What is 1+1?\n") and "####" in items[1]["prompt"]
    assert items[1]["answer"] == records[1]["answer"]
    assert len(load_gsm8k(DatasetConfig(name="gsm8k", path=str(tmp_path)), "valid")) == 1  # test.jsonl
    one_file = DatasetConfig(name="gsm8k", path=str(tmp_path / "train.jsonl"), size=2)
    assert len(load_gsm8k(one_file, "train")) == 2


def test_gsm8k_custom_instruction(tmp_path: Path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "Q?", "answer": "#### 1"}])
    items = load_gsm8k(DatasetConfig(name="gsm8k", path=str(path), options={"instruction": "Box it."}), "train")
    assert items[0]["prompt"] == "Q?\nBox it."


@pytest.mark.parametrize(
    "lines, message",
    [
        (['{"question": "q", "answer": "#### 1"}', "{not json"], "d.jsonl:2 is not a {question, answer} JSON object"),
        (['{"question": "q"}'], "d.jsonl:1 is not a {question, answer} JSON object (missing field 'answer')"),
        (['["q", "a"]'], "d.jsonl:1 is not a {question, answer} JSON object"),
        (['{"question": "q", "answer": 3}'], "d.jsonl:1: question and answer must be strings"),
    ],
)
def test_gsm8k_bad_lines_are_reported_with_their_number(tmp_path: Path, lines, message):
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError) as err:
        load_gsm8k(DatasetConfig(name="gsm8k", path=str(tmp_path / "d.jsonl")), "train")
    assert err.value.key == "train_dataset.path" and message in str(err.value)


@pytest.mark.parametrize(
    "path, message",
    [("", "set it to a .jsonl file"), ("missing.jsonl", "does not exist"), (".", "holds no train.jsonl")],
)
def test_gsm8k_missing_data_names_the_path_key(tmp_path: Path, monkeypatch, path, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_gsm8k(DatasetConfig(name="gsm8k", path=path), "train")
    assert err.value.key == "train_dataset.path" and message in str(err.value)


@pytest.mark.skipif(not SHARED_GSM8K.is_dir(), reason=f"shared GSM8K data not found at {SHARED_GSM8K}: put the shared/data directory beside the clone, as CI has it")
def test_gsm8k_shared_data_through_the_plugin_registry():
    config = load_config(None, ["train_dataset.name=gsm8k", f"train_dataset.path={SHARED_GSM8K}"])
    train = load_dataset(config.train_dataset, "train", load_plugins(autoload=False))
    valid = load_dataset(config.train_dataset, "valid", load_plugins(autoload=False))
    assert (len(train), len(valid)) == (7473, 1319)


# --------------------------------------------------------------------------- facade


class _BadDatasets:
    """Inline test plugin whose loaders break the item contract."""

    @hookimpl
    def areal_register_datasets(self, register):
        register("no_id", lambda config, split: [{"prompt": "x"}])
        register("dup", lambda config, split: [{"id": "a", "prompt": "x"}, {"id": "a", "prompt": "y"}])
        register("empty", lambda config, split: [])


def test_load_dataset_uses_the_registry_and_checks_items():
    plugins = load_plugins(autoload=False, extra=[("bad-datasets", _BadDatasets())])
    assert len(load_dataset(DatasetConfig(name="arith"), "train", plugins)) == 25
    with pytest.raises(PluginError, match="item 0 must be a dict with str 'id'"):
        load_dataset(DatasetConfig(name="no_id"), "train", plugins)
    with pytest.raises(PluginError, match="repeats item id 'a'"):
        load_dataset(DatasetConfig(name="dup"), "train", plugins)
    with pytest.raises(ConfigError, match="valid_dataset.name: dataset 'empty' has no valid items"):
        load_dataset(DatasetConfig(name="empty"), "valid", plugins)


# --------------------------------------------------------------------------- prompts and the context


def _metaspace_tokenizer():
    """A BPE tokenizer whose normalizer changes lengths (NFKC: "ﬁ" -> "fi", "ﷺ" -> 18 letters) and whose
    pre-tokenizer prepends "▁" to every piece between special tokens, with a chat template."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    tok.train_from_iterator(["a b ab ba aab user says"], trainers.BpeTrainer(special_tokens=["<unk>", "<s>", "</s>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = (
        "{% for m in messages %}<s>{{ m['role'] }} {{ m['content'] }}</s>{% endfor %}"
        "{% if add_generation_prompt %}<s>{% endif %}"
    )
    return fast


PIECES = ["a", "b", "ab", " ", "  ", "é", "ﬁ", "ﷺ", " z", "<s>", "</s>", "z"]
PROMPTS = st.lists(st.sampled_from(PIECES), min_size=1, max_size=30)


@pytest.fixture(scope="module")
def tokenizers_to_fit(tmp_path_factory):
    from transformers import AutoTokenizer

    from areal_core.config import TinyModelSpec
    from areal_core.tiny_model import ensure_tiny_model

    char_level = ensure_tiny_model(TinyModelSpec(), ["".join(PIECES)], tmp_path_factory.mktemp("tiny"), seed=0)
    return [AutoTokenizer.from_pretrained(char_level), _metaspace_tokenizer()]


@settings(max_examples=60, deadline=None)
@given(pieces=st.lists(PROMPTS, min_size=1, max_size=6), budget=st.integers(1, 150), which=st.integers(0, 1))
@example(pieces=[["ﷺ"] * 8, ["a"]], budget=100, which=1)  # 149 tokens, 39 bytes before NFKC
def test_fitting_prompts_keeps_exactly_those_whose_tokens_fit(tokenizers_to_fit, pieces, budget, which):
    """Whatever the budget: prompts kept on the bound without tokenizing (most, on real data sets) are
    the ones tokenizing keeps."""
    from areal_core.api.workflow import encode_chat
    from areal_core.dataset_loading import fit_context

    tokenizer = tokenizers_to_fit[which]
    items = [{"id": str(i), "prompt": "".join(p)} for i, p in enumerate(pieces)]
    lengths = [len(encode_chat(tokenizer, [{"role": "user", "content": i["prompt"]}], add_generation_prompt=True))
               for i in items]  # fmt: skip
    try:
        kept = fit_context(items, tokenizer, budget + 1, 1, DatasetConfig(name="arith"), "train")
    except ConfigError:  # nothing left: refused
        kept = []
    assert [i["id"] for i in kept] == [i["id"] for i, n in zip(items, lengths) if n <= budget]


def test_prompts_longer_than_the_context_are_dropped_or_refused(tmp_path, caplog):
    from transformers import AutoTokenizer

    from areal_core.config import TinyModelSpec
    from areal_core.dataset_loading import fit_context
    from areal_core.api.workflow import encode_chat
    from areal_core.tiny_model import ensure_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny_model(TinyModelSpec(), ["1+2=3 "], tmp_path, seed=0))
    items = [{"id": str(n), "prompt": "1+" * n + "2="} for n in (1, 20, 2, 40)]
    short = len(encode_chat(tokenizer, [{"role": "user", "content": "1+1+2="}], add_generation_prompt=True))
    drop = DatasetConfig(name="arith")
    with caplog.at_level("WARNING"):
        kept = fit_context(items, tokenizer, context=short + 4, max_new_tokens=4, config=drop, split="train")
    assert [item["id"] for item in kept] == ["1", "2"]
    assert "train_dataset.overlong: 2 of 4 train prompts are longer than" in caplog.text
    assert fit_context(items, tokenizer, context=10_000, max_new_tokens=4, config=drop, split="train") is items
    with pytest.raises(ConfigError, match=r"^valid_dataset.overlong: 2 of 4 valid prompts are longer than \d+ tokens"):
        fit_context(items, tokenizer, short + 4, 4, DatasetConfig(name="arith", overlong="error"), "valid")
    with pytest.raises(ConfigError, match="4 of 4 train prompts"):  # nothing left: refused whatever the policy
        fit_context(items, tokenizer, 5, 4, drop, "train")
    # max_new_tokens alone fills the context: the message names it and the largest value that fits
    with pytest.raises(ConfigError) as err:
        fit_context(items, tokenizer, short + 4, 100_000, drop, "train")
    shortest = short - 2  # "1+2=" is two tokens shorter than "1+1+2="
    assert str(err.value) == (
        f"gconfig.max_new_tokens: 100000 alone fills the model's context of {short + 4} tokens; at most "
        f"{short + 4 - shortest} leaves room for the shortest train prompt ({shortest} tokens)"
    )
    with pytest.raises(ConfigError, match="; no value fits the shortest train prompt"):
        fit_context(items, tokenizer, 4, 4, drop, "train")
