"""Hub ids in place of local paths: accepted by config checks, resolved (or one clear line) at run time."""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_core.config import load_config
from areal_core.api.errors import ConfigError
from areal_core.api.hub import is_hub_id, snapshot


@pytest.mark.parametrize(
    ("value", "expected"),
    [("Qwen/Qwen3-0.6B", True), ("openai/gsm8k", True), ("./models/x", False), ("/abs/path", False),
     ("a/b/c", False), ("plain", False), ("", False)],
)  # fmt: skip
def test_hub_id_shape(value: str, expected: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert is_hub_id(value) is expected


def test_an_existing_local_path_is_never_a_hub_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "Qwen" / "Qwen3-0.6B").mkdir(parents=True)
    assert not is_hub_id("Qwen/Qwen3-0.6B")


def test_config_accepts_a_model_hub_id_but_not_a_missing_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_config(None, ["model.path=Qwen/Qwen3-0.6B"]).model.path == "Qwen/Qwen3-0.6B"
    with pytest.raises(ConfigError, match="model.path: './models/missing' does not exist"):
        load_config(None, ["model.path=./models/missing"])


def test_an_unreachable_uncached_hub_id_is_one_line_naming_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(ConfigError) as err:
        snapshot("Qwen/Qwen3-0.6B", "model.path")
    message = str(err.value)
    assert message.startswith("model.path: 'Qwen/Qwen3-0.6B' is no local path and could not be fetched from the hub (")
    assert "\n" not in message
