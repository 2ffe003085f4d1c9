"""Device check: xccl weight update on a real accelerator, then vLLM greedy == transformers greedy.

    python scripts/device_check_xccl.py --platform cuda|npu [--engine vllm] [--workdir DIR]

Builds the tiny Qwen3, starts one inference server and one training rank on the platform's
devices (server first, trainer next), connects the xccl updater (group backend =
platform.dist_backend: NCCL/HCCL), runs one PPO step, pushes the weights as version 1, and checks
that the server's greedy continuations equal transformers' on the weights the trainer saved.
Prints one line ``XCCL_CHECK OK ...`` or ``XCCL_CHECK FAIL ...`` and exits 0/1.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from areal_core.config import TinyModelSpec, load_config
from areal_core.engine import GenerationRequest, SamplingParams
from areal_core.errors import ArealError
from areal_core.platform import activate_platform, resolve_platform
from areal_core.plugins import load_plugins
from areal_core.scheduler.local import LocalScheduler
from areal_core.tiny_model import ensure_tiny_model
from areal_core.train.controller import TrainController
from areal_core.trajectory import Trajectory

PROMPTS = [[3, 4, 5], [7, 8, 9, 10], [12]]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--platform", required=True)
    parser.add_argument("--engine", default="vllm")
    parser.add_argument("--workdir", default=None)
    ns = parser.parse_args()
    root = Path(ns.workdir or tempfile.mkdtemp(prefix="areal-xccl-check-"))
    plugins = load_plugins()
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
        engine = plugins.get("engine", ns.engine)(config, platform)
        stack.callback(engine.close)
        engine.launch_servers(scheduler)
        trainer = stack.enter_context(TrainController(config, platform, scheduler, str(model), config.run_dir))
        updater = plugins.get("weight_updater", "xccl")(config, platform)
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
        f"XCCL_CHECK {'OK' if ok else 'FAIL'} platform={platform.name} backend={platform.dist_backend} "
        f"engine={ns.engine} setup+update={time.perf_counter() - start:.1f}s"
        + ("" if ok else f" served={served} expected={expected}")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ArealError as exc:  # e.g. the platform is missing, or a server cannot join the group
        print(f"XCCL_CHECK FAIL {exc}")
        sys.exit(1)
