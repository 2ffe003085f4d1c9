"""Plugin manager factory and the registries that hooks fill.

Built-ins and third-party distributions come in through the same door: each is a module of
``@hookimpl`` functions registered on a fresh :class:`pluggy.PluginManager`. Third-party ones
are found through the ``areal`` entry-point group. Environment switches:

- ``AREAL_PLUGINS=a,b``: load only these entry points (entry-point or distribution names);
- ``AREAL_DISABLE_PLUGIN_AUTOLOAD=1``: load built-ins only;
- ``AREAL_TRACE_PLUGINS=1``: print every hook call to stderr.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import os
import sys
from typing import Any, Iterable

import attrs
import pluggy

from areal_core import hookspecs
from areal_core.api import API_VERSION
from areal_core.api.errors import ArealError, PluginError

ENTRY_POINT_GROUP = "areal"

#: kind -> (hook that fills it, entry-point prefix used by plugin distributions of that kind)
KINDS: dict[str, tuple[str, str]] = {
    "platform": ("areal_register_platforms", "platform"),
    "engine": ("areal_register_inference_engines", "engine"),
    "weight_updater": ("areal_register_weight_updaters", "reshard"),
    "algorithm": ("areal_register_algorithms", "algorithm"),
    "reward": ("areal_register_rewards", "reward"),
    "dataset": ("areal_register_datasets", "dataset"),
    "tool_parser": ("areal_register_tool_parsers", "tool_parser"),
    "stats_sink": ("areal_register_stats_sinks", "stats"),
}

#: Names users ask for that live in a distribution of ours, so the error can say what to install.
KNOWN_DISTRIBUTIONS: dict[tuple[str, str], str] = {
    ("platform", "cuda"): "areal-platform-cuda",
    ("platform", "npu"): "areal-platform-npu",
    ("engine", "vllm"): "areal-engine-vllm",
    ("engine", "sglang"): "areal-engine-sglang",
    ("weight_updater", "disk"): "areal-reshard-disk",
    ("weight_updater", "xccl"): "areal-reshard-xccl",
    ("stats_sink", "wandb"): "areal-stats-wandb",
    ("stats_sink", "swanlab"): "areal-stats-swanlab",
    ("stats_sink", "mlflow"): "areal-stats-mlflow",
}

BUILTIN_MODULES: tuple[str, ...] = (
    "areal_core.builtin.platform_cpu",
    "areal_core.builtin.engine_hf",
    "areal_core.builtin.algorithms",
    "areal_core.builtin.rewards",
    "areal_core.builtin.datasets",
    "areal_core.builtin.tool_parsers",
    "areal_core.builtin.stats_sinks",
)
BUILTIN_DISTRIBUTION = "areal-core"


@attrs.define
class PluginInfo:
    """One loaded (or broken) plugin, as ``areal plugins`` shows it."""

    name: str
    distribution: str
    version: str
    hooks: list[str] = attrs.Factory(list)
    registered: dict[str, list[str]] = attrs.Factory(dict)
    error: str | None = None
    incompatible: str | None = None  # why its declared AREAL_API range excludes API_VERSION

    @property
    def broken(self) -> bool:
        return self.error is not None


@attrs.frozen
class Registration:
    kind: str
    name: str
    target: Any  # the object, or a "module:attr" path resolved on first use
    plugin: str
    distribution: str


class Plugins:
    """A loaded plugin set: the pluggy manager, the registries, and per-plugin info."""

    def __init__(
        self, pm: pluggy.PluginManager, infos: list[PluginInfo], filtered: list[PluginInfo] | None = None
    ) -> None:
        self.pm = pm
        self.infos = infos
        self.filtered = filtered or []  # installed, but left out by AREAL_PLUGINS
        self._registry: dict[str, dict[str, Registration]] = {kind: {} for kind in KINDS}
        self._resolved: dict[tuple[str, str], Any] = {}

    # ---------------------------------------------------------------- registration
    def _collect(self) -> None:
        by_name = {info.name: info for info in self.infos}
        for kind, (hook_name, _) in KINDS.items():
            for impl in getattr(self.pm.hook, hook_name).get_hookimpls():  # registration order
                info = by_name[impl.plugin_name]
                register = self._register_callback(kind, info)
                impl.function(**{arg: register for arg in impl.argnames})

    def _register_callback(self, kind: str, info: PluginInfo):
        def register(name_or_cls: Any, target: Any = None) -> None:
            if target is None:  # register(PlatformCls): the class names itself
                target, name = name_or_cls, getattr(name_or_cls, "name", None)
            else:
                name = name_or_cls
            if not isinstance(name, str) or not name:
                raise PluginError(f"plugin {info.name!r} registered a {kind} without a name")
            existing = self._registry[kind].get(name)
            if existing is not None:
                raise PluginError(
                    f"{kind} {name!r} is registered twice: by {existing.distribution} "
                    f"(plugin {existing.plugin!r}) and by {info.distribution} (plugin "
                    f"{info.name!r}); uninstall one or set AREAL_PLUGINS to choose"
                )
            self._registry[kind][name] = Registration(kind, name, target, info.name, info.distribution)
            info.registered.setdefault(kind, []).append(name)

        return register

    # ---------------------------------------------------------------- lookup
    def names(self, kind: str) -> list[str]:
        """Registered names of one kind, sorted."""
        return sorted(self._registry[_check_kind(kind)])

    def registration(self, kind: str, name: str) -> Registration:
        regs = self._registry[_check_kind(kind)]
        if name not in regs:
            raise PluginError(self._missing_message(kind, name))
        return regs[name]

    def get(self, kind: str, name: str) -> Any:
        """The registered object for ``name``, importing ``"module:attr"`` targets on first use."""
        key = (kind, name)
        if key not in self._resolved:
            reg = self.registration(kind, name)
            target = reg.target
            if isinstance(target, str):
                module_name, _, attr = target.partition(":")
                try:
                    target = getattr(importlib.import_module(module_name), attr)
                except Exception as exc:  # noqa: BLE001 - reported with the plugin's name
                    raise PluginError(
                        f"{kind} {name!r} from {reg.distribution} failed to import {reg.target}: "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
            self._resolved[key] = target
        return self._resolved[key]

    def _missing_message(self, kind: str, name: str) -> str:
        installed = ", ".join(self.names(kind)) or "none"
        prefix = KINDS[kind][1]
        dist = KNOWN_DISTRIBUTIONS.get((kind, name))
        for info in self.infos:
            if (info.broken or info.incompatible) and (info.name == f"{prefix}_{name}" or info.distribution == dist):
                why = f"failed to load: {info.error}" if info.broken else f"is incompatible: {info.incompatible}"
                return f"{kind} {name!r} comes from plugin {info.name!r} ({info.distribution} {info.version}), which {why}"
        for info in self.filtered:
            if info.name == f"{prefix}_{name}" or info.distribution == dist:
                allowed = os.environ.get("AREAL_PLUGINS", "")
                return (
                    f"{kind} {name!r} is installed (plugin {info.name!r} from {info.distribution}) but "
                    f"AREAL_PLUGINS={allowed} filters it out; add {info.name} to AREAL_PLUGINS"
                )
        hint = f"; pip install {dist}" if dist else ""
        return f"{kind} {name!r} is not installed{hint} (installed {kind}s: {installed})"

    # ---------------------------------------------------------------- hooks
    def configure(self, config: Any) -> Any:
        """Run ``areal_configure`` over every plugin, threading the config through."""
        distributions = {info.name: info.distribution for info in self.infos}
        for impl in self.pm.hook.areal_configure.get_hookimpls():
            try:
                updated = impl.function(**{arg: config for arg in impl.argnames})
            except ArealError:
                raise
            except Exception as exc:  # noqa: BLE001 - a plugin's bug, reported with its name
                raise PluginError(
                    f"plugin {impl.plugin_name!r} ({distributions.get(impl.plugin_name, '?')}) failed in "
                    f"areal_configure: {type(exc).__name__}: {exc}"
                ) from exc
            if updated is not None:
                config = updated
        return config

    @property
    def broken(self) -> list[PluginInfo]:
        return [info for info in self.infos if info.broken]


def _check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise PluginError(f"unknown plugin kind {kind!r} (kinds: {', '.join(KINDS)})")
    return kind


def _allow_list() -> set[str] | None:
    raw = os.environ.get("AREAL_PLUGINS", "").strip()
    return {item.strip() for item in raw.split(",") if item.strip()} if raw else None


def _autoload_disabled() -> bool:
    return os.environ.get("AREAL_DISABLE_PLUGIN_AUTOLOAD", "").strip().lower() in {"1", "true", "yes"}


def _entry_points() -> Iterable[md.EntryPoint]:
    return md.entry_points(group=ENTRY_POINT_GROUP)


def load_plugins(
    *,
    autoload: bool | None = None,
    extra: Iterable[tuple[str, object]] = (),
) -> Plugins:
    """Build a fresh plugin set: built-ins, then entry points, then ``extra`` (name, module).

    A plugin that fails to import is recorded as broken and skipped, one whose ``AREAL_API`` range
    excludes :data:`~areal_core.api.API_VERSION` as incompatible and skipped; the others still load.
    Hook implementations with no matching spec raise :class:`PluginError` (``check_pending``).
    """
    pm = pluggy.PluginManager("areal")
    pm.add_hookspecs(hookspecs)
    if os.environ.get("AREAL_TRACE_PLUGINS"):
        pm.trace.root.setwriter(lambda msg: print(msg, end="", file=sys.stderr))
        pm.enable_tracing()
    infos: list[PluginInfo] = []
    filtered: list[PluginInfo] = []
    version = _version(BUILTIN_DISTRIBUTION)
    for module_name in BUILTIN_MODULES:
        name = "builtin-" + module_name.rsplit(".", 1)[1]
        pm.register(importlib.import_module(module_name), name=name)
        infos.append(PluginInfo(name, BUILTIN_DISTRIBUTION, version))

    if autoload is None:
        autoload = not _autoload_disabled()
    if autoload:
        allowed = _allow_list()
        for ep in _entry_points():
            dist_name = ep.dist.name if ep.dist else "?"
            dist_version = ep.dist.version if ep.dist else "?"
            if allowed is not None and ep.name not in allowed and dist_name not in allowed:
                filtered.append(PluginInfo(ep.name, dist_name, dist_version))
                continue
            if pm.get_plugin(ep.name) is not None:  # same distribution installed twice on sys.path
                continue
            info = PluginInfo(ep.name, dist_name, dist_version)
            infos.append(info)
            try:
                module = ep.load()
                info.incompatible = api_mismatch(module)
                if info.incompatible is None:
                    pm.register(module, name=ep.name)
            except Exception as exc:  # noqa: BLE001 - a broken plugin must not stop the others
                info.error = f"{type(exc).__name__}: {exc}"
    for name, module in extra:
        info = PluginInfo(name, getattr(module, "__distribution__", "<inline>"), "-")
        infos.append(info)
        info.incompatible = api_mismatch(module)
        if info.incompatible is None:
            pm.register(module, name=name)

    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"plugin {pm.get_name(exc.plugin)!r} implements an unknown hook: {exc}") from exc
    for info in infos:
        plugin = pm.get_plugin(info.name)
        if plugin is not None:
            info.hooks = sorted(impl.name for impl in pm.get_hookcallers(plugin) or [])
    plugins = Plugins(pm, infos, filtered)
    plugins._collect()
    return plugins


def api_mismatch(module: object) -> str | None:
    """Why ``module``'s ``AREAL_API`` range (e.g. ``">=1.0,<2"``) excludes :data:`API_VERSION`;
    None when it includes it or the module declares none."""
    declared = getattr(module, "AREAL_API", None)
    if declared is None:
        return None
    ops = {">=": "__ge__", "<=": "__le__", ">": "__gt__", "<": "__lt__", "==": "__eq__", "!=": "__ne__"}
    current = _version_tuple(API_VERSION)
    for clause in str(declared).split(","):
        op = next((op for op in ops if clause.strip().startswith(op)), None)
        bound = _version_tuple(clause.strip()[len(op or ""):]) if op else None
        if op is None or bound is None:
            return f"AREAL_API = {declared!r} is not a version range like '>=1.0,<2'"
        width = max(len(current), len(bound))
        if not getattr(current + (0,) * (width - len(current)), ops[op])(bound + (0,) * (width - len(bound))):
            return f"it supports areal_core.api {declared}, this areal-core has API {API_VERSION}; install a matching version"
    return None


def _version_tuple(text: str) -> tuple[int, ...] | None:
    parts = text.strip().split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else None


def _version(distribution: str) -> str:
    try:
        return md.version(distribution)
    except md.PackageNotFoundError:
        return "0+unknown"
