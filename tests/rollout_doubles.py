"""Test double for rollout logic tests: an in-process engine that follows the InferenceEngine contract."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Callable

from areal_core.config import Config
from areal_core.api.engine import GenerationRequest, GenerationResponse, InferenceEngine
from areal_core.builtin.platform_cpu.platform import CpuPlatform

Script = Callable[[GenerationRequest], list[int]]


def counting_script(request: GenerationRequest) -> list[int]:
    """Default script: ``max_new_tokens`` tokens 1, 2, 3, ..."""
    return [1 + i for i in range(request.sampling.max_new_tokens)]


class ScriptedEngine(InferenceEngine):
    """Emits ``script(request)`` one token per ``delay(request)`` seconds, each tagged with the version
    current when it was produced. ``pause()`` aborts every in-flight request (the token being produced
    is lost, earlier ones are kept) and each continues with its remaining budget after ``resume()``.
    """

    name = "scripted"

    def __init__(
        self, *, script: Script = counting_script, delay: Callable[[GenerationRequest], float] = lambda r: 0.0005
    ) -> None:
        super().__init__(Config(), CpuPlatform())
        self.script = script
        self.delay = delay
        self.version = 0
        self.aborts = 0  # in-flight requests interrupted by pause()
        self.tokens = 0  # tokens produced so far, all requests
        self.in_flight = 0
        self.holding = False  # the pause in force is a keep pause (HoldingEngine)
        self._resumed = threading.Event()
        self._resumed.set()

    def launch_servers(self, scheduler) -> list[str]:
        raise NotImplementedError("ScriptedEngine runs in-process; it has no servers to launch")

    def attach(self, addresses: list[str]) -> None:
        """Nothing to attach: generation happens in-process."""

    def health(self) -> list[bool]:
        return [True]

    async def agenerate(self, request: GenerationRequest) -> GenerationResponse:
        start = time.monotonic()
        target = self.script(request)[: request.sampling.max_new_tokens]
        stops = set(request.sampling.stop_token_ids)
        end = next((i + 1 for i, t in enumerate(target) if t in stops), len(target))
        target = target[:end]
        output: list[int] = []
        versions: list[int] = []
        self.in_flight += 1
        try:
            while len(output) < len(target):
                if not self._resumed.is_set():  # aborted (or held): wait for resume, then continue
                    self.aborts += not self.holding
                    while not self._resumed.is_set():
                        await asyncio.sleep(0.001)
                    continue
                version = self.version  # what this token is produced with
                await asyncio.sleep(self.delay(request))
                if not self._resumed.is_set() and not self.holding:
                    continue  # a pause arrived while this token was being produced: it is lost
                output.append(target[len(output)])
                versions.append(version)
                self.tokens += 1
        finally:
            self.in_flight -= 1
        stopped = bool(output) and output[-1] in stops
        return GenerationResponse(
            input_ids=list(request.input_ids),
            output_ids=output,
            logprobs=[-0.5] * len(output),
            versions=versions,
            stop_reason="stop" if stopped else "length",
            latency=time.monotonic() - start,
        )

    def pause(self) -> None:
        self.holding = False
        self._resumed.clear()

    def resume(self) -> None:
        self._resumed.set()

    def load_weights_from_disk(self, path: str, version: int) -> None:
        self.set_version(version)

    def set_version(self, version: int) -> None:
        self.version = version

    def close(self) -> None:
        """Nothing to release."""


class HoldingEngine(ScriptedEngine):
    """A ScriptedEngine with ``pause_keeping`` (``SupportsKeepPause``): the token being produced is
    kept, requests wait for ``resume`` and go on; nothing counts as aborted."""

    def pause_keeping(self) -> None:
        self.holding = True
        self._resumed.clear()
