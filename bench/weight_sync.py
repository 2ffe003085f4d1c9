"""Weight-sync throughput, side by side in one run, for ~50 MB and ~500 MB of fp32 parameters.

Contenders, interleaved so machine load drifts hit all alike (min/median/max of ``--reps``), each
warm before it is timed (untimed rounds first: the servers' receive buffers are recycled from the
third update on, as in training):
  xccl       our ``xccl`` update end to end: pause, gather + bucketed gloo broadcast from the
             training worker to one server of ``--engine`` (hf, or vllm: vLLM's weight-transfer
             engines with our ``areal_gloo`` backend), commit, resume (one row per bucket size);
  broadcast  a raw ``dist.broadcast`` of the same tensors, one per tensor, between this process
             and a bare receiver process (no framework);
  disk       our ``disk`` update end to end: pause, save_hf + rename, server load, prune, resume;
  safetensors a raw ``save_file`` + ``load_file`` of the same tensors in this process.
Under each of ours, its breakdown (medians): pause and resume; xccl's send (gather, pack, wire and
the servers' receive and digest, as the trainer sees it) and commit; disk's save and load.

With ``--lora``, instead: bytes and seconds per update of a LoRA adapter vs the full model
(``disk`` and ``xccl`` to one hf server), on bench/train_step.py's 94M-parameter model.

    python bench/weight_sync.py [--reps 3] [--buckets 32,128,512] [--engine hf|vllm] [--lora]
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import torch
import torch.distributed as dist

from areal_core.config import TinyModelSpec, load_config
from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.plugins import load_plugins
from areal_core.api.scheduler import ProcessSpec
from areal_core.scheduler.local import LocalScheduler
from areal_core.tiny_model import ensure_tiny_model

SIZES = {  # Qwen3 shapes whose fp32 parameters come to about 50 MB and 500 MB (tiny vocabulary)
    "50MB": TinyModelSpec(hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=4, head_dim=64,
                          intermediate_size=1536),
    "500MB": TinyModelSpec(hidden_size=1024, num_layers=10, num_heads=16, num_kv_heads=8, head_dim=64,
                           intermediate_size=3072),
}  # fmt: skip
CORPUS = ["0123456789+-=? abcdefghij"]
TIMEOUT = datetime.timedelta(seconds=120)
WARM_UPDATES = 2  # untimed updates per contender: a server receives into recycled buffers from the third on


_STORES: list[dist.TCPStore] = []  # a group keeps using its store


def _group(port: int, rank: int) -> dist.ProcessGroupGloo:
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=TIMEOUT)
    _STORES.append(store)
    return dist.ProcessGroupGloo(dist.PrefixStore("raw", store), rank, 2, TIMEOUT)


def _raw_broadcast(group: dist.ProcessGroupGloo, tensors: list[torch.Tensor]) -> None:
    """Every tensor broadcast from rank 0 (asynchronously, then waited), then a barrier."""
    for work in [group.broadcast(t, 0) for t in tensors]:
        work.wait()
    group.barrier().wait()


def raw_receiver(port: int, weights: str, rounds: int) -> None:
    """The bare receiving process of the raw-broadcast baseline."""
    from safetensors.torch import load_file

    torch.set_num_threads(1)
    tensors = list(load_file(weights).values())
    group = _group(port, 1)
    for _ in range(rounds):
        _raw_broadcast(group, tensors)


def _timed(fn: Callable[[], None], times: list[float]) -> None:
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)


class _Timing:
    """``target`` with the calls named in ``parts`` (method -> part) timed: each part's seconds
    since :meth:`take` (the breakdown of one update)."""

    def __init__(self, target: object, parts: dict[str, str]) -> None:
        self._target, self._parts, self.seconds = target, parts, dict.fromkeys(parts.values(), 0.0)

    def __getattr__(self, name: str):
        value = getattr(self._target, name)
        if name not in self._parts:
            return value

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return value(*args, **kwargs)
            finally:
                self.seconds[self._parts[name]] += time.perf_counter() - start

        return timed

    def take(self) -> dict[str, float]:
        seconds, self.seconds = self.seconds, dict.fromkeys(self._parts.values(), 0.0)
        return seconds


def _served_version(engine) -> int:
    """The first server's weight version (hf: ``/health``; vllm: ``/areal/state``)."""
    states = engine.server_states() if hasattr(engine, "server_states") else engine.server_health()
    return states[0].version


