"""``python -m areal_core.launcher.local SCRIPT [--config] YAML [k=v ...]``.

Validates the config, then runs SCRIPT as the controller process. Ctrl-C or SIGTERM stops the
controller, which stops its servers and workers; a controller killed outright takes its children
with it (they run with a parent-death signal). With ``recover.mode=auto`` a failed run (a dead
server or training worker exits 3, a crash 1) is restarted up to ``recover.retries`` times and
resumes from its last recover point; bad input (exit 2) and an interrupt (130) are not retried.
A controller killed by a signal is reported in one line (exit 128 + the signal's number), and the
``control.json`` it left behind is removed.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from typing import Sequence

from areal_core.config import config_and_overrides
from areal_core.control_endpoint import remove_stale_control
from areal_core.api.errors import ArealError
from areal_core.scheduler.local import die_with_parent

STOP_GRACE_SECONDS = 30.0


def _validate(config_path: str | None, overrides: list[str]):
    from areal_core.config import load_config
    from areal_core.plugins import load_plugins
    from areal_core.resolve import resolve_config

    config, _ = resolve_config(load_config(config_path, overrides), load_plugins())
    return config


def _run_once(cmd: list[str]) -> int:
    child = subprocess.Popen(cmd, preexec_fn=die_with_parent)

    def forward(signum: int, _frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:  # pragma: no cover - handler above forwards instead
                forward(signal.SIGINT, None)
    finally:
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                child.kill()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m areal_core.launcher.local", description=__doc__.splitlines()[0])
    parser.add_argument("script", help="training script (the controller)")
    parser.add_argument("--config", default=None, help="YAML config (or give it as the first argument after SCRIPT)")
    parser.add_argument("overrides", nargs="*", metavar="[CONFIG.yaml] key=value")
    ns = parser.parse_intermixed_args(argv)
    try:
        config_path, overrides = config_and_overrides(ns.config, ns.overrides)
        config = _validate(config_path, overrides)
    except ArealError as exc:
        print(f"areal: error: {exc}", file=sys.stderr)
        return 2
    cmd = [sys.executable, ns.script, *(["--config", config_path] if config_path else []), *overrides]
    attempts = 1 + (config.recover.retries if config.recover.mode == "auto" else 0)
    for attempt in range(1, attempts + 1):
        rc = _run_once(cmd)
        stale = remove_stale_control(config.run_dir) is not None
        if rc < 0 and rc != -signal.SIGINT:
            cleaned = "; removed the control.json it left" if stale else ""
            print(f"areal: the controller was killed by signal {-rc} ({_signal_name(-rc)}){cleaned}", file=sys.stderr)
            rc = 128 - rc
        if rc in (0, 2, 130, -signal.SIGINT) or attempt == attempts:
            return rc
        print(f"areal: run exited with {rc}; restarting from the last recover point "
              f"(attempt {attempt + 1}/{attempts})", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
