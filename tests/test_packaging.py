"""One version for every distribution, compatible ranges between them, and examples packaged by link."""

from __future__ import annotations

import subprocess
import sys

import pytest
from dists import CORE, REPO, VERSION, areal_requirements, built_names, core_closure, plugin_dirs, pyproject
from packaging.version import Version

from areal_core.examples import EXAMPLES, get_example

NAMES = built_names()


@pytest.mark.parametrize("directory", [REPO, *plugin_dirs()], ids=lambda d: d.name)
def test_version_comes_from_areal_core_version(directory):
    config = pyproject(directory)
    assert "version" not in config["project"] and "version" in config["project"]["dynamic"]
    source = directory / config["tool"]["setuptools"]["dynamic"]["version"]["file"]
    assert source.resolve() == (REPO / "areal_core" / "VERSION").resolve(), f"{source} is not areal_core/VERSION"


@pytest.mark.parametrize("directory", plugin_dirs(), ids=lambda d: d.name)
def test_plugin_requires_a_compatible_core_range(directory):
    (core,) = [r for r in areal_requirements(pyproject(directory)["project"]["dependencies"]) if r.name == CORE]
    assert VERSION in core.specifier, f"{directory.name}: {core} excludes areal-core {VERSION}"
    next_minor = Version(VERSION).release[:2]
    assert f"{next_minor[0]}.{next_minor[1] + 1}.0" not in core.specifier, f"{core}: give an upper bound"


def test_core_requirements_name_built_plugins_with_ranges_admitting_this_version():
    project = pyproject(REPO)["project"]
    groups = [project["dependencies"], *project["optional-dependencies"].values()]
    requirements = [r for group in groups for r in areal_requirements(group) if r.name != CORE]
    assert requirements
    for req in requirements:
        assert req.name in NAMES, f"{req} names no distribution of this repository ({sorted(NAMES)})"
        assert VERSION in req.specifier, f"{req} excludes this version {VERSION}"


def test_extras_select_the_plugins_of_each_platform():
    assert core_closure(set()) == {CORE, "areal-reshard-disk"}  # the quickstart's weight path comes with the core
    assert core_closure({"npu"}) >= {"areal-platform-npu", "areal-engine-vllm", "areal-reshard-xccl"}
    assert core_closure({"cuda"}) >= {"areal-platform-cuda", "areal-reshard-xccl", "areal-engine-vllm"}
    assert core_closure({"vllm"}) - core_closure(set()) == {"areal-engine-vllm"}
    assert core_closure({"sglang"}) - core_closure(set()) == {"areal-engine-sglang"}
    hardware_only = {"areal-platform-cuda", "areal-platform-npu", "areal-engine-sglang"}
    trackers = {"areal-stats-wandb", "areal-stats-swanlab", "areal-stats-mlflow"}
    assert core_closure({"trackers"}) - core_closure(set()) == trackers
    assert core_closure({"all-cpu"}) == set(NAMES) - hardware_only - trackers


@pytest.mark.parametrize("name", EXAMPLES)
def test_packaged_example_is_the_repository_file(name):
    example = get_example(name)
    for path in (example.script, example.config):
        assert path.is_file(), f"{path} does not resolve"
        assert path.resolve().is_relative_to(REPO / "examples"), f"{path} is a copy, not a link to examples/"


def _areal(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "areal_core.cli", *args], capture_output=True, text=True, timeout=60)


def test_quickstart_print_config_is_the_readme_config():
    result = _areal("quickstart", "--print-config")
    assert result.returncode == 0, result.stderr
    assert result.stdout == (REPO / "examples" / "quickstart" / "config.yaml").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--example", "gsm8k"], "--example: unknown example 'gsm8k' (available: quickstart, gsm8k-cpu,"),
        (["run", "--example", "gsm8k-cpu", "my.yaml"], "--example gsm8k-cpu: 'my.yaml' is not a key=value override"),
        (["run", "--print-config"], "--print-config: give --example NAME"),
        (["run", "--example", "gsm8k-cpu", "--config", "my.yaml"], "--example gsm8k-cpu brings its own config; drop --config my.yaml"),
        (["quickstart", "actor.wrld_size=2"], "actor.wrld_size: unknown key; did you mean 'actor.world_size'?"),
    ],
)
def test_bad_example_use_is_one_line_exit_2(args, message):
    result = _areal(*args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("areal: error: ") and message in lines[0], lines
