"""AgentWorkflow: run ``n_samples`` agents per prompt against the proxy and export what they did.

An agent is either an async function ``agent(base_url, api_key, data) -> reward | None`` run on
the rollout loop, or a program (``agent.command``) run per sample with ``OPENAI_BASE_URL`` and
``OPENAI_API_KEY`` set and the task item as JSON on stdin; its reward is the last stdout line
(a number or ``{"reward": r}``), else whatever it set through ``POST /v1/reward``. Either way
the agent only sees an OpenAI endpoint and a session key. The rollout runner runs the
episodes, so the staleness bound and interruptible generation apply as to any workflow.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from areal_core.agent.export import ExportMode, export_session
from areal_core.agent.proxy import AgentProxy
from areal_core.agent.proxy_server import ProxyServer
from areal_core.agent.parser_choice import tool_parser
from areal_core.api.engine import InferenceEngine
from areal_core.api.errors import ArealError
from areal_core.rollout.dataloader import EPOCH_KEY
from areal_core.api.trajectory import Trajectory

if TYPE_CHECKING:
    from areal_core.trainer import WorkflowFactory, Planes

logger = logging.getLogger(__name__)

AgentFn = Callable[[str, str, dict[str, Any]], Awaitable[float | None]]
MODEL_ENV = "OPENAI_MODEL"  # the model name an agent program may send (any name is accepted)


class AgentWorkflow:
    """Each call runs ``n_samples`` agents concurrently, one proxy session each (the GRPO group)."""

    def __init__(
        self,
        server: ProxyServer,
        agent: AgentFn | list[str],
        *,
        n_samples: int,
        gamma: float = 1.0,
        export: ExportMode = "concat",
        timeout: float = 300.0,
    ) -> None:
        if isinstance(agent, list) and not agent:
            raise ArealError("agent: give an async agent function or a non-empty command (agent.command)")
        self.server, self.proxy = server, server.proxy
        self.agent = agent
        self.n_samples = n_samples
        self.gamma, self.export, self.timeout = gamma, export, timeout

    async def __call__(self, engine: InferenceEngine, data: dict[str, Any]) -> list[Trajectory] | None:
        if engine is not self.proxy.engine:
            raise ArealError("AgentWorkflow was given another engine than its proxy forwards to")
        base_url = self.server.base_url if self.server.started else await asyncio.to_thread(self.server.start)
        results = await asyncio.gather(
            *(self._sample(base_url, data, i) for i in range(self.n_samples)), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        for error in errors:
            if not isinstance(error, Exception):  # cancellation and the like
                raise error
            cause = f" ({error.__cause__!r})" if error.__cause__ else ""
            logger.warning("agent run on prompt id=%r failed: %r%s", data.get("id"), error, cause)
        if len(errors) == len(results):
            raise errors[0]
        trajectories = [t for r in results if not isinstance(r, BaseException) for t in r]
        return trajectories or None

    async def _sample(self, base_url: str, data: dict[str, Any], index: int) -> list[Trajectory]:
        session = self.proxy.sessions.start(asyncio.get_running_loop())
        task = {k: v for k, v in data.items() if not k.startswith("_")}
        try:
            reward = await asyncio.wait_for(self._run(base_url, session.key, task), self.timeout)
            if reward is not None:
                session.set_reward(float(reward))
        finally:
            self.proxy.sessions.end(session.key)
        info = {"epoch": data.get(EPOCH_KEY, 0), "sample_index": index, "agent_reward": session.final_reward}
        return export_session(session, gamma=self.gamma, mode=self.export, prompt_id=str(data["id"]), info=info)

    async def _run(self, base_url: str, key: str, task: dict[str, Any]) -> float | None:
        if callable(self.agent):
            return await self.agent(base_url, key, task)
        return await run_agent_program(self.agent, base_url, key, task)

    def close(self) -> None:
        """Stop the proxy server (the trainer calls this when its planes stop; it starts lazily)."""
        self.server.close()


async def run_agent_program(command: list[str], base_url: str, api_key: str, task: dict[str, Any]) -> float | None:
    """Run ``command`` as one agent: env carries the endpoint and key, stdin the task as JSON."""
    env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key}
    env.setdefault(MODEL_ENV, "areal-policy")
    proc = await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        out, err = await proc.communicate(json.dumps(task).encode())
    except BaseException:  # timeout or cancellation: the program must not outlive its episode
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-5:]
        raise ArealError(f"agent program {command[0]!r} exited with code {proc.returncode}: {' | '.join(tail)}")
    return parse_reward_line(out.decode(errors="replace"))


def parse_reward_line(stdout: str) -> float | None:
    """The reward on the last non-empty stdout line: a number or ``{"reward": r}``; else None."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    try:
        value = json.loads(lines[-1])
    except ValueError:
        return None
    if isinstance(value, dict):
        value = value.get("reward")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def agent_workflow(agent: AgentFn | None = None) -> WorkflowFactory:
    """A ``Trainer(config, workflow=...)`` factory: ``agent``, or ``config.agent.command`` when None.

    The proxy forwards to the trainer's engine with the trainer's tokenizer (or
    ``agent.chat_template``), parses tool calls with ``agent.tool_parser``, and stops with the planes.
    """

    def factory(planes: Planes) -> AgentWorkflow:
        config = planes.config
        template = config.agent.chat_template or getattr(planes.tokenizer, "chat_template", None)
        proxy = AgentProxy(
            planes.engine,
            planes.tokenizer,
            config.gconfig,
            chat_template=config.agent.chat_template or None,
            max_body_bytes=config.agent.max_body_bytes,
            tool_parser=tool_parser(config.agent.tool_parser, template, planes.plugins),
        )
        command = list(config.agent.command)
        if agent is None and not command:
            from areal_core.api.errors import ConfigError

            raise ConfigError("agent.command", "is empty; set the agent program to run or pass an agent function")
        workflow = AgentWorkflow(
            ProxyServer(proxy, config.agent.host or planes.scheduler.bind_host, config.agent.port),
            agent if agent is not None else command,
            n_samples=config.gconfig.n_samples,
            gamma=config.agent.gamma,
            export=config.agent.export,
            timeout=config.agent.timeout,
        )
        planes.on_exit(workflow.close)
        return workflow

    return factory
