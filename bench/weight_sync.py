"""Weight-sync throughput, side by side in one run, for ~50 MB and ~500 MB of fp32 parameters.

Contenders, interleaved so machine load drifts hit all alike (median of ``--reps``):
  xccl       our ``xccl`` update end to end: pause, gather + bucketed gloo broadcast from the
             training worker to one server of ``--engine`` (hf, or vllm: vLLM's weight-transfer
             engines with our ``areal_gloo`` backend), commit, resume (one row per bucket size,
             each after one untimed warm-up update);
  broadcast  a raw ``dist.broadcast`` of the same tensors, one per tensor, between this process
             and a bare receiver process (no framework);
  disk       our ``disk`` update end to end: pause, save_hf + fsync + rename, server load, resume;
  safetensors a raw ``save_file`` + ``load_file`` of the same tensors in this process.

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
    with LocalScheduler(CpuPlatform()) as scheduler:
        engine = plugins.get("engine", engine_name)(config, CpuPlatform())
        engine.launch_servers(scheduler)
        with TrainWorkerGroup(config, CpuPlatform(), scheduler, str(model), config.run_dir) as trainer:
            disk = plugins.get("weight_updater", "disk")(config, CpuPlatform())
            disk.connect(trainer, engine)
            xccl = {}
            for bucket_mb in bucket_mbs:
                cfg = attrs.evolve(config, actor=attrs.evolve(config.actor, weight_chunked_mem_mb=bucket_mb))
                xccl[bucket_mb] = plugins.get("weight_updater", "xccl")(cfg, CpuPlatform())
            port = free_port()
            receiver = scheduler.start(ProcessSpec(
                name="raw_receiver", cmd=[sys.executable, __file__, "--raw-receiver", str(port), str(weights), str(reps * len(xccl))],
                log_file=str(root / f"raw_receiver_{label}.log"),
            ))  # fmt: skip
            group = _group(port, 0)
            version = 0

            def our_update(updater) -> Callable[[], None]:
                def run() -> None:
                    nonlocal version
                    version += 1
                    engine.pause()
                    try:
                        updater.update(version)
                    finally:
                        engine.resume()

                return run

            def raw_safetensors() -> None:
                path = Path(tempfile.mkdtemp(dir=root)) / "model.safetensors"
                save_file(dict(zip(map(str, range(len(tensors))), tensors)), str(path))
                load_file(str(path))
                path.unlink()

            for bucket_mb, updater in xccl.items():  # one size at a time: servers recycle its buffers
                updater.connect(trainer, engine)
                our_update(updater)()  # warm-up: first-touch of the send and receive buffers
                for _ in range(reps):
                    _timed(our_update(updater), times.setdefault(f"xccl {bucket_mb} MB buckets", []))
                    _timed(lambda: _raw_broadcast(group, tensors), times.setdefault("raw dist.broadcast", []))
                updater.close()
            for _ in range(reps):
                _timed(our_update(disk), times.setdefault("disk", []))
                _timed(raw_safetensors, times.setdefault("raw safetensors save+load", []))
            receiver.stop()
            assert _served_version(engine) == version
    return [(label, name, mb, statistics.median(t)) for name, t in times.items()]


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
    print(f"\n{'size':6} {'contender':28} {'MB':>7} {'s':>7} {'MB/s':>8}  ratio")
    for label, name, mb, seconds in rows:
        base = "raw dist.broadcast" if name.startswith("xccl") else "raw safetensors save+load" if name == "disk" else None
        ratio = ""
        if base:
            (base_s,) = [s for lab, n, _, s in rows if lab == label and n == base]
            ratio = f"{base_s / seconds:.2f} of {base}"
        print(f"{label:6} {name:28} {mb:7.0f} {seconds:7.3f} {mb / seconds:8.0f}  {ratio}")


if __name__ == "__main__":
    main()
