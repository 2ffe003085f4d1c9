"""Short quickstart runs whose rollouts or rewards fail: bounded output, counted failures, one-line abort."""

from __future__ import annotations

import pytest
from quickstart_runs import LAUNCHER, run_args, start

pytestmark = pytest.mark.slow

HANG_GUARD_S = 400  # only guards a hang: a run whose episodes all fail must stop by itself


def test_every_request_timing_out_aborts_with_one_line(tmp_path, marks):
    proc = start([*LAUNCHER, *run_args(tmp_path, "timeout", "rollout.request_timeout=0.01")], marks())
    out, _ = proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("areal: error:")]
    assert len(errors) == 1 and "rollout.max_failure_rate" in errors[0], out[-3000:]
    assert len(out.splitlines()) < 60, out[-3000:]  # aggregated: not one line per failure
