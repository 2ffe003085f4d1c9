"""Fixtures for the npu platform tests: the FAKE torch_npu and a simulated Ascend host."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

FAKE_DIR = Path(__file__).parent / "fake_npu"  # holds the FAKE torch_npu package


@pytest.fixture
def fake_npu_env(tmp_path: Path) -> dict[str, str]:
    """Environment for a subprocess that finds the FAKE torch_npu and records importing it."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(FAKE_DIR), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "FAKE_TORCH_NPU_IMPORT_MARKER": str(tmp_path / "torch_npu_imported"),
    }


@pytest.fixture
def simulated_ascend_host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """This process looks like an Ascend host to the probes: torch_npu findable (the FAKE one, not
    imported), CANN's environment set, eight davinci device nodes (files in a temp /dev)."""
    from areal_platform_npu import platform as npu_platform

    dev = tmp_path / "dev"
    dev.mkdir()
    for name in [*(f"davinci{i}" for i in range(8)), "davinci_manager", "devmm_svm"]:
        (dev / name).touch()
    monkeypatch.setattr(npu_platform, "DEVICE_GLOB", str(dev / "davinci[0-9]*"))
    monkeypatch.setenv("ASCEND_HOME_PATH", str(tmp_path / "Ascend" / "ascend-toolkit" / "latest"))
    monkeypatch.syspath_prepend(str(FAKE_DIR))
    assert "torch_npu" not in sys.modules
    return dev
