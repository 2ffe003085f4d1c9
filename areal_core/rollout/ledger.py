"""The ledger: each episode's lifecycle and each fleet change, appended to ``{run_dir}/ledger.jsonl``.

One JSON object per line, written and flushed at once, never rewritten; a restarted or recovered
run appends to the same file. Every line has ``event`` and ``t`` (unix seconds). Events:

- ``start``: a controller began (``version`` it starts from, ``dataset_size``, ``recovered``);
- ``submitted``: an episode started (``uid``, ``item_id``, ``epoch``, ``version``);
- ``accepted`` / ``rejected`` / ``failed``: how its workflow ended (``uid``); ``retried``: it
  failed and runs again (``rollout.episode_retries``), from a new ``submitted``;
- ``consumed``: handed to the trainer at weight ``version`` (``uid``);
- ``resubmitted``: one of its requests moved off a lost server (``uid``, ``request_id``,
  ``from_server``, ``to_server``);
- ``server_added`` / ``server_joined`` (``version``) / ``server_lost`` / ``server_removed``: ``address``;
- ``stop``: the controller stopped cleanly; ``in_flight`` lists the uids not yet consumed.

An episode's ``uid`` is ``"{epoch}:{item_id}"``, so the same prompt in the same epoch has the
same uid across restarts. :func:`audit` reads the file back and checks exactly-once consumption.
"""

from __future__ import annotations

import collections
import contextvars
import json
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from areal_core.rollout.dataloader import EPOCH_KEY

#: The uid of the episode whose workflow is running in this asyncio task (set by the rollout
#: controller), so events raised deep inside an engine call are attributed to their episode.
EPISODE_UID: contextvars.ContextVar[str | None] = contextvars.ContextVar("areal_episode_uid", default=None)

LEDGER_FILE = "ledger.jsonl"
_ENCODER = json.JSONEncoder(default=str)  # built once: ``json.dumps(..., default=str)`` builds one per call


def json_value(value: Any) -> str:
    """``value`` as JSON, as :meth:`Ledger.record_each` takes it (unknown types as ``str``)."""
    return _ENCODER.encode(value)


def episode_uid(data: dict[str, Any]) -> str:
    """The ledger uid of a dataset item handed out by the prompt loader."""
    return f"{data.get(EPOCH_KEY, 0)}:{data.get('id')}"


class Ledger:
    """Append-only JSON-lines writer, safe to call from any thread."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def record(self, event: str, **fields: Any) -> None:
        """Append one event; ``uid`` defaults to the running episode's (:data:`EPISODE_UID`)."""
        if "uid" not in fields and (uid := EPISODE_UID.get()) is not None:
            fields["uid"] = uid
        self._write(json.dumps({"event": event, "t": time.time(), **fields}, default=str) + "\n")

    def record_each(self, event: str, key: str, json_values: Iterable[str], **shared: Any) -> None:
        """Append one ``event`` per value, with ``key`` set to it and the ``shared`` fields, taking
        the lock and flushing once for all (a batch's thousands of ``consumed`` lines, while the
        rollout loop records too). Each value comes JSON-encoded (:func:`json_value`), and what the
        lines share is encoded once: the rollout runner encodes an episode's uid as it ends, on
        the loop, so taking a batch on the trainer's thread, which shares the core with the loop,
        only joins strings."""
        common = json.dumps({"event": event, "t": time.time(), **shared}, default=str)
        head, tail = common[:-1] + ", " + json.dumps(key) + ": ", "}\n"
        lines = (tail + head).join(json_values)
        if lines:
            self._write(head + lines + tail)

    def _write(self, text: str) -> None:
        with self._lock:
            if self._file.closed:
                return
            self._file.write(text)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_ledger(path: str | Path) -> list[dict[str, Any]]:
    """Every event of a ledger, in order (a torn last line from a killed writer is skipped)."""
    rows = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


@attrs.frozen(kw_only=True)
class LedgerAudit:
    """What a ledger proves about consumption. A consumption recorded before a ``start`` at weight
    version ``v`` and at a version >= ``v`` was rolled back by that restart and does not count; a
    ``start`` that is not a recovery begins a new run (earlier events do not count)."""

    consumed: dict[str, int]  # uid -> times consumed (standing consumptions only)
    submitted: set[str]  # every uid ever submitted
    in_flight: set[str]  # not yet consumed when the last controller stopped
    outcomes: dict[str, int]  # accepted / rejected / failed / retried / resubmitted counts
    per_epoch: dict[int, int]  # distinct uids per epoch, consumed or in flight at the end
    dataset_size: int | None

    @property
    def duplicates(self) -> list[str]:
        return sorted(uid for uid, n in self.consumed.items() if n > 1)

    @property
    def lost(self) -> list[str]:
        """Submitted, never consumed, and not in flight at the end."""
        return sorted(self.submitted - set(self.consumed) - self.in_flight)

    def problems(self) -> list[str]:
        """Empty when every submitted episode was consumed exactly once or is still in flight."""
        found = [f"consumed more than once: {uid}" for uid in self.duplicates]
        found += [f"lost (submitted, never consumed): {uid}" for uid in self.lost]
        found += [f"consumed and still in flight: {uid}" for uid in sorted(self.in_flight & set(self.consumed))]
        if self.dataset_size is not None:
            for epoch in sorted(self.per_epoch)[:-1]:  # every epoch but the last must be whole
                if self.per_epoch[epoch] != self.dataset_size:
                    found.append(f"epoch {epoch}: {self.per_epoch[epoch]} of {self.dataset_size} items accounted for")
        return found


def audit(rows: list[dict[str, Any]]) -> LedgerAudit:
    """Replay ledger events (see :class:`LedgerAudit` for how restarts roll consumption back)."""
    consumed: list[tuple[str, int]] = []  # (uid, version), standing
    submitted: set[str] = set()
    in_flight: set[str] = set()
    outcomes: collections.Counter[str] = collections.Counter()
    dataset_size = None
    for row in rows:
        event = row["event"]
        if event == "start" and not row.get("recovered", True):  # a fresh run in the same directory
            consumed, submitted, outcomes = [], set(), collections.Counter()
        if event == "start":
            consumed = [(uid, v) for uid, v in consumed if v < row["version"]]
            dataset_size = row.get("dataset_size", dataset_size)
            in_flight = set()
        elif event == "submitted":
            submitted.add(row["uid"])
        elif event == "consumed":
            consumed.append((row["uid"], row["version"]))
        elif event == "stop":
            in_flight = set(row["in_flight"])
        elif event in ("accepted", "rejected", "failed", "retried", "resubmitted"):
            outcomes[event] += 1
    counts = collections.Counter(uid for uid, _ in consumed)
    per_epoch = collections.Counter(int(uid.split(":", 1)[0]) for uid in set(counts) | in_flight)
    return LedgerAudit(
        consumed=dict(counts),
        submitted=submitted,
        in_flight=in_flight,
        outcomes=dict(outcomes),
        per_epoch=dict(per_epoch),
        dataset_size=dataset_size,
    )
