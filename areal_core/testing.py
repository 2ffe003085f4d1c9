"""pytest fixtures for plugin authors (loaded through the ``pytest11`` entry point).

Example::

    def test_my_reward(areal_plugins):
        areal_plugins.add(my_plugin_module)
        plugins = areal_plugins.load()
        assert plugins.get("reward", "my_reward")("1+1=", "2", answer="2") == 1.0
"""

from __future__ import annotations

import types
from typing import Any, Iterator

import pytest

from areal_core.plugins import Plugins, load_plugins


class PluginSetFactory:
    """Builds fresh plugin sets from the built-ins plus inline plugins added by the test."""

    def __init__(self) -> None:
        self._extra: list[tuple[str, object]] = []

    def add(self, plugin: object, name: str | None = None) -> object:
        """Add an inline plugin: a module, a class/object with ``@hookimpl`` methods."""
        self._extra.append((name or getattr(plugin, "__name__", None) or f"inline-{len(self._extra)}", plugin))
        return plugin

    def add_hooks(self, name: str, **hooks: Any) -> object:
        """Add an inline plugin made of ``hook_name=function`` pairs (functions get ``@hookimpl``)."""
        from areal_core import hookimpl

        module = types.SimpleNamespace(**{hook: hookimpl(fn) for hook, fn in hooks.items()})
        return self.add(module, name)

    def load(self, *, autoload: bool = False) -> Plugins:
        """A fresh plugin set; entry points are loaded only with ``autoload=True``."""
        return load_plugins(autoload=autoload, extra=self._extra)


@pytest.fixture
def areal_plugins() -> Iterator[PluginSetFactory]:
    """A fresh :class:`PluginSetFactory`; the active platform is reset afterwards."""
    from areal_core.platform import _reset_for_tests

    yield PluginSetFactory()
    _reset_for_tests()
