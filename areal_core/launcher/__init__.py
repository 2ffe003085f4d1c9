"""Launchers run a controller script (the user's training loop) with a config."""

from __future__ import annotations

import argparse
from typing import Callable, Sequence

from areal_core.config import Config, load_config


def parse_script_args(argv: Sequence[str] | None = None) -> Config:
    """What a training script calls first: ``[--config] YAML [k=v ...]`` -> a validated Config."""
    from areal_core.config import config_and_overrides

    parser = argparse.ArgumentParser(description="areal-core training script")
    parser.add_argument("--config", default=None, help="YAML config (defaults if omitted)")
    parser.add_argument("overrides", nargs="*", metavar="[CONFIG.yaml] key=value")
    ns = parser.parse_intermixed_args(argv)
    return load_config(*config_and_overrides(ns.config, ns.overrides))


def script_main(main: Callable[[Config], object], argv: Sequence[str] | None = None) -> None:
    """Run ``main(config)`` for a training script; errors print one line and exit with their
    ``exit_code`` (2: fix the input; 3: a process of the run died, the launcher may restart it)."""
    import logging
    import sys

    from areal_core.api.errors import ArealError

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        main(parse_script_args(argv))
    except ArealError as exc:
        print(f"areal: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("areal: interrupted; servers and workers stopped", file=sys.stderr)
        sys.exit(130)
