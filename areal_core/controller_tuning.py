"""Interpreter settings of the controller process while a run drives its planes, restored after.

- **GIL switch interval** 0.5 ms (Python's default: 5 ms). The main thread waits on trainer
  replies and servers while the rollout loop's thread runs Python; after each wait it gets the
  GIL back sooner (bench/vs_trl.py: about 7% shorter steps).
- **Cyclic GC thresholds** (100,000, 50, 100) (Python's default: (700, 10, 10)). Episodes in
  flight live for seconds, so nearly every object they allocate outlives a young collection and
  is promoted; with the defaults, full collections of the whole in-flight heap (about 0.9 s each
  at 8,192 episodes) took about half of the rollout loop's CPU (bench/controller_scale.py).
  Reference counting still frees everything that is not in a cycle at once.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator

SWITCH_INTERVAL_S = 0.0005
GC_THRESHOLDS = (100_000, 50, 100)


@contextlib.contextmanager
def controller_tuning() -> Iterator[None]:
    """Apply the settings above for the ``with`` block; the previous ones come back after it."""
    switch_interval, thresholds = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        sys.setswitchinterval(switch_interval)
        gc.set_threshold(*thresholds)
