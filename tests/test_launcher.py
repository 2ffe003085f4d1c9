"""The local launcher: the config file either way, one line for a controller killed by a signal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from areal_core.control_endpoint import CONTROL_FILE, control_call
from areal_core.api.errors import ArealError

REPO = Path(__file__).resolve().parents[1]
CONFIG = str(REPO / "examples" / "quickstart" / "config.yaml")

#: A controller that leaves a control.json naming itself, then is killed outright.
KILLED = """
import json, os, signal, sys
from areal_core.launcher import parse_script_args
config = parse_script_args(sys.argv[1:])
config.run_dir.mkdir(parents=True, exist_ok=True)
(config.run_dir / "control.json").write_text(json.dumps({"address": "127.0.0.1:9", "token": "t", "pid": os.getpid()}))
print("args", sys.argv[1:], flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _launch(script: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "areal_core.launcher.local", str(script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("how", ["flag", "positional"])
def test_a_killed_controller_is_one_line_and_leaves_no_control_file(tmp_path, how):
    script = tmp_path / "controller.py"
    script.write_text(KILLED)
    config = ["--config", CONFIG] if how == "flag" else [CONFIG]
    result = _launch(script, *config, f"fileroot={tmp_path}", "seed=3")
    assert f"args ['--config', '{CONFIG}', 'fileroot={tmp_path}', 'seed=3']" in result.stdout  # same either way
    assert result.returncode == 128 + 9
    assert result.stderr.strip().splitlines() == [
        "areal: the controller was killed by signal 9 (SIGKILL); removed the control.json it left"
    ]
    assert not (tmp_path / "quickstart" / "trial0" / CONTROL_FILE).exists()


def test_a_stale_control_file_is_reported_and_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path = tmp_path / CONTROL_FILE
    path.write_text(json.dumps({"address": "127.0.0.1:9", "token": "t", "pid": int(dead.stdout)}))
    with pytest.raises(ArealError, match=rf"left by process {int(dead.stdout)}, which is gone"):
        control_call(tmp_path, "GET", "/servers")
    assert not path.exists()
    path.write_text(json.dumps({"address": "127.0.0.1:9", "token": "t", "pid": os.getpid()}))  # a live job's
    with pytest.raises(ArealError, match="does not answer"):
        control_call(tmp_path, "GET", "/servers", timeout=5)
    assert path.exists()
