"""From a finished session to training trajectories: turn discount, then one of two layouts.

``individual``: one trajectory per completion (its prompt masked out, its output trained).
``concat``: completions whose prompt extends the previous prompt + output token for token are
joined into one trajectory, the tokens between them (tool results, user turns, template tokens)
masked out; a completion that does not extend the chain (the template re-rendered history
differently) starts a new trajectory, so every token is exactly what the model saw.
"""

from __future__ import annotations

from typing import Any, Literal

from areal_core.agent.sessions import Completion, Session
from areal_core.api.engine import GenerationResponse
from areal_core.api.workflow import TokenSequence
from areal_core.api.trajectory import Trajectory

ExportMode = Literal["individual", "concat"]


def discount(rewards: list[float], gamma: float) -> list[float]:
    """Reward flows backwards through the turns: ``r[i] += gamma * r[i + 1]`` from the last turn."""
    out = list(rewards)
    for i in range(len(out) - 2, -1, -1):
        out[i] += gamma * out[i + 1]
    return out


def _as_response(c: Completion) -> GenerationResponse:
    return GenerationResponse(
        input_ids=c.prompt_ids,
        output_ids=c.output_ids,
        logprobs=c.logprobs,
        versions=c.versions,
        stop_reason="length" if c.finish_reason == "length" else "stop",
        latency=0.0,
    )


def _chains(completions: list[Completion]) -> list[list[Completion]]:
    """Split completions (in call order) into runs where each prompt extends the previous context."""
    chains: list[list[Completion]] = []
    context: list[int] = []
    for c in completions:
        if chains and len(c.prompt_ids) >= len(context) and c.prompt_ids[: len(context)] == context:
            chains[-1].append(c)
        else:
            chains.append([c])
        context = c.prompt_ids + c.output_ids
    return chains


def export_session(
    session: Session, *, gamma: float, mode: ExportMode, prompt_id: str, info: dict[str, Any]
) -> list[Trajectory]:
    """The session's trajectories; rewards discounted per completion (``discount``).

    A concatenated trajectory carries the discounted reward of its first completion (the return
    from its start). ``info`` is copied into every trajectory, with ``turn``/``turns`` added.
    """
    completions = session.completions
    rewards = discount(session.raw_rewards(), gamma)
    reward_of = {c.id: r for c, r in zip(completions, rewards)}
    if mode == "individual":
        groups = [[c] for c in completions]
    elif mode == "concat":
        groups = _chains(completions)
    else:
        raise ValueError(f"unknown export mode {mode!r}; expected 'individual' or 'concat'")
    trajectories = []
    turn = 0
    for group in groups:
        seq = TokenSequence()
        for c in group:
            seq.add_context(c.prompt_ids[len(seq.input_ids) :])
            seq.add_output(_as_response(c), len(c.output_ids))
        extra = {"turn": turn, "turns": len(group), "completion_ids": [c.id for c in group]}
        trajectories.append(seq.to_trajectory(prompt_id, reward_of[group[0].id], {**info, **extra}))
        turn += len(group)
    return trajectories
