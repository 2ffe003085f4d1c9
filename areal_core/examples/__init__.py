"""Examples shipped inside the wheel: ``areal quickstart`` and ``areal run --example NAME``.

The files beside this module are links to the repository's ``examples/`` (one copy of each); the
wheel and the sdist carry their contents. An example runs exactly as the repository command does:
``python -m areal_core.launcher.local SCRIPT --config YAML [k=v ...]`` in the working directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import attrs

from areal_core.api.errors import ArealError

HERE = Path(__file__).resolve().parent


@attrs.frozen
class Example:
    """A controller script and its config, both files inside the installed package."""

    name: str
    script: Path
    config: Path


#: name -> (script, config), file names beside this module.
EXAMPLES: dict[str, tuple[str, str]] = {
    "quickstart": ("quickstart.py", "quickstart.yaml"),
    "gsm8k-cpu": ("gsm8k_rl.py", "gsm8k_grpo_cpu.yaml"),
    "gsm8k-cuda": ("gsm8k_rl.py", "gsm8k_grpo_cuda.yaml"),
    "gsm8k-npu": ("gsm8k_rl.py", "gsm8k_grpo_npu.yaml"),
}


def get_example(name: str) -> Example:
    """The packaged example ``name``; an unknown name lists the available ones."""
    if name not in EXAMPLES:
        raise ArealError(f"--example: unknown example {name!r} (available: {', '.join(EXAMPLES)})")
    script, config = EXAMPLES[name]
    return Example(name, HERE / script, HERE / config)


def run_example(name: str, overrides: Sequence[str]) -> int:
    """Run example ``name`` through the local launcher (restarts and exit codes as the launcher's)."""
    from areal_core.launcher.local import main as launch

    bad = [arg for arg in overrides if "=" not in arg]
    if bad:
        raise ArealError(f"--example {name}: {bad[0]!r} is not a key=value override (the example brings its own config)")
    example = get_example(name)
    return launch([str(example.script), "--config", str(example.config), *overrides])
