"""Training worker process: one rank of the FSDP2 engine, driven by the controller over RPC.

``python -m areal_core.train.worker --rank R --world-size W --controller 127.0.0.1:PORT``
connects back to the controller (authkey from ``AREAL_TRAIN_AUTHKEY``), then runs the commands it
receives (pickled attrs objects below) until :class:`Shutdown` or the controller goes away.
torch.distributed reads RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT from the environment.
"""

from __future__ import annotations

import argparse
import os
import traceback
from multiprocessing.connection import Client, Connection
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from areal_core.config import Config
    from areal_core.train.fsdp_policy import FSDPPolicy
    from areal_core.api.trajectory import Trajectory
    from areal_core.api.weight_channel import ChannelSpec

AUTHKEY_ENV = "AREAL_TRAIN_AUTHKEY"


@attrs.frozen
class Hello:
    """First message of a worker: which rank this connection belongs to."""

    rank: int


@attrs.frozen
class Reply:
    """A worker's answer to one command: its value (rank 0 only) or a formatted traceback."""

    rank: int
    value: Any = None
    error: str | None = None


@attrs.frozen
class Build:
    """Create the engine: process group, sharded model, optimizer."""

    config: Config
    model_path: str

    def build(self) -> FSDPPolicy:
        from areal_core.active_platform import current_platform
        from areal_core.plugins import load_plugins
        from areal_core.train.fsdp_policy import FSDPPolicy

        algorithm = load_plugins().get("algorithm", self.config.actor.algorithm)(self.config.actor)
        engine = FSDPPolicy(self.config, current_platform(), self.model_path, algorithm)
        engine.initialize()
        return engine


@attrs.frozen
class ComputeLogprobs:
    sequences: list[list[int]]

    def run(self, engine: FSDPPolicy) -> list[list[float]]:
        return engine.compute_logprobs(self.sequences)


@attrs.frozen
class TrainStep:
    trajs: list[Trajectory]
    advantages: list[float]
    prox_logprobs: list[list[float]] | None
    recompute_prox: bool = False

    def run(self, engine: FSDPPolicy) -> dict[str, float]:
        return engine.ppo_update(self.trajs, self.advantages, self.prox_logprobs, recompute_prox=self.recompute_prox)


@attrs.frozen
class SaveHF:
    path: str

    def run(self, engine: FSDPPolicy) -> None:
        engine.save_hf(self.path)


@attrs.frozen
class SaveCheckpoint:
    path: str

    def run(self, engine: FSDPPolicy) -> None:
        engine.save_checkpoint(self.path)


@attrs.frozen
class LoadCheckpoint:
    path: str

    def run(self, engine: FSDPPolicy) -> int:
        engine.load_checkpoint(self.path)
        return engine.step


@attrs.frozen
class OpenWeightChannel:
    """Open the engine's weight channel (rank 0 joins the servers); returns an error message or None."""

    spec: ChannelSpec

    def run(self, engine: FSDPPolicy) -> str | None:
        return engine.open_weight_channel(self.spec)


@attrs.frozen
class SendWeights:
    """All ranks gather, rank 0 sends through the channel; returns an error message or None."""

    version: int

    def run(self, engine: FSDPPolicy) -> str | None:
        return engine.send_weights(self.version)


@attrs.frozen
class CloseWeightChannel:
    def run(self, engine: FSDPPolicy) -> None:
        engine.close_weight_channel()


@attrs.frozen
class Shutdown:
    """Release the process group and exit."""


def serve(conn: Connection, rank: int) -> None:
    """Answer commands until :class:`Shutdown` or EOF (the controller exited)."""
    engine: FSDPPolicy | None = None
    try:
        while True:
            try:
                cmd = conn.recv()
            except EOFError:
                return
            if isinstance(cmd, Shutdown):
                conn.send(Reply(rank))
                return
            try:
                if isinstance(cmd, Build):
                    engine, value = cmd.build(), None
                elif engine is None:
                    raise RuntimeError(f"{type(cmd).__name__} arrived before Build; the controller must build first")
                else:
                    value = cmd.run(engine)
                conn.send(Reply(rank, value if rank == 0 else None))
            except Exception:
                conn.send(Reply(rank, error=traceback.format_exc()))
    finally:
        if engine is not None:
            engine.destroy()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--controller", required=True, help="HOST:PORT of the controller's listener")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(int(os.environ.get("AREAL_NUM_THREADS", "1")))
    os.environ.update(RANK=str(args.rank), WORLD_SIZE=str(args.world_size), LOCAL_RANK=str(args.rank))
    host, _, port = args.controller.rpartition(":")
    conn = Client((host, int(port)), authkey=bytes.fromhex(os.environ[AUTHKEY_ENV]))
    conn.send(Hello(args.rank))
    try:
        serve(conn, args.rank)
    finally:
        conn.close()


if __name__ == "__main__":
    # Re-import so pickled commands and replies name ``areal_core.train.worker``, not ``__main__``.
    from areal_core.train.worker import main as _main

    _main()
