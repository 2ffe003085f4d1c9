"""Launchers run a controller script (the user's training loop) with a config."""

from __future__ import annotations

import argparse
from typing import Sequence

from areal_core.config import Config, load_config


def parse_script_args(argv: Sequence[str] | None = None) -> Config:
    """What a training script calls first: ``--config YAML [k=v ...]`` -> a validated Config."""
    parser = argparse.ArgumentParser(description="areal-core training script")
    parser.add_argument("--config", default=None, help="YAML config (defaults if omitted)")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    ns = parser.parse_args(argv)
    return load_config(ns.config, ns.overrides)
