"""Ours vs TRL's ``GRPOTrainer`` on the same tiny job, side by side in one run (issue 17).

The job (fixed): the quickstart's task (``a+b=`` with operands 0..4, reward 1 for the exact
answer, which with 3 new tokens means the answer followed by eos) and its character tokenizer, a
randomly initialised Qwen3 (hidden 128, ffn 384, 2 layers, 4 heads / 2 kv heads, head_dim 32, tied
embeddings), groups of 8, 32 prompts per step, temperature 1, lr 3e-4 constant, clip 0.2 / 0.28,
grad clip 1, no KL. Both sides start from the same weights (built once per seed).

For each seed (ours and TRL alternate which goes first) it prints steps to 0.9 (the first step
whose 5-step mean reward is >= 0.9), seconds of training to 0.9, seconds per step, the whole
command's wall time and the final held-out greedy accuracy, then the ratios ours/TRL. TRL runs
with the thread count that a short probe finds fastest (1 or 2); ours runs as its launcher does.
The floor is the same generation and forward/backward as a bare in-process PyTorch loop.

    pip install 'areal-core[bench]'   # trl==1.16.0
    python bench/vs_trl.py [--seeds 0 1 2] [--ours-steps 160] [--trl-steps 260]
    python bench/vs_trl.py --job smollm2 ...   # the real model (issue 44): bench/vs_trl_smollm2.py

Seconds of training are the sum of ``time/step_s`` for ours (the periodic evaluation is not
counted) and the time from the start of training to the end of the step for TRL.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "quickstart" / "config.yaml"
#: The issue's overrides of the quickstart: TRL's settings.
JOB = [
    "model.tiny.intermediate_size=384",
    "train_dataset.batch_size=32",
    "actor.optimizer.lr=3e-4",
    "actor.optimizer.schedule=constant",
    "actor.eps_clip_higher=0.28",
    "gconfig.n_samples=8",  # the job's group size (the quickstart now samples 16)
]
TARGET, WINDOW = 0.9, 5


def job_config(seed: int, fileroot: Path, steps: int):
    from areal_core.config import load_config

    return load_config(str(CONFIG), [*JOB, f"seed={seed}", f"fileroot={fileroot}", f"total_train_steps={steps}"])


def build_model(seed: int, fileroot: Path) -> Path:
    """The tiny model exactly as the quickstart builds it (cached where our run will find it)."""
    from areal_core.api.dataset import corpus
    from areal_core.dataset_loading import load_dataset
    from areal_core.tiny_model import ensure_tiny_model

    config = job_config(seed, fileroot, 1)
    items = load_dataset(config.train_dataset, "train") + load_dataset(config.valid_dataset, "valid")
    return ensure_tiny_model(config.model.tiny, corpus(items), fileroot / "models", seed)


def steps_to_target(rewards: list[float]) -> int | None:
    """1-based first step whose trailing ``WINDOW``-step mean reward reaches ``TARGET``."""
    for end in range(WINDOW, len(rewards) + 1):
        if sum(rewards[end - WINDOW : end]) / WINDOW >= TARGET:
            return end
    return None


def summarize(rewards: list[float], elapsed: list[float], accuracy: float, wall: float) -> dict:
    """``elapsed[i]``: seconds of training when step i+1 ended."""
    hit = steps_to_target(rewards)
    return {
        "steps_to_target": hit,
        "seconds_to_target": elapsed[hit - 1] if hit else None,
        "seconds_per_step": elapsed[-1] / len(elapsed),
        "wall_s": wall,
        "accuracy": accuracy,
        "steps": len(rewards),
    }


# ---------------------------------------------------------------------------------------- ours
def run_ours(seed: int, fileroot: Path, steps: int) -> dict:
    trial = f"seed{seed}"
    # 32 prompts a step from the 25 items: each item twice, under distinct ids, as TRL repeats its list
    cmd = [sys.executable, "-m", "areal_core.cli", "run", "--config", str(CONFIG), *JOB, "train_dataset.repeat=2",
           f"seed={seed}", f"fileroot={fileroot}",
           f"total_train_steps={steps}",
           "stats.progress=false", "experiment_name=vs_trl", f"trial_name={trial}"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"our run (seed {seed}) failed with code {proc.returncode}:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (fileroot / "vs_trl" / trial / "stats.jsonl").read_text().splitlines()]
    elapsed, total = [], 0.0
    for row in rows:
        total += row["time/step_s"]
        elapsed.append(total)
    accuracy = [row["eval/accuracy"] for row in rows if "eval/accuracy" in row][-1]
    out = summarize([row["reward/mean"] for row in rows], elapsed, accuracy, wall)
    keys = sorted({k for row in rows for k in row if k.startswith("time/")})
    out["breakdown"] = {k: sum(row.get(k, 0.0) for row in rows) / len(rows) for k in keys}
    return out


# ---------------------------------------------------------------------------------------- TRL
def trl_main(seed: int, threads: int, steps: int, model_dir: str, out: str) -> None:
    """One TRL GRPOTrainer run in this process; writes its summary to ``out``."""
    import torch

    torch.set_num_threads(threads)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from areal_core.dataset_loading import load_dataset
    from areal_core.builtin.rewards.synthetic import exact_match

    config = job_config(seed, Path(tempfile.gettempdir()), steps)
    train = load_dataset(config.train_dataset, "train")
    valid = load_dataset(config.valid_dataset, "valid")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    # TRL samples prompts without replacement within an epoch: repeat the 25 items so one
    # "epoch" spans many steps, as our loader does by cycling epochs.
    rows = [{"prompt": it["prompt"], "answer": it["answer"]} for it in train] * (steps * 32 // len(train) + 2)

    def reward(prompts, completions, completion_ids, answer, **_):
        # the same decode (special tokens skipped) and the same function as our reward
        return [exact_match(p, tokenizer.decode(ids, skip_special_tokens=True), a)
                for p, ids, a in zip(prompts, completion_ids, answer)]

    marks: list[float] = []
    rewards: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            marks.append(time.perf_counter() - self.t0)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                rewards.append(float(logs["reward"]))

    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-"), seed=seed, use_cpu=True, report_to="none",
        save_strategy="no", logging_steps=1, disable_tqdm=True, max_steps=steps, dataloader_num_workers=0,
        per_device_train_batch_size=32 * 8, gradient_accumulation_steps=1, num_generations=8,
        max_completion_length=3, temperature=1.0, learning_rate=3e-4, lr_scheduler_type="constant",
        epsilon=0.2, epsilon_high=0.28, max_grad_norm=1.0, beta=0.0, remove_unused_columns=False,
        # TRL's GRPO defaults are bf16 autocast and activation checkpointing: both cost time here
        # (a CPU, a 0.4M-parameter model) and our side runs neither, so TRL runs fp32 without them
        bf16=False, gradient_checkpointing=False,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer, callbacks=[Clock()])
    trainer.train()
    accuracy = greedy_accuracy(trainer.model, tokenizer, valid, config.gconfig.max_new_tokens)
    Path(out).write_text(json.dumps({"rewards": rewards, "elapsed": marks, "accuracy": accuracy}))


def greedy_accuracy(model, tokenizer, items: list[dict], max_new_tokens: int) -> float:
    import torch

    from areal_core.builtin.rewards.synthetic import exact_match

    model.eval()
    hits = 0.0
    with torch.no_grad():
        for it in items:
            ids = torch.tensor([tokenizer(it["prompt"])["input_ids"]])
            out = model.generate(ids, do_sample=False, max_new_tokens=max_new_tokens,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
            hits += exact_match(it["prompt"], tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True),
                                it["answer"])
    return hits / len(items)


def run_trl(seed: int, threads: int, steps: int, model_dir: Path) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, __file__, "--_trl", str(seed), str(threads), str(steps), str(model_dir), out.name]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"TRL run (seed {seed}) failed with code {proc.returncode}:\n{proc.stderr[-3000:]}")
        data = json.loads(Path(out.name).read_text())
    return summarize(data["rewards"], data["elapsed"], data["accuracy"], wall)


# -------------------------------------------------------------------------------------- floor
def floor_main(threads: int, steps: int, model_dir: str, out: str) -> None:
    """The same generation and forward/backward as a bare loop: HF generate (KV cache), one padded
    forward/backward with the clipped GRPO objective, AdamW; no servers, no processes."""
    import random

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from areal_core.dataset_loading import load_dataset
    from areal_core.builtin.rewards.synthetic import exact_match

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = job_config(0, Path(tempfile.gettempdir()), steps)
    items = load_dataset(config.train_dataset, "train")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.0)
    rng = random.Random(0)
    times = []
    for _ in range(steps + 2):
        start = time.perf_counter()
        batch = [rng.choice(items) for _ in range(32)]
        prompts = torch.tensor([tokenizer(it["prompt"])["input_ids"] for it in batch]).repeat_interleave(8, 0)
        with torch.no_grad():
            model.eval()
            seqs = model.generate(prompts, do_sample=True, temperature=1.0, top_k=0, max_new_tokens=3,
                                  pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        n_prompt = prompts.shape[1]
        completion = seqs[:, n_prompt:]
        is_eos = (completion == tokenizer.eos_token_id).int()
        mask = (is_eos.cumsum(1) - is_eos) == 0  # up to and including the first eos
        rewards = torch.tensor([exact_match(it["prompt"], tokenizer.decode(c[m], skip_special_tokens=True),
                                            it["answer"]) for it, c, m in zip(
                                                [it for it in batch for _ in range(8)], completion, mask)])
        groups = rewards.view(32, 8)
        adv = ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-4)).view(-1)
        model.train()
        logits = model(input_ids=seqs, use_cache=False).logits[:, n_prompt - 1 : -1]
        logp = logits.log_softmax(-1).gather(-1, completion[..., None])[..., 0]
        ratio = torch.exp(logp - logp.detach())
        obj = torch.minimum(ratio * adv[:, None], ratio.clamp(1 - 0.2, 1 + 0.28) * adv[:, None])
        loss = -(obj * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - start)
    Path(out).write_text(json.dumps({"seconds_per_step": sum(times[2:]) / steps}))


def run_floor(threads: int, steps: int, model_dir: Path) -> float:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, __file__, "--_floor", str(threads), str(steps), str(model_dir), out.name]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, env=env)
        return json.loads(Path(out.name).read_text())["seconds_per_step"]


# --------------------------------------------------------------------------------------- main
def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _mean(values: list[float | None]) -> float | None:
    return None if not values or any(v is None for v in values) else sum(values) / len(values)


def main() -> None:
    if sys.argv[1:3] == ["--job", "smollm2"]:  # the real-model job: its own module and options
        from vs_trl_smollm2 import main as smollm2_main

        smollm2_main(sys.argv[3:])
        return
    if len(sys.argv) > 1 and sys.argv[1] in ("--_trl", "--_floor"):
        args = sys.argv[2:]
        if sys.argv[1] == "--_trl":
            trl_main(int(args[0]), int(args[1]), int(args[2]), args[3], args[4])
        else:
            floor_main(int(args[0]), int(args[1]), args[2], args[3])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--ours-steps", type=int, default=160, help="train steps of our runs")
    parser.add_argument("--trl-steps", type=int, default=260, help="train steps of TRL's runs")
    parser.add_argument("--probe-steps", type=int, default=12, help="TRL steps per thread count in the probe")
    parser.add_argument("--floor-steps", type=int, default=10)
    parser.add_argument("--trl-threads", type=int, choices=(1, 2), help="skip the probe: run TRL with this many")
    opts = parser.parse_args()
    try:
        import trl  # noqa: F401
    except ImportError:
        sys.exit("bench/vs_trl.py needs TRL: pip install 'areal-core[bench]' (trl==1.16.0)")
    root = Path(tempfile.mkdtemp(prefix="vs-trl-"))
    load = os.getloadavg()[0]
    models = {seed: build_model(seed, root) for seed in opts.seeds}

    threads = opts.trl_threads
    if threads is None:
        probe = {t: run_trl(opts.seeds[0], t, opts.probe_steps, models[opts.seeds[0]])["seconds_per_step"]
                 for t in (1, 2)}
        threads = min(probe, key=probe.get)
        print(f"TRL thread probe ({opts.probe_steps} steps): "
              + ", ".join(f"{t} thread(s) {s:.3f} s/step" for t, s in probe.items()) + f" -> {threads}", flush=True)
    results: dict[int, dict[str, dict]] = {}
    for k, seed in enumerate(opts.seeds):
        order = ("ours", "trl") if k % 2 == 0 else ("trl", "ours")
        results[seed] = {}
        for side in order:
            if side == "ours":
                results[seed][side] = run_ours(seed, root, opts.ours_steps)
            else:
                results[seed][side] = run_trl(seed, threads, opts.trl_steps, models[seed])
            r = results[seed][side]
            print(f"seed {seed} {side:<4}: steps to {TARGET} {_fmt(r['steps_to_target'], 'd')}, "
                  f"{_fmt(r['seconds_to_target'], '.1f')} s, {r['seconds_per_step']:.3f} s/step, "
                  f"wall {r['wall_s']:.0f} s, accuracy {r['accuracy']:.2f}", flush=True)
    floor = {t: run_floor(t, opts.floor_steps, models[opts.seeds[0]]) for t in (1, 2)}
    load = (load + os.getloadavg()[0]) / 2

    keys = [("steps_to_target", "steps to 0.9", "d"), ("seconds_to_target", "s to 0.9", ".1f"),
            ("seconds_per_step", "s per step", ".3f"), ("wall_s", "wall s", ".0f"), ("accuracy", "accuracy", ".2f")]
    print(f"\njob: {' '.join(JOB)}; ours {opts.ours_steps} steps, TRL {opts.trl_steps} steps ({threads} thread(s));"
          f" machine: {os.cpu_count()} CPUs, mean 1-min load {load:.1f}\n")
    print(f"{'seed':<5}" + "".join(f"{'ours ' + name:>18}{'TRL ' + name:>18}" for _, name, _ in keys))
    for seed in opts.seeds:
        ours, theirs = results[seed]["ours"], results[seed]["trl"]
        print(f"{seed:<5}" + "".join(f"{_fmt(ours[k], f):>18}{_fmt(theirs[k], f):>18}" for k, _, f in keys))
    print("\nratios ours/TRL (mean over seeds):")
    for k, name, _ in keys[:4]:
        ours_mean = _mean([results[s]["ours"][k] for s in opts.seeds])
        trl_mean = _mean([results[s]["trl"][k] for s in opts.seeds])
        ratio = None if ours_mean is None or not trl_mean else ours_mean / trl_mean
        print(f"  {name:<12} {_fmt(ratio, '.2f')}")
    print("  goals: s to 0.9 <= 0.50, s per step <= 1.00, accuracy 1.00 every seed")
    breakdown = {k: _mean([results[s]["ours"]["breakdown"].get(k, 0.0) for s in opts.seeds])
                 for k in results[opts.seeds[0]]["ours"]["breakdown"]}
    print("\nours, mean seconds per step: " + ", ".join(f"{k[5:]} {v:.3f}" for k, v in breakdown.items()))
    print("floor (bare in-process loop: generate + forward/backward + AdamW): "
          + ", ".join(f"{t} thread(s) {s:.3f} s/step" for t, s in floor.items()))


if __name__ == "__main__":
    main()