def bench_size(
    label: str, spec: TinyModelSpec, root: Path, reps: int, bucket_mbs: list[int], engine_name: str
) -> list[tuple]:
    from safetensors.torch import load_file, save_file

    from areal_core.api.scheduler import free_port
    from areal_core.train.worker_group import TrainWorkerGroup

    model = ensure_tiny_model(spec, CORPUS, root / "models", seed=0)
    weights = model / "model.safetensors"
    tensors = list(load_file(weights).values())
    mb = sum(t.numel() * t.element_size() for t in tensors) / 2**20
    config = load_config(None, [f"fileroot={root / label}", f"model.path={model}", "rollout.servers=1",
                                "rollout.request_timeout=300", "total_train_steps=1", f"rollout.engine={engine_name}",
                                "rollout.server_startup_timeout=900"])  # fmt: skip
    plugins = load_plugins()
    times: dict[str, list[float]] = {}
    parts: dict[str, dict[str, list[float]]] = {}  # contender -> part -> seconds per timed update
    with LocalScheduler(CpuPlatform()) as scheduler:
        engine = plugins.get("engine", engine_name)(config, CpuPlatform())
        engine.launch_servers(scheduler)
        with TrainWorkerGroup(config, CpuPlatform(), scheduler, str(model), config.run_dir) as workers:
            trainer = _Timing(workers, {"send_weights": "send", "save_hf": "save"})
            server = _Timing(engine, {"load_weights_from_disk": "load"})
            disk = plugins.get("weight_updater", "disk")(config, CpuPlatform())
            disk.connect(trainer, server)
            xccl = {}
            for bucket_mb in bucket_mbs:
                cfg = attrs.evolve(config, actor=attrs.evolve(config.actor, weight_chunked_mem_mb=bucket_mb))
                xccl[bucket_mb] = plugins.get("weight_updater", "xccl")(cfg, CpuPlatform())
            port = free_port()
            receiver = scheduler.start(ProcessSpec(
                name="raw_receiver", cmd=[sys.executable, __file__, "--raw-receiver", str(port), str(weights), str((reps + 1) * len(xccl))],
                log_file=str(root / f"raw_receiver_{label}.log"),
            ))  # fmt: skip
            group = _group(port, 0)
            version = 0

            def our_update(updater, name: str | None) -> Callable[[], None]:
                """One update through ``updater``; its breakdown goes to ``parts[name]`` (None: untimed)."""

                def run() -> None:
                    nonlocal version
                    version += 1
                    start = time.perf_counter()
                    engine.pause()
                    paused = time.perf_counter()
                    try:
                        updater.update(version)
                    finally:
                        updated = time.perf_counter()
                        engine.resume()
                    split = {**trainer.take(), **server.take()}
                    split = {k: v for k, v in split.items() if v}
                    if updater is disk:
                        split["rename, prune, HTTP"] = updated - paused - sum(split.values())
                    else:
                        split["commit"] = updated - paused - sum(split.values())
                    split = {"pause": paused - start, **split, "resume": time.perf_counter() - updated}
                    for part, seconds in split.items() if name else ():
                        parts.setdefault(name, {}).setdefault(part, []).append(seconds)

                return run

            def raw_safetensors() -> None:
                path = Path(tempfile.mkdtemp(dir=root)) / "model.safetensors"
                save_file(dict(zip(map(str, range(len(tensors))), tensors)), str(path))
                load_file(str(path))
                path.unlink()

            for bucket_mb, updater in xccl.items():  # one size at a time: servers recycle its buffers
                name = f"xccl {bucket_mb} MB buckets"
                updater.connect(trainer, engine)
                for _ in range(WARM_UPDATES):
                    our_update(updater, None)()
                _raw_broadcast(group, tensors)  # warm-up: the first broadcast sets up gloo's pairs
                for _ in range(reps):
                    _timed(our_update(updater, name), times.setdefault(name, []))
                    _timed(lambda: _raw_broadcast(group, tensors), times.setdefault("raw dist.broadcast", []))
                updater.close()
            our_update(disk, None)()
            raw_safetensors()
            for _ in range(reps):
                _timed(our_update(disk, "disk"), times.setdefault("disk", []))
                _timed(raw_safetensors, times.setdefault("raw safetensors save+load", []))
            disk.close()
            receiver.stop()
            assert _served_version(engine) == version
    return [(label, name, mb, t, {p: statistics.median(s) for p, s in parts.get(name, {}).items()}) for name, t in times.items()]


def _update_bytes(directory: Path) -> int:
    """Bytes of the tensors a disk update wrote (what xccl sends too)."""
    return sum(f.stat().st_size for f in directory.glob("*.safetensors"))


