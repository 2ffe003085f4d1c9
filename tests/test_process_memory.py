"""Peak RSS per process group, read from /proc: a started group's children count with it, the
controller's own children with the controller."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from areal_core.process_memory import peak_rss_by_group, render_peaks

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")

#: A child that allocates 200 MB, starts a grandchild, and waits to be stopped.
ALLOCATE = (
    "import subprocess, sys, time; block = bytearray(200 * 2**20); "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); print('ready', flush=True); time.sleep(60)"
)


def test_a_started_group_holds_its_children_and_its_peak():
    leader = subprocess.Popen([sys.executable, "-c", ALLOCATE], stdout=subprocess.PIPE, start_new_session=True, text=True)
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # the controller's own child
    try:
        assert leader.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        peaks = peak_rss_by_group([("server0", leader.pid)])
        count, peak = peaks["server0"]
        assert count == 2 and peak >= 200 * 2**20
        controller_count, _ = peaks["controller"]
        assert controller_count >= 2  # this process and its helper; not the server's group
        assert render_peaks({"server0": (count, peak)}).startswith("server0 0.")
    finally:
        subprocess.run(["kill", "--", f"-{leader.pid}"], check=False)
        helper.kill()
        leader.wait(10)
        helper.wait(10)
