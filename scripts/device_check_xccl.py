"""Device check: one xccl weight update through the engine's own weight channel on a real
accelerator, then the server's greedy output == transformers' on the trainer's weights.

    python scripts/device_check_xccl.py --platform cuda|npu|cpu --engine vllm|sglang|hf
        [--expect-backend nccl|hccl|gloo|...] [--workdir DIR] [--dry-run]

Builds the tiny Qwen3, starts one inference server and one training rank on the platform's
devices (server first, trainer next), opens the engine's weight channel (vLLM: the backend's
trainer engine from ``WeightTransferTrainerFactory``; SGLang: its group handshake; hf: gloo),
runs one PPO step, sends the weights as version 1 and compares greedy continuations. With
``--expect-backend`` the channel's backend must be that one (checked before any update).
``--dry-run`` only resolves the platform, engine and updater plugins. Prints one line
``XCCL_CHECK OK ...`` or ``XCCL_CHECK FAIL ...`` and exits 0/1.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

PROMPTS = [[3, 4, 5], [7, 8, 9, 10], [12]]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="one xccl weight update on a device, then greedy == transformers")
    parser.add_argument("--platform", required=True, help="cuda, npu (or cpu, to try the script itself)")
    parser.add_argument("--engine", default="vllm", help="the rollout engine: vllm, sglang, hf")
    parser.add_argument("--expect-backend", default=None, help="fail unless the channel uses this backend")
    parser.add_argument("--workdir", default=None, help="models, run files and logs (default: a temp folder)")
    parser.add_argument("--dry-run", action="store_true", help="resolve the plugins only; start nothing")
    return parser.parse_args(argv)


def main(ns: argparse.Namespace) -> int:
    from areal_core.config import TinyModelSpec, load_config
    from areal_core.api.engine import GenerationRequest, SamplingParams, SupportsWeightChannel
    from areal_core.active_platform import activate_platform, resolve_platform
    from areal_core.plugins import load_plugins
    from areal_core.scheduler.local import LocalScheduler
    from areal_core.tiny_model import ensure_tiny_model
    from areal_core.train.worker_group import TrainWorkerGroup
    from areal_core.api.trajectory import Trajectory

    plugins = load_plugins()
    engine_cls, updater_cls = plugins.get("engine", ns.engine), plugins.get("weight_updater", "xccl")
    if ns.dry_run:
        platform = resolve_platform(ns.platform, plugins, require_available=False)
        print(f"XCCL_CHECK DRY-RUN platform={platform.name} engine={engine_cls.name} updater={updater_cls.name}")
        return 0
    root = Path(ns.workdir or tempfile.mkdtemp(prefix="areal-xccl-check-"))
    platform = activate_platform(resolve_platform(ns.platform, plugins))
    model = ensure_tiny_model(TinyModelSpec(), ["0123456789+=abcdefghij "], root / "models", seed=0)
    config = load_config(
        None,
        [f"fileroot={root}", f"model.path={model}", f"platform={ns.platform}", f"rollout.engine={ns.engine}",
         "actor.weight_update=xccl", "rollout.request_timeout=120", "rollout.server_startup_timeout=600"],
    )  # fmt: skip
    start = time.perf_counter()
    with ExitStack() as stack:
        scheduler = stack.enter_context(LocalScheduler(platform))
        engine = engine_cls(config, platform)
        stack.callback(engine.close)
        engine.launch_servers(scheduler)
        if not isinstance(engine, SupportsWeightChannel):
            print(f"XCCL_CHECK FAIL engine={ns.engine} has no weight channel")
            return 1
        backend = engine.weight_channel("127.0.0.1", 0, "probe").backend  # a description: opens nothing
        if ns.expect_backend and backend != ns.expect_backend:
            print(f"XCCL_CHECK FAIL engine={ns.engine} platform={platform.name}: channel backend {backend!r}, "
                  f"expected {ns.expect_backend!r}")  # fmt: skip
            return 1
        trainer = stack.enter_context(TrainWorkerGroup(config, platform, scheduler, str(model), config.run_dir))
        updater = updater_cls(config, platform)
        updater.connect(trainer, engine)
        stack.callback(updater.close)
        trajs = [
            Trajectory(uid=str(i), prompt_id=str(i // 2), input_ids=[3 + i, 5, 7, 9, 11, 4 + i],
                       loss_mask=[0, 0, 1, 1, 1, 1], logprobs=[0.0] * 2 + [-1.0] * 4, versions=[-1, -1, 0, 0, 0, 0],
                       reward=float(i % 2))
            for i in range(4)
        ]  # fmt: skip
        trainer.train_step(trajs, [1.0, -1.0, 1.0, -1.0], None)
        trainer.save_hf(str(root / "v1"))
        engine.pause()
        try:
            updater.update(1)
        finally:
            engine.resume()

        async def generate() -> list[list[int]]:
            params = SamplingParams(max_new_tokens=8, greedy=True)
            requests = [GenerationRequest(input_ids=p, sampling=params) for p in PROMPTS]
            return [r.output_ids for r in await asyncio.gather(*(engine.agenerate(q) for q in requests))]

        served = asyncio.run(generate())
    import torch
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(root / "v1", dtype=torch.float32).eval()
    expected = [
        reference.generate(torch.tensor([p]), do_sample=False, max_new_tokens=8, pad_token_id=0)[0, len(p) :].tolist()
        for p in PROMPTS
    ]
    ok = served == expected
    print(
        f"XCCL_CHECK {'OK' if ok else 'FAIL'} platform={platform.name} backend={backend} "
        f"engine={ns.engine} setup+update={time.perf_counter() - start:.1f}s"
        + ("" if ok else f" served={served} expected={expected}")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    args = parse_args()
    from areal_core.api.errors import ArealError

    try:
        sys.exit(main(args))
    except ArealError as exc:  # e.g. the platform is missing, or a server cannot join the group
        print(f"XCCL_CHECK FAIL {exc}")
        sys.exit(1)
