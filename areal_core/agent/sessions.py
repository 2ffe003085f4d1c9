"""Sessions: what the proxy records for one agent run, and the rewards the agent assigns.

A session is addressed by an unguessable key (``secrets.token_urlsafe``); the proxy only ever
looks a session up by its key, so one agent cannot read or write another's record. The store
is shared by the proxy's thread and the rollout loop, hence the lock.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import uuid
from typing import Any

import attrs

from areal_core.api.errors import ArealError


@attrs.frozen(kw_only=True)
class Completion:
    """One model call exactly as the model saw it: template-rendered prompt ids and sampled ids."""

    id: str
    prompt_ids: list[int]
    output_ids: list[int]  # kept tokens (a stop string ends the kept prefix)
    logprobs: list[float]  # behaviour log-prob of each output token
    versions: list[int]  # weight version that produced each output token
    finish_reason: str
    text: str


class UnknownCompletion(ArealError):
    """A reward names a completion id this session does not hold."""


@attrs.define
class Session:
    """The completions of one agent run, in call order, and the rewards set on them."""

    key: str = attrs.field(repr=False)
    engine_loop: asyncio.AbstractEventLoop | None = attrs.field(default=None, repr=False)
    completions: list[Completion] = attrs.Factory(list)
    rewards: dict[str, float] = attrs.Factory(dict)  # completion id -> reward set on it
    final_reward: float | None = None
    ended: bool = False
    #: Responses API: response id -> the conversation it ended (chat messages, its reply last)
    conversations: dict[str, list[dict[str, Any]]] = attrs.field(factory=dict, repr=False)

    def add(self, completion: Completion) -> None:
        self.completions.append(completion)

    def set_reward(self, reward: float, completion_id: str | None = None) -> None:
        """Reward one completion by id, or (``None``) the final answer, i.e. the last completion."""
        if completion_id is None:
            self.final_reward = reward
            return
        if not any(c.id == completion_id for c in self.completions):
            raise UnknownCompletion(f"completion {completion_id!r} is not part of this session")
        self.rewards[completion_id] = reward

    def raw_rewards(self) -> list[float]:
        """Per completion: its own reward (0 if unset), the final reward added to the last one."""
        rewards = [self.rewards.get(c.id, 0.0) for c in self.completions]
        if rewards and self.final_reward is not None:
            rewards[-1] += self.final_reward
        return rewards

    def summary(self) -> dict[str, Any]:
        """What a session may read about itself over HTTP."""
        return {
            "completions": [
                {
                    "id": c.id,
                    "prompt_tokens": len(c.prompt_ids),
                    "completion_tokens": len(c.output_ids),
                    "finish_reason": c.finish_reason,
                    "reward": self.rewards.get(c.id),
                }
                for c in self.completions
            ],
            "final_reward": self.final_reward,
            "ended": self.ended,
        }


class SessionStore:
    """Live sessions by key; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}

    def start(self, engine_loop: asyncio.AbstractEventLoop | None = None) -> Session:
        """A new session; its model calls run on ``engine_loop`` (None: on the proxy's own loop)."""
        session = Session(key=secrets.token_urlsafe(32), engine_loop=engine_loop)
        with self._lock:
            self._sessions[session.key] = session
        return session

    def get(self, key: str) -> Session | None:
        with self._lock:
            return self._sessions.get(key)

    def end(self, key: str) -> Session | None:
        """Close a session (no more calls or rewards) and forget it; returns it for export."""
        with self._lock:
            session = self._sessions.pop(key, None)
        if session is not None:
            session.ended = True
        return session

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)


def new_completion_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"
