"""The import contracts of pyproject.toml ([tool.importlinter]) hold, stay complete, and catch a break."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter", reason="import-linter is not installed: pip install -e '.[test]'")
tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli", reason="pip install -e '.[test]'")

REPO = Path(__file__).resolve().parents[1]
PLUGIN_DIRS = sorted(p for p in (REPO / "plugins").iterdir() if (p / "pyproject.toml").exists())


def _contracts() -> dict[str, dict]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {contract["id"]: contract for contract in config["contracts"]}


def _lint(config: Path, *paths: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, paths))}
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run(
        [sys.executable, "-c", code, "--no-cache", "--no-logo", "--config", str(config)],
        capture_output=True, text=True, timeout=120, env=env, cwd=config.parent,
    )  # fmt: skip


def test_contracts_hold():
    result = _lint(REPO / "pyproject.toml", REPO, *PLUGIN_DIRS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 5 kept, 0 broken." in result.stdout


def test_forbidden_lists_name_every_part_of_areal_core_but_the_api():
    parts = {
        f"areal_core.{p.stem}" for p in (REPO / "areal_core").iterdir()
        if (p.suffix == ".py" or (p / "__init__.py").exists()) and p.stem != "__init__"
    }  # fmt: skip
    contracts = _contracts()
    assert set(contracts["plugins"]["forbidden_modules"]) == parts - {"areal_core.api", "areal_core.testing"}
    assert set(contracts["builtins"]["forbidden_modules"]) == parts - {"areal_core.api", "areal_core.testing", "areal_core.builtin"}
    assert {f"areal_{p.name}" for p in PLUGIN_DIRS} == set(contracts["plugins"]["source_modules"])


def test_a_plugin_importing_core_internals_breaks_the_contract(tmp_path):
    """A plugin that imports the trainer is caught, with the import named."""
    package = tmp_path / "site" / "areal_engine_rogue"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from areal_core.api import hookimpl\n")
    (package / "client.py").write_text("from areal_core.trainer import Trainer\n")
    contract = _contracts()["plugins"]
    forbidden = ", ".join(f'"{m}"' for m in contract["forbidden_modules"])
    config = tmp_path / "pyproject.toml"
    config.write_text(
        '[tool.importlinter]\nroot_packages = ["areal_core", "areal_engine_rogue"]\n\n'
        f'[[tool.importlinter.contracts]]\nname = "{contract["name"]}"\ntype = "forbidden"\n'
        f'source_modules = ["areal_engine_rogue"]\nallow_indirect_imports = true\nforbidden_modules = [{forbidden}]\n'
    )
    result = _lint(config, REPO, tmp_path / "site")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "areal_engine_rogue is not allowed to import areal_core.trainer" in result.stdout
    assert "areal_engine_rogue.client -> areal_core.trainer" in result.stdout
