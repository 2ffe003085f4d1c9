"""The ``areal`` command: ``areal plugins``, ``areal config``, ``areal run``.

User errors print one line on stderr and exit 2, without a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from areal_core.errors import ArealError

EXIT_USAGE = 2


def _split_config_args(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """``[CONFIG.yaml] [k=v ...]``: the first argument without ``=`` is the config file."""
    if args and "=" not in args[0]:
        return args[0], list(args[1:])
    return None, list(args)


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
        }
        for info in plugins.infos
    ]
    if ns.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        status = "BROKEN" if row["error"] else "ok"
        print(f"{row['name']}  ({row['distribution']} {row['version']})  [{status}]")
        if row["error"]:
            print(f"    error: {row['error']}")
            continue
        print(f"    hooks: {', '.join(row['hooks']) or '-'}")
        for kind, names in row["registered"].items():
            print(f"    {kind}: {', '.join(names)}")
    return 0


def cmd_config(ns: argparse.Namespace) -> int:
    from areal_core.config import dump_yaml, load_config
    from areal_core.plugins import load_plugins
    from areal_core.resolve import resolve_config

    from areal_core.datasets import load_dataset

    path, overrides = _split_config_args(ns.args)
    plugins = load_plugins()
    config, _ = resolve_config(load_config(path, overrides), plugins)
    load_dataset(config.train_dataset, "train", plugins)  # dataset options and paths are checked too
    if config.valid_dataset is not None:
        load_dataset(config.valid_dataset, "valid", plugins)
    sys.stdout.write(dump_yaml(config))
    return 0


def cmd_run(ns: argparse.Namespace) -> int:
    from areal_core.trainer import run_training

    path, overrides = _split_config_args(ns.args)
    run_training(path, overrides)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="areal", description="Asynchronous RL post-training for LLMs.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plugins", help="list installed plugins, their hooks and registered names")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_plugins)
    p = sub.add_parser("config", help="validate a config and print the resolved YAML")
    p.add_argument("args", nargs="*", metavar="[CONFIG.yaml] [key=value ...]")
    p.set_defaults(func=cmd_config)
    p = sub.add_parser("run", help="run the built-in GRPO trainer")
    p.add_argument("args", nargs="*", metavar="[CONFIG.yaml] [key=value ...]")
    p.set_defaults(func=cmd_run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        return ns.func(ns)
    except ArealError as exc:
        print(f"areal: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("areal: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
