"""Training workers run with glibc's malloc keeping freed memory (``malloc_env``): a step's
tensors, allocated again at the next step, are not faulted in page by page again."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from areal_core.train.worker_group import MALLOC_TUNABLES, malloc_env

# a train step's pattern: activations of a few MB and a 200 MB logit chunk, all freed at its end;
# prints the page faults of five steps after the first
_STEPS = """
import resource, torch
def step():
    held = [torch.ones(2**20 * (1 + i % 4)) for i in range(24)] + [torch.ones(50 * 2**20)]
    return sum(t.sum() for t in held)
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults_over_steps(extra_env: dict[str, str]) -> int:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"} | extra_env
    out = subprocess.run([sys.executable, "-c", _STEPS], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc tunables")
def test_memory_freed_by_a_step_is_reused_without_faulting_it_in_again():
    default, kept = _faults_over_steps({}), _faults_over_steps(malloc_env({}))
    assert default > 100_000  # glibc's default: about 110,000 fresh pages a step (here 5 x 440 MB)
    assert kept < default / 10, (kept, default)


def test_the_user_s_own_tunables_win():
    assert malloc_env({}) == {"GLIBC_TUNABLES": MALLOC_TUNABLES}
    assert malloc_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) == {}
