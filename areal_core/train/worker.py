"""Training worker process: one rank of the FSDP2 policy, driven by the controller over RPC.

``python -m areal_core.train.worker --rank R --world-size W --controller 127.0.0.1:PORT``
connects back to the controller (authkey from ``AREAL_TRAIN_AUTHKEY``), then runs the commands it
receives (:class:`Build`, then :class:`Op` s of the :data:`OPS` table) until :class:`Shutdown` or the
controller goes away.
torch.distributed reads RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT from the environment.
"""

from __future__ import annotations

import argparse
import os
import socket
import traceback
from multiprocessing.connection import Client, Connection
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from areal_core.config import Config
    from areal_core.train.fsdp_policy import FSDPPolicy

AUTHKEY_ENV = "AREAL_TRAIN_AUTHKEY"


def no_delay(conn: Connection) -> Connection:
    """Turn Nagle's algorithm off on ``conn``'s TCP socket. A message over 16 KiB (a train step's
    batch) goes out as a 4-byte header write and a body write; with Nagle the body waits for the
    header's delayed ACK, ~40 ms per call on Linux loopback."""
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    finally:
        sock.close()
    return conn


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
    """Create the policy: process group, sharded model, optimizer."""

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


#: Every training operation, declared once: its name (what commands and error messages carry) ->
#: the :class:`FSDPPolicy` method each rank runs. Workers dispatch through it; the controller's
#: :class:`~areal_core.train.worker_group.TrainWorkerGroup` sends :class:`Op` s naming its keys.
OPS: dict[str, str] = {
    "ComputeLogprobs": "compute_logprobs",
    "TrainStep": "ppo_update",
    "SaveHF": "save_hf",
    "SaveCheckpoint": "save_checkpoint",
    "LoadCheckpoint": "load_checkpoint",  # returns the restored step
    "OpenWeightChannel": "open_weight_channel",  # returns an error message or None
    "SendWeights": "send_weights",  # all ranks gather, rank 0 sends; returns an error message or None
    "CloseWeightChannel": "close_weight_channel",
}


@attrs.frozen
class Op:
    """One training operation for every rank: a key of :data:`OPS` and its method's arguments."""

    name: str = attrs.field(validator=attrs.validators.in_(OPS))
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = attrs.Factory(dict)

    def run(self, engine: FSDPPolicy) -> Any:
        return getattr(engine, OPS[self.name])(*self.args, **self.kwargs)


@attrs.frozen
class Shutdown:
    """Release the process group and exit."""


def command_name(cmd: object) -> str:
    """``TrainStep``, ``Build``, ...: how messages name a command."""
    return cmd.name if isinstance(cmd, Op) else type(cmd).__name__


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
                    raise RuntimeError(f"{command_name(cmd)} arrived before Build; the controller must build first")
                else:
                    value = cmd.run(engine)
                conn.send(Reply(rank, value if rank == 0 else None))
            except Exception:
                conn.send(Reply(rank, error=traceback.format_exc()))
    finally:
        if engine is not None:
            engine.destroy()


def _flush_denormals() -> None:
    """Flush denormal floats to zero in this process: CPU math on them is slow (the quickstart's
    train step took ~7% longer) and what they add is below fp32's normal range (~1e-38). Only here,
    in a process that does nothing but train: it is process-wide, and code that needs subnormals
    (e.g. hypothesis's float strategies) fails under it."""
    import numpy
    import torch

    for dtype in (numpy.float16, numpy.float32, numpy.float64):
        numpy.finfo(dtype)  # cached now: computed later, numpy would warn its smallest subnormal is 0
    torch.set_flush_denormal(True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--controller", required=True, help="HOST:PORT of the controller's listener")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(int(os.environ.get("AREAL_NUM_THREADS", "1")))
    _flush_denormals()
    os.environ.update(RANK=str(args.rank), WORLD_SIZE=str(args.world_size), LOCAL_RANK=str(args.rank))
    host, _, port = args.controller.rpartition(":")
    conn = no_delay(Client((host, int(port)), authkey=bytes.fromhex(os.environ[AUTHKEY_ENV])))
    conn.send(Hello(args.rank))
    try:
        serve(conn, args.rank)
    finally:
        conn.close()


if __name__ == "__main__":
    # Re-import so pickled commands and replies name ``areal_core.train.worker``, not ``__main__``.
    from areal_core.train.worker import main as _main

    _main()
