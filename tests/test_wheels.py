"""From built wheels alone: every distribution is built (sdist, then the wheel from it), installed
into a fresh venv, and used outside the checkout: ``areal plugins``, ``areal quickstart``, and a
third-party plugin installed later from its own wheel and selected by name.

Third-party dependencies come from the package index as for a user; torch is pinned to the CPU
build (``torch==2.13.0``; a bare ``torch`` would pull a multi-GB CUDA build).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from dists import REPO, VERSION, built_names, plugin_dirs

pytestmark = pytest.mark.slow

REWARD_EXAMPLE = REPO / "examples" / "plugins" / "areal-reward-example"
PLUGIN_ENTRY_POINTS = {d.name for d in plugin_dirs()}  # each plugins/<name> registers entry point <name>
TORCH = "torch==2.13.0"
#: What a build needs from the checkout: the projects, and examples/ (targets of areal_core/examples/ links).
SOURCES = ["pyproject.toml", "README.md", "areal_core", "plugins", "examples"]
QUICK = ["total_train_steps=3", "stats.progress=false", "stats.eval_every=3", "valid_dataset.size=16"]


def _run(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert result.returncode == 0, f"{cmd} exited {result.returncode}:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return result


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    """Every distribution's sdist and wheel, built from a copy of the checkout (builds write beside sources)."""
    pytest.importorskip("build", reason="python -m build is not installed: pip install build")
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheels")
    skip = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", ".*", "runs")
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, symlinks=True, ignore=skip)
        else:
            shutil.copy2(REPO / name, src / name)
    projects = [src / d.relative_to(REPO) for d in built_names().values()] + [src / REWARD_EXAMPLE.relative_to(REPO)]
    builds = [
        subprocess.Popen([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(p)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for p in projects
    ]
    for project, proc in zip(projects, builds):
        log, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"building {project.name} failed:\n{log[-3000:]}"
    return out


def _wheel(wheels: Path, distribution: str) -> Path:
    (path,) = wheels.glob(f"{distribution.replace('-', '_')}-{VERSION}-py3-none-any.whl")
    return path


@pytest.fixture(scope="module")
def env(wheels: Path, tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A fresh venv with areal-core and every plugins/* wheel; its bin dir and an environment without the checkout."""
    root = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True).create(root)
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("AREAL_")}
    environ["PATH"] = f"{root / 'bin'}{os.pathsep}{environ.get('PATH', '')}"
    _run([str(root / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile", "--find-links", str(wheels), TORCH,
          *(str(_wheel(wheels, name)) for name in built_names())], timeout=1800, env=environ, cwd=root)
    return root / "bin", environ


def test_wheels_carry_one_version_and_the_packaged_examples(wheels: Path):
    import zipfile

    sdists = {p.name for p in wheels.glob("*.tar.gz")}
    assert {f"{name.replace('-', '_')}-{VERSION}.tar.gz" for name in built_names()} <= sdists, sdists
    files = zipfile.ZipFile(_wheel(wheels, "areal-core")).namelist()
    assert {"areal_core/VERSION", "areal_core/examples/quickstart.yaml", "areal_core/examples/gsm8k_grpo_cpu.yaml"} <= set(files)


def test_installed_wheels_list_every_plugin_and_run_the_quickstart(env, tmp_path):
    bin_dir, environ = env
    where = _run([str(bin_dir / "python"), "-c", "import areal_core; print(areal_core.__file__)"], 60, env=environ, cwd=tmp_path)
    assert where.stdout.startswith(str(bin_dir.parent)), where.stdout  # the venv's copy, not the checkout
    rows = json.loads(_run([str(bin_dir / "areal"), "plugins", "--json"], 120, env=environ, cwd=tmp_path).stdout)
    plugins = {row["name"]: row for row in rows}
    assert PLUGIN_ENTRY_POINTS <= set(plugins), sorted(plugins)
    for name in PLUGIN_ENTRY_POINTS:
        assert plugins[name]["error"] is None and plugins[name]["version"] == VERSION, plugins[name]

    _run([str(bin_dir / "areal"), "quickstart", *QUICK], 900, env=environ, cwd=tmp_path)
    trial = tmp_path / "runs" / "quickstart" / "trial0"
    steps = [json.loads(line) for line in (trial / "stats.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3], steps
    assert (trial / "checkpoints" / "final" / "config.json").is_file()


def test_a_plugin_wheel_installed_later_is_selected_by_name(env, wheels, tmp_path):
    bin_dir, environ = env
    config = tmp_path / "quickstart.yaml"
    config.write_text(_run([str(bin_dir / "areal"), "quickstart", "--print-config"], 60, env=environ, cwd=tmp_path).stdout)
    select = [str(bin_dir / "areal"), "config", str(config), "reward.name=arith_length_penalty"]
    before = subprocess.run(select, capture_output=True, text=True, timeout=120, env=environ, cwd=tmp_path)
    assert before.returncode == 2 and "reward 'arith_length_penalty' is not installed" in before.stderr, before.stderr

    _run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels),
          "areal-reward-example"], 300, env=environ, cwd=tmp_path)
    resolved = _run(select, 120, env=environ, cwd=tmp_path).stdout
    assert "name: arith_length_penalty" in resolved
    score = "from areal_core.plugins import load_plugins; print(load_plugins().get('reward', 'arith_length_penalty')('3+4=', '7 ok', answer='7'))"
    assert abs(float(_run([str(bin_dir / "python"), "-c", score], 120, env=environ, cwd=tmp_path).stdout) - 0.7) < 1e-9
