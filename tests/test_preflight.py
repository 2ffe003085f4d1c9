"""`areal config` catches bad input before anything starts: one line naming the key, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areal_core.cli import main
from areal_core.config import load_config
from areal_core.api.errors import ArealError, ConfigError, PluginError
from areal_core.resolve import resolve_config


def _config(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str]:
    """``areal config ARGS`` in this process: (exit code, stderr)."""
    rc = main(["config", *args])
    out, err = capsys.readouterr()
    if rc != 0:
        assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("areal: error: "), err
    return rc, err


def _fails(capsys: pytest.CaptureFixture, *args: str) -> str:
    rc, err = _config(capsys, *args)
    assert rc == 2, err
    return err.strip().removeprefix("areal: error: ")


# --------------------------------------------------------------------------- engine_args (BAD 5)


@pytest.mark.parametrize(
    ("engine_args", "message"),
    [
        ("{max_batch_size: 0}", "rollout.engine_args.max_batch_size: 'max_batch_size' must be >= 1: 0"),
        ("{max_batch_size: two}", "rollout.engine_args.max_batch_size: expected an integer, got 'two'"),
        ("{group_timeout: 0}", "rollout.engine_args.group_timeout: 'group_timeout' must be > 0: 0.0"),
        ("{max_batch: 2}", "rollout.engine_args.max_batch: unknown key; did you mean 'rollout.engine_args.max_batch_size'?"),
    ],
)
def test_hf_engine_args_are_checked_at_config_time(capsys, engine_args: str, message: str) -> None:
    assert _fails(capsys, f"rollout.engine_args={engine_args}") == message


def test_vllm_engine_args_pass_through(capsys) -> None:
    pytest.importorskip("areal_engine_vllm", reason="plugins/engine_vllm is not installed: pip install -e plugins/engine_vllm")
    rc, err = _config(capsys, "rollout.engine=vllm", "rollout.engine_args={max-num-seqs: 4, any-flag: true}")
    assert rc == 0, err


# --------------------------------------------------------------------------- generation


def test_an_empty_stop_string_is_refused(capsys) -> None:
    assert _fails(capsys, "gconfig.stop=['']").startswith("gconfig.stop[0]: empty stop string")


@pytest.mark.parametrize("seed", ["99999999999999999999999", "-1"])
def test_a_seed_out_of_range_is_refused(capsys, seed: str) -> None:
    assert _fails(capsys, f"seed={seed}").startswith("seed: must be ")


# --------------------------------------------------------------------------- model.path


def test_model_path_must_be_a_model_directory(capsys, tmp_path: Path) -> None:
    file = tmp_path / "model.bin"
    file.write_text("x")
    assert _fails(capsys, f"model.path={file}") == f"model.path: {str(file)!r} is a file; give a Hugging Face model directory"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _fails(capsys, f"model.path={empty}").startswith(f"model.path: {str(empty)!r} has no config.json")
    (empty / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    message = _fails(capsys, f"model.path={empty}")
    assert message.startswith(f"model.path: {str(empty)!r} has no tokenizer") and "sentencepiece" not in message


# --------------------------------------------------------------------------- fileroot


def test_fileroot_that_is_a_file_or_not_writable(capsys, tmp_path: Path) -> None:
    file = tmp_path / "runs"
    file.write_text("x")
    assert _fails(capsys, f"fileroot={file}") == f"fileroot: {str(file)!r} is a file, not a directory"
    assert _fails(capsys, f"fileroot={file}/sub").startswith(f"fileroot: {str(file)!r} is a file")
    assert _fails(capsys, "fileroot=/proc/areal-runs").startswith("fileroot: cannot create directories in '/proc'")
    assert list(tmp_path.iterdir()) == [file]  # nothing written


def test_fileroot_read_only_for_a_normal_user(capsys, tmp_path: Path) -> None:
    import os

    if os.geteuid() == 0:
        pytest.skip("root writes to read-only directories (run as another user to check it); /proc covers the unwritable case")
    root = tmp_path / "ro"
    root.mkdir(mode=0o500)
    assert _fails(capsys, f"fileroot={root}/runs").startswith(f"fileroot: cannot create directories in {str(root)!r}")


# --------------------------------------------------------------------------- datasets


def _gsm8k(path: Path) -> list[str]:
    return ["train_dataset.name=gsm8k", f"train_dataset.path={path}", "train_dataset.batch_size=1"]


def test_jsonl_in_utf8_with_or_without_bom_loads(capsys, tmp_path: Path) -> None:
    row = json.dumps({"question": "Zoë has 2 apples; 1 more?", "answer": "#### 3"}, ensure_ascii=False) + "\n"
    for name, data in (("plain.jsonl", row.encode()), ("bom.jsonl", b"\xef\xbb\xbf" + row.encode())):
        (tmp_path / name).write_bytes(data)
        rc, err = _config(capsys, *_gsm8k(tmp_path / name))
        assert rc == 0, err


def test_latin1_jsonl_names_file_line_and_encoding(capsys, tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    rows = [{"question": "q", "answer": "#### 1"}, {"question": "Zoë?", "answer": "#### 2"}]
    path.write_bytes("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("latin-1"))
    message = _fails(capsys, *_gsm8k(path))
    assert message.startswith(f"train_dataset.path: {path}:2 is not UTF-8")


def test_an_empty_dataset_file_blames_the_path(capsys, tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text("\n")
    message = _fails(capsys, *_gsm8k(path))
    assert message.startswith("train_dataset.path: ") and str(path) in message and "no train items" in message


def test_batch_size_larger_than_the_dataset_is_refused(capsys) -> None:
    message = _fails(capsys, "train_dataset.size=4", "train_dataset.batch_size=8")
    assert message.startswith("train_dataset.batch_size: 8 prompts per step, but the train dataset has 4 items")
    assert message.endswith("or repeat each item: train_dataset.repeat=2")
    message = _fails(capsys, "train_dataset.size=3", "train_dataset.repeat=2", "train_dataset.batch_size=8")
    assert message.endswith("has 6 items (a step would take some twice); lower it, use more data, or repeat each "
                            "item: train_dataset.repeat=3")


def test_a_repeated_dataset_takes_a_batch_larger_than_its_items() -> None:
    from areal_core.plugins import load_plugins
    from areal_core.preflight import datasets

    config = load_config(None, ["train_dataset.size=4", "train_dataset.repeat=2", "train_dataset.batch_size=8"])
    train = datasets(config, load_plugins())["train"]
    assert len(train) == 8 and len({item["id"] for item in train}) == 8
    assert [item["prompt"] for item in train[:4]] == [item["prompt"] for item in train[4:]]
    assert {item["id"].rsplit("#", 1)[1] for item in train} == {"0", "1"}


def test_a_hub_dataset_is_not_fetched_by_areal_config(capsys, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.chdir(tmp_path)
    rc, err = _config(capsys, "train_dataset.name=gsm8k", "train_dataset.path=openai/gsm8k")
    assert rc == 0 and "train_dataset.path: 'openai/gsm8k' is fetched from the hub when the run loads data" in err


# --------------------------------------------------------------------------- plugins


def _plugin_config(areal_plugins, **hooks):
    areal_plugins.add_hooks("areal-test-plugin", **hooks)
    return areal_plugins.load(autoload=True)


@pytest.mark.parametrize(
    ("loader", "message"),
    [
        (lambda config, split: None, "returned NoneType, not a list of items"),
        (lambda config, split: 1 / 0, "failed: ZeroDivisionError: division by zero"),
    ],
)
def test_a_broken_plugin_dataset_names_the_plugin(areal_plugins, loader, message: str) -> None:
    plugins = _plugin_config(areal_plugins, areal_register_datasets=lambda register: register("broken", loader))
    from areal_core.preflight import preflight

    config, _ = resolve_config(load_config(None, ["train_dataset.name=broken"]), plugins)
    with pytest.raises(ArealError) as err:
        preflight(config, plugins)
    assert str(err.value).startswith("train_dataset.name: dataset 'broken' from plugin 'areal-test-plugin' (<inline>)")
    assert message in str(err.value)


def test_areal_configure_raising_names_the_plugin(areal_plugins) -> None:
    def configure(config):
        raise RuntimeError("needs a GPU")

    plugins = _plugin_config(areal_plugins, areal_configure=configure)
    with pytest.raises(PluginError) as err:
        resolve_config(load_config(None, []), plugins)
    assert str(err.value) == "plugin 'areal-test-plugin' (<inline>) failed in areal_configure: RuntimeError: needs a GPU"


# --------------------------------------------------------------------------- misleading messages


def test_a_config_path_that_is_a_directory_says_so(capsys, tmp_path: Path) -> None:
    assert _fails(capsys, str(tmp_path)) == f"config file {str(tmp_path)!r} is a directory; give a YAML file"


def test_a_plugin_filtered_out_by_areal_plugins_says_so(capsys, monkeypatch) -> None:
    pytest.importorskip("areal_engine_vllm", reason="plugins/engine_vllm is not installed: pip install -e plugins/engine_vllm")
    monkeypatch.setenv("AREAL_PLUGINS", "reshard_disk")
    assert _fails(capsys, "rollout.engine=vllm") == (
        "rollout.engine: engine 'vllm' is installed (plugin 'engine_vllm' from areal-engine-vllm) but "
        "AREAL_PLUGINS=reshard_disk filters it out; add engine_vllm to AREAL_PLUGINS"
    )


def test_names_not_installed_say_what_to_install(areal_plugins) -> None:
    with pytest.raises(ConfigError, match="engine 'nope' is not installed"):
        resolve_config(load_config(None, ["rollout.engine=nope"]), areal_plugins.load())
    with pytest.raises(ConfigError, match="engine 'sglang' is not installed; pip install areal-engine-sglang"):
        resolve_config(load_config(None, ["rollout.engine=sglang"]), areal_plugins.load(autoload=False))
