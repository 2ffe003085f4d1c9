"""The training worker group: the controller's handle of the training workers; starts them, sends
commands (:data:`~areal_core.train.worker.OPS`), watches them.

Every call is sent to all ranks (the engine's methods are collective) and waits for every reply
while polling the worker processes, so a worker that dies makes the call raise promptly with the
tail of its log instead of hanging. After any failure the workers are stopped: a half-finished
collective leaves the group unusable, so recover from a checkpoint with a new controller.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from areal_core.api.devices import trainer_devices
from areal_core.api.errors import ArealError, ProcessFailedError
from areal_core.api.scheduler import (
    HOST,
    PORT,
    ProcessHandle,
    ProcessSpec,
    Scheduler,
    log_tail,
)
from areal_core.train.worker import (
    AUTHKEY_ENV,
    Build,
    Hello,
    Op,
    Reply,
    Shutdown,
    command_name,
    no_delay,
)

if TYPE_CHECKING:
    from areal_core.api.platform import Platform
    from areal_core.api.trajectory import Trajectory
    from areal_core.api.weight_channel import ChannelSpec
    from areal_core.config import Config

_POLL_S = 0.2
_PEER_GRACE_S = 2.0  # after a worker's error, how long to wait for a peer's death to show
# glibc's malloc gives blocks over its mmap threshold (128 KB to 32 MB) back to the kernel when
# freed, and trims the heap's top: every train step then faulted its activations and logit chunks
# in afresh, page by page (SmolLM2: about 600,000 page faults a step, a fifth of a one-thread
# trainer's time in the kernel). With no mmap and no trim the heap keeps them: no faults after the
# first step, and a step 1.1x faster. Only where the user's environment sets no GLIBC_TUNABLES.
MALLOC_TUNABLES = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"


def malloc_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``GLIBC_TUNABLES`` for a training worker: :data:`MALLOC_TUNABLES`, unless ``environ`` has its own."""
    return {} if "GLIBC_TUNABLES" in environ else {"GLIBC_TUNABLES": MALLOC_TUNABLES}


class TrainWorkerError(ProcessFailedError):
    """A training worker died or a command failed on it; the message carries its log tail."""


class WeightGroupError(ArealError):
    """The engine's weight channel failed; the training workers and their group are intact."""