def bench_lora(root: Path, reps: int) -> None:
    """Adapter vs full model: per update, the bytes moved and the seconds of ``disk`` and ``xccl``."""
    from train_step import LORA, LORA_SPEC

    from areal_core.train.worker_group import TrainWorkerGroup

    model = ensure_tiny_model(LORA_SPEC, CORPUS, root / "models", seed=0)
    plugins = load_plugins()
    rows: dict[str, tuple[int, dict[str, float]]] = {}
    for mode, extra in (("full", ()), ("lora", LORA)):
        config = load_config(None, [f"fileroot={root / mode}", f"model.path={model}", "rollout.servers=1",
                                    "rollout.request_timeout=600", "total_train_steps=1",
                                    "rollout.server_startup_timeout=900", *extra])  # fmt: skip
        seconds: dict[str, float] = {}
        with LocalScheduler(CpuPlatform()) as scheduler:
            engine = plugins.get("engine", "hf")(config, CpuPlatform())
            engine.launch_servers(scheduler)
            with TrainWorkerGroup(config, CpuPlatform(), scheduler, str(model), config.run_dir) as trainer:
                version = 0
                for name in ("disk", "xccl"):
                    updater = plugins.get("weight_updater", name)(config, CpuPlatform())
                    updater.connect(trainer, engine)
                    times: list[float] = []
                    for rep in range(reps + 1):  # the first is a warm-up
                        version += 1
                        start = time.perf_counter()
                        engine.pause()
                        try:
                            updater.update(version)
                        finally:
                            engine.resume()
                        if rep:
                            times.append(time.perf_counter() - start)
                        if name == "disk":
                            nbytes = _update_bytes(updater.version_dir(version))
                    updater.close()
                    seconds[name] = statistics.median(times)
                assert _served_version(engine) == version
        rows[mode] = (nbytes, seconds)
    print(f"\nmodel: {sum(t.numel() for t in _tensors(model)) / 1e6:.1f}M parameters; LoRA {' '.join(LORA)} "
          f"on every linear layer; hf server; median of {reps}\n")
    print(f"{'update':6} {'MiB':>9} {'disk s':>8} {'xccl s':>8}")
    for mode, (nbytes, seconds) in rows.items():
        print(f"{mode:6} {nbytes / 2**20:9.2f} {seconds['disk']:8.3f} {seconds['xccl']:8.3f}")
    (full_bytes, full_s), (lora_bytes, lora_s) = rows["full"], rows["lora"]
    print(f"\nadapter / full: bytes {lora_bytes / full_bytes:.4f}, disk seconds {lora_s['disk'] / full_s['disk']:.3f}, "
          f"xccl seconds {lora_s['xccl'] / full_s['xccl']:.3f}")


def _tensors(model_dir: Path) -> list[torch.Tensor]:
    from safetensors.torch import load_file

    return list(load_file(model_dir / "model.safetensors").values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--buckets", default="32,128,512", help="xccl bucket sizes (MB) to compare")
    parser.add_argument("--sizes", default="50MB,500MB")
    parser.add_argument("--engine", default="hf", help="the inference engine of the xccl and disk rows: hf or vllm")
    parser.add_argument("--lora", action="store_true", help="adapter vs full model updates instead (94M parameters)")
    parser.add_argument("--raw-receiver", nargs=3, metavar=("PORT", "WEIGHTS", "ROUNDS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw_receiver:
        port, weights, rounds = args.raw_receiver
        raw_receiver(int(port), weights, int(rounds))
        return
    torch.set_num_threads(1)
    if args.lora:
        with tempfile.TemporaryDirectory(prefix="weight_sync_lora_") as tmp:
            bench_lora(Path(tmp), args.reps)
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="weight_sync_") as tmp:
        for label in args.sizes.split(","):
            buckets = [int(b) for b in args.buckets.split(",")]
            rows += bench_size(label, SIZES[label], Path(tmp), args.reps, buckets, args.engine)
    print(f"\n{'size':6} {'contender':28} {'MB':>5} {'min s':>7} {'median':>7} {'max s':>7} {'MB/s':>6}  median ratio")
    for label, name, mb, times, split in rows:
        base = "raw dist.broadcast" if name.startswith("xccl") else "raw safetensors save+load" if name == "disk" else None
        median = statistics.median(times)
        ratio = ""
        if base:
            (base_times,) = [t for lab, n, _, t, _ in rows if lab == label and n == base]
            ratio = f"{statistics.median(base_times) / median:.2f} of {base}"
        print(f"{label:6} {name:28} {mb:5.0f} {min(times):7.3f} {median:7.3f} {max(times):7.3f} {mb / median:6.0f}  {ratio}")
        if split:
            print(f"{'':6}   = " + " + ".join(f"{part} {seconds:.3f}" for part, seconds in split.items()))


if __name__ == "__main__":
    main()
