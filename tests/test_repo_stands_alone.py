"""The repository stands alone: no product file (code, docs, configs, examples) reads ``../shared``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _is_test_file(path: str) -> bool:
    parts = Path(path).parts
    return "tests" in parts[:-1] or Path(path).name == "conftest.py"


def test_no_product_file_references_the_shared_directory() -> None:
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: run it in a git clone of the repository")
    offenders = []
    for path in filter(None, listed.decode().split("\0")):
        if _is_test_file(path) or not (REPO / path).is_file():
            continue
        if b"../shared" in (REPO / path).read_bytes():
            offenders.append(path)
    assert offenders == [], f"product files referencing ../shared: {offenders}"
    assert not _is_test_file("areal_core/config.py") and _is_test_file("plugins/engine_vllm/tests/test_x.py")
