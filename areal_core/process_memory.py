"""Peak resident memory of a run's processes, read from ``/proc`` (Linux; elsewhere nothing).

Each process the scheduler started leads its own process group (its children, such as vLLM's
engine core, stay in it); the controller's own children (reward workers) are counted with it.
A group's figure is the sum of its processes' peaks (``VmHWM``), an upper bound of its peak.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

_PROC = Path("/proc")


def _status(pid: int) -> dict[str, str]:
    try:
        lines = (_PROC / str(pid) / "status").read_text().splitlines()
    except OSError:
        return {}
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def _stat_ids(pid: int) -> tuple[int, int] | None:
    """(parent pid, process group) of ``pid``."""
    try:
        fields = (_PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[2])


def _status_bytes(pid: int, key: str) -> int:
    return int(_status(pid).get(key, "0 kB").split()[0]) * 1024


def peak_rss_bytes(pid: int) -> int:
    """``VmHWM`` of ``pid`` in bytes (0 where unknown)."""
    return _status_bytes(pid, "VmHWM")


def rss_bytes(pid: int) -> int:
    """``VmRSS`` (resident now) of ``pid`` in bytes (0 where unknown)."""
    return _status_bytes(pid, "VmRSS")


def peak_rss_by_group(groups: Iterable[tuple[str, int]], controller: int | None = None) -> dict[str, tuple[int, int]]:
    """``name -> (processes, summed peak RSS bytes)`` for each ``(name, group leader pid)``, and
    ``"controller"`` for ``controller`` (default: this process) with its descendants outside them."""
    if not _PROC.is_dir():
        return {}
    controller = os.getpid() if controller is None else controller
    ids = {int(p.name): ids for p in _PROC.iterdir() if p.name.isdigit() and (ids := _stat_ids(int(p.name)))}
    leaders = dict(groups)
    result: dict[str, tuple[int, int]] = {}
    for name, leader in leaders.items():
        members = [pid for pid, (_, group) in ids.items() if group == leader]
        if members:
            result[name] = (len(members), sum(map(peak_rss_bytes, members)))
    grouped = set(leaders.values())
    mine = [controller] + [pid for pid in ids if pid != controller and _descends(pid, controller, ids, grouped)]
    result["controller"] = (len(mine), sum(map(peak_rss_bytes, mine)))
    return result


def _descends(pid: int, ancestor: int, ids: dict[int, tuple[int, int]], grouped: set[int]) -> bool:
    """Whether ``pid`` descends from ``ancestor`` without passing through a started group."""
    while pid in ids and ids[pid][1] not in grouped:
        pid = ids[pid][0]
        if pid == ancestor:
            return True
    return False


def render_peaks(peaks: dict[str, tuple[int, int]]) -> str:
    """``controller 0.4 GB · trainer0 5.6 GB · vllm_server0 3.1 GB (3 processes)``."""
    parts = []
    for name, (count, total) in peaks.items():
        parts.append(f"{name} {total / 2**30:.1f} GB" + (f" ({count} processes)" if count > 1 else ""))
    return " · ".join(parts)
