"""Every hook spec is documented in docs/plugins.md with a heading and an example."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from areal_core import hookspecs

DOC = (Path(__file__).resolve().parents[1] / "docs" / "plugins.md").read_text()
HOOKS = [name for name, fn in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("areal_")]


def test_hooks_found():
    assert len(HOOKS) >= 7


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_is_documented(hook):
    params = ", ".join(inspect.signature(getattr(hookspecs, hook)).parameters)
    heading = f"### `{hook}({params})`"
    assert heading in DOC, f"docs/plugins.md lacks the heading {heading!r}"
    section = DOC.split(heading, 1)[1].split("\n### ", 1)[0]
    assert re.search(rf"```python\n.*def {hook}\(", section, re.S), f"no example implementing {hook}"


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_spec_has_docstring(hook):
    assert (getattr(hookspecs, hook).__doc__ or "").strip()


def test_api_section_lists_exactly_the_api():
    """docs/plugins.md's table of areal_core.api names each public name once, in its module's row."""
    import areal_core.api as api

    section = DOC.split("## The API: `areal_core.api`", 1)[1].split("\n## ", 1)[0]
    documented: dict[str, str] = {}
    for module, names in re.findall(r"^\| `([\w.]+)` \| [^|]+ \| (.+) \|$", section, re.M):
        for name in re.findall(r"`(\w+)`", names):
            assert name not in documented, f"{name} is listed twice"
            documented[name] = f"areal_core.{module}"
    assert documented == api._WHERE
    assert set(api.__all__) == set(documented) | {"API_VERSION", "hookimpl"}
    assert f"`API_VERSION` (`\"{api.API_VERSION}\"`)" in section
