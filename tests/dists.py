"""Facts about this repository's distributions, read from the pyproject files (for the packaging tests)."""

from __future__ import annotations

import sys
from pathlib import Path

from packaging.requirements import Requirement

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
CORE = "areal-core"
VERSION = (REPO / "areal_core" / "VERSION").read_text().strip()


def pyproject(directory: Path) -> dict:
    return tomllib.loads((directory / "pyproject.toml").read_text())


def plugin_dirs() -> list[Path]:
    return sorted(d for d in (REPO / "plugins").iterdir() if (d / "pyproject.toml").is_file())


def built_names() -> dict[str, Path]:
    """Distribution name -> source directory, for areal-core and every plugins/* distribution."""
    return {pyproject(d)["project"]["name"]: d for d in [REPO, *plugin_dirs()]}


def areal_requirements(requirements: list[str]) -> list[Requirement]:
    return [r for r in map(Requirement, requirements) if r.name.startswith("areal-")]


def core_closure(extras: set[str]) -> set[str]:
    """The areal-* distributions that ``areal-core[extras]`` installs (extras followed recursively)."""
    project = pyproject(REPO)["project"]
    names = {CORE} | {r.name for r in areal_requirements(project["dependencies"])}
    pending, done = list(extras), set()
    while pending:
        extra = pending.pop()
        if extra in done:
            continue
        done.add(extra)
        for req in areal_requirements(project["optional-dependencies"][extra]):
            names.add(req.name)
            pending += req.extras if req.name == CORE else []
    return names