class TrainWorkerGroup:
    """``config.actor.world_size`` worker processes running one FSDP2 engine together.

    Use as ``with TrainWorkerGroup(...) as trainer:`` (starts and stops) or call ``start()`` /
    ``stop()`` yourself.
    """

    def __init__(
        self,
        config: Config,
        platform: Platform,
        scheduler: Scheduler,
        model_path: str,
        run_dir: Path,
        *,
        startup_timeout: float = 600.0,
    ) -> None:
        self.config = config
        self.platform = platform
        self.scheduler = scheduler
        self.model_path = str(model_path)
        self.run_dir = Path(run_dir)
        self.startup_timeout = startup_timeout
        self.step = 0  # train steps done (restored by load_checkpoint)
        self.handles: list[ProcessHandle] = []
        self._conns: list[Connection] = []
        self._listener: Listener | None = None

    @property
    def world_size(self) -> int:
        return self.config.actor.world_size

    def log_file(self, rank: int) -> Path:
        return self.run_dir / "logs" / f"trainer{rank}.log"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the workers and build the model on each; returns when all are ready."""
        if self.handles:
            raise RuntimeError("TrainWorkerGroup.start() was already called; create a new controller to restart")
        authkey = os.urandom(16)
        self._listener = Listener((self.scheduler.bind_host, 0), authkey=authkey)
        host, port = self.scheduler.host, self._listener.address[1]
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        # rank 0 hosts the rendezvous on its node: the others learn where once it is placed
        env = {
            AUTHKEY_ENV: authkey.hex(),
            "MASTER_ADDR": HOST,
            "MASTER_PORT": PORT,
            "AREAL_ACTIVE_PLATFORM": self.platform.name,
            **malloc_env(os.environ),
        }
        for rank in range(self.world_size):
            if rank == 1:
                env = {**env, "MASTER_ADDR": self.handles[0].host, "MASTER_PORT": str(self.handles[0].port)}
            spec = ProcessSpec(
                name=f"trainer{rank}",
                cmd=[
                    sys.executable, "-m", "areal_core.train.worker",
                    "--rank", str(rank), "--world-size", str(self.world_size), "--controller", f"{host}:{port}",
                ],
                env=env,
                threads=self.config.actor.threads_per_worker,
                cpus=tuple(self.config.actor.cpus),
                devices=trainer_devices(self.config, self.platform, rank),
                log_file=str(self.log_file(rank)),
                role="trainer",
            )
            self.handles.append(self.scheduler.start(spec))
        try:
            self._conns = self._accept_workers(authkey)
            self._call(Build(self.config, self.model_path), timeout=self.startup_timeout)
        except BaseException:
            self.stop()
            raise

    def _accept_workers(self, authkey: bytes) -> list[Connection]:
        """Accept one connection per rank (in a thread, so we can watch the processes)."""
        by_rank: dict[int, Connection] = {}
        failures: list[str] = []
        closing = threading.Event()

        def accept_loop() -> None:
            while len(by_rank) < self.world_size and not closing.is_set():
                try:
                    conn = no_delay(self._listener.accept())
                except (OSError, AuthenticationError):  # a stray client
                    continue
                try:
                    hello = conn.recv()
                except Exception as exc:  # noqa: BLE001 - reported by the waiting thread
                    failures.append(f"a worker's first message could not be read: {exc!r}")
                    return
                if isinstance(hello, Hello) and not closing.is_set():
                    by_rank[hello.rank] = conn
                else:
                    conn.close()

        thread = threading.Thread(target=accept_loop, name="train-accept", daemon=True)
        thread.start()
        deadline = time.monotonic() + self.startup_timeout
        try:
            while thread.is_alive():
                thread.join(_POLL_S)
                self._check_alive(range(self.world_size), "while starting")
                if failures:
                    raise TrainWorkerError(failures[0])
                if time.monotonic() > deadline:
                    raise TrainWorkerError(
                        f"training workers did not connect within {self.startup_timeout:.0f}s; "
                        f"see the logs in {self.log_file(0).parent}"
                    )
        finally:
            if thread.is_alive():  # wake the blocked accept() so the thread ends
                closing.set()
                with Client(self._listener.address, authkey=authkey) as wake:
                    wake.send(None)
                thread.join()
        return [by_rank[r] for r in range(self.world_size)]

    def stop(self) -> None:
        """Ask the workers to exit, then terminate any still running (idempotent)."""
        for conn in self._conns:
            try:
                conn.send(Shutdown())
            except OSError:
                pass
        deadline = time.monotonic() + 10.0
        while self._conns and any(h.alive() for h in self.handles) and time.monotonic() < deadline:
            time.sleep(0.05)
        self._terminate()

    def _terminate(self) -> None:
        """Stop the worker processes now (SIGTERM, then SIGKILL) and close the sockets."""
        for handle in self.handles:
            handle.stop()
        for conn in self._conns:
            conn.close()
        self._conns = []
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def __enter__(self) -> TrainWorkerGroup:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ commands
    def compute_logprobs(self, trajs: list[Trajectory]) -> list[list[float]]:
        """Current-policy (proximal) log-probs per trajectory, aligned to its tokens."""
        return self._call(Op("ComputeLogprobs", ([list(t.input_ids) for t in trajs],)))

    def train_step(
        self,
        trajs: list[Trajectory],
        advantages: list[float],
        prox_logprobs: list[list[float]] | None,
        *,
        recompute_prox: bool = False,
    ) -> dict[str, float]:
        """The PPO update over all minibatches; returns its stats and advances ``step``.

        ``recompute_prox``: the workers take the proximal log-probs themselves (fused into the
        update's forward where the algorithm allows; see ``FSDPPolicy.ppo_update``). The stats'
        ``time/rpc_s`` is this call's time outside rank 0's update: pickling, transfer, replies.
        """
        start = time.perf_counter()
        stats = self._call(Op("TrainStep", (trajs, list(advantages), prox_logprobs), {"recompute_prox": recompute_prox}))
        worker_s = sum(v for k, v in stats.items() if k.startswith("time/"))
        stats["time/rpc_s"] = max(0.0, time.perf_counter() - start - worker_s)
        self.step += 1
        return stats

    def save_hf(self, path: str) -> None:
        """Write a Hugging Face model directory (weights, config, tokenizer) at ``path``."""
        self._call(Op("SaveHF", (str(path),)))

    def save_checkpoint(self, path: str) -> None:
        """Write a resumable DCP checkpoint (model, optimizer, schedule, RNG, step)."""
        self._call(Op("SaveCheckpoint", (str(path),)))

    def load_checkpoint(self, path: str) -> None:
        """Restore a checkpoint written by :meth:`save_checkpoint`."""
        self.step = self._call(Op("LoadCheckpoint", (str(path),)))

    # ------------------------------------------------------------------ collective weight path
    @property
    def rendezvous_host(self) -> str:
        """Rank 0's address: it hosts the weight channel's rendezvous (its TCPStore)."""
        if not self.handles:
            raise RuntimeError("the training workers are not running; call start() first")
        return self.handles[0].host

    def open_weight_channel(self, spec: ChannelSpec) -> None:
        """Every rank opens the engine's weight channel; rank 0 joins the servers' group (blocks
        until all members joined)."""
        self._raise_weight_error(self._call(Op("OpenWeightChannel", (spec,))))

    def send_weights(self, version: int) -> None:
        """Gather the full tensors on every rank; rank 0 sends them through the channel as ``version``."""
        self._raise_weight_error(self._call(Op("SendWeights", (version,))))

    def close_weight_channel(self) -> None:
        self._call(Op("CloseWeightChannel"))

    @staticmethod
    def _raise_weight_error(error: str | None) -> None:
        if error is not None:
            raise WeightGroupError(f"trainer rank 0: {error}")

    # ------------------------------------------------------------------ RPC
    def _call(self, cmd: object, timeout: float | None = None) -> Any:
        """Send ``cmd`` to every rank; return rank 0's value once all replied."""
        if not self._conns:
            raise RuntimeError(
                "the training workers are not running; call start() first (after a failure, build a new controller)"
            )
        payload = pickle.dumps(cmd)
        pending = dict(enumerate(self._conns))
        value = None
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            for rank, conn in pending.items():
                try:
                    conn.send_bytes(payload)
                except OSError:  # broken pipe: the worker died since the last call
                    raise self._lost(rank, f"before {command_name(cmd)}") from None
            while pending:
                for conn in wait(list(pending.values()), _POLL_S):
                    rank = next(r for r, c in pending.items() if c is conn)
                    reply = self._receive(conn, rank, cmd)
                    if reply.error is not None:
                        self._raise_for_error(cmd, rank, reply.error, [r for r in pending if r != rank])
                    value = reply.value if rank == 0 else value
                    del pending[rank]
                self._check_alive(pending, f"during {command_name(cmd)}")
                if deadline is not None and time.monotonic() > deadline:
                    raise TrainWorkerError(
                        f"{command_name(cmd)} took over {timeout:.0f}s on trainers {sorted(pending)}"
                    )
        except BaseException:
            self._terminate()  # survivors may be stuck in a collective: no graceful shutdown
            raise
        return value

    def _raise_for_error(self, cmd: object, rank: int, error: str, others: list[int]) -> None:
        """Blame a peer that died (the usual cause of a collective error) before the reporter."""
        deadline = time.monotonic() + _PEER_GRACE_S
        while others and time.monotonic() < deadline:
            dead = [r for r in others if not self.handles[r].alive()]
            if dead:
                last = error.strip().splitlines()[-1]
                message = self._death_message(dead[0], f"during {command_name(cmd)}")
                raise TrainWorkerError(f"{message}\n(then trainer{rank} failed: {last})")
            time.sleep(0.05)
        raise TrainWorkerError(f"{command_name(cmd)} failed on trainer{rank}:\n{error}")

    def _receive(self, conn: Connection, rank: int, cmd: object) -> Reply:
        try:
            return conn.recv()
        except (EOFError, OSError):
            raise self._lost(rank, f"during {command_name(cmd)}") from None

    def _lost(self, rank: int, when: str) -> TrainWorkerError:
        """The error for a worker whose connection broke (its process is stopped first, for its code)."""
        self.handles[rank].stop(timeout=2.0)
        return TrainWorkerError(self._death_message(rank, when))

    def _check_alive(self, ranks: Any, when: str) -> None:
        for rank in ranks:
            if not self.handles[rank].alive():
                raise TrainWorkerError(self._death_message(rank, when))

    def _death_message(self, rank: int, when: str) -> str:
        code = self.handles[rank].returncode()
        log = self.log_file(rank)
        return f"trainer{rank} exited (code {code}) {when}; last lines of {log}:\n{log_tail(log)}"
