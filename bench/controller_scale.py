"""The single rollout controller at cluster scale, by simulation: one process, thousands of episodes.

    python bench/controller_scale.py [--servers 16 64 256] [--in-flight 8192] [--rate 2500] [--repeats 1]
        [--pause-mode abort|keep] [--tuning controller [python]]

Each configuration runs in a fresh subprocess pinned to one CPU core (``--cpus``). It holds the
real :class:`~areal_core.rollout.runner.RolloutRunner` (staleness manager, ledger on disk,
failure tracker) over :class:`replay_engine.ReplayLatencyEngine` standing for ``--servers``
servers (the real router, pause gate and segment re-submission; the server call is simulated).
Episodes are the real :class:`~areal_core.rollout.rlvr.RLVRWorkflow` (``--n-samples`` requests
each, tokenizer decode included, an in-process exact-match reward) and, for ``--agent-share`` of
them, multi-turn agents (``--turns`` chat calls each) talking HTTP to the real agent proxy
(:class:`~areal_core.agent.AgentProxy` under uvicorn, in the same process). A trainer thread takes
batches of ``--batch`` episodes (default: as many as are in flight, so the staleness window,
``(eta + 1)`` batches, is wide enough for the long tail), "trains" for ``--train-s`` and runs a
weight update (``pause`` aborts every running request, or with ``--pause-mode keep`` holds it,
``--update-s``, ``set_version``, ``resume``), handing the batch over to be freed during the update
as the trainer does (the resume waits for that, and for a full collection when one is due, as the trainer's does).

Latencies: a request's decode time is lognormal around ``--median-s`` real seconds with shape
``--sigma`` (default 60 s, sigma 1: p99 ~ 10 min), replayed ``time_factor`` times faster. The
factor is chosen so the pipe offers ``--rate`` requests/s at ``--in-flight`` episodes (estimated by
Monte Carlo over the episode mix). Responses carry 2 tokens per real second (payloads scaled down
~15x from a 30 tokens/s decode to fit the shared box's memory).

The process runs under the interpreter settings a run's controller uses
(:mod:`areal_core.controller_tuning`: GIL switch interval, the cyclic GC on a clock), or with
``--tuning python`` under Python's defaults; ``--tuning controller python`` alternates the two and
prints their ratios.

Printed per configuration, over a ``--seconds`` window after ``--warmup-s``:
sustained requests/s; controller CPU per request (process CPU time / requests, all threads);
p50/p99 added latency per request (time in ``engine.agenerate_group`` minus the group's slowest
simulated latency, for groups no weight update interrupted) and per agent call (HTTP call to the
proxy minus the simulated latency); the cyclic GC's pauses (ms per second of window, longest
pause); memory per in-flight episode (RSS growth from just before the controller started /
episodes running or ready); the ledger audit (every episode consumed exactly once); how long
each weight update kept generation paused (``--update-s``, or longer where freeing the batch and
a full collection took longer).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import contextlib
import gc
import itertools
import json
import os
import pstats
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from replay_engine import Lognormal, ReplayLatencyEngine
from spread import spread

from areal_core.agent import AgentProxy, AgentWorkflow, ProxyServer
from areal_core.config import load_config
from areal_core.controller_tuning import collect_all_soon, controller_tuning
from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.rollout.runner import RolloutRunner
from areal_core.rollout.dataloader import EPOCH_KEY
from areal_core.rollout.ledger import Ledger, audit, read_ledger
from areal_core.rollout.rlvr import RLVRWorkflow
from areal_core.tiny_model import build_char_tokenizer

ALPHABET = ["0123456789+=abcdefghijklmnopqrstuvwxyz ,.:?"]


class ExactMatch:
    """In-process reward (the reward plane's worker processes are benchmarked elsewhere)."""

    async def score(self, prompt: str, completion: str, data: dict[str, Any]) -> float:
        return float(completion.strip() == data.get("answer"))

    async def score_many(self, jobs: Sequence[tuple[str, str, dict[str, Any]]]) -> list[float]:
        return [await self.score(*job) for job in jobs]


class Mixed:
    """Routes an episode to the agent or the RLVR workflow by its item's ``kind``."""

    def __init__(self, rlvr: RLVRWorkflow, agent: AgentWorkflow) -> None:
        self.rlvr, self.agent = rlvr, agent

    async def __call__(self, engine: Any, data: dict[str, Any]) -> Any:
        return await (self.agent if data["kind"] == "agent" else self.rlvr)(engine, data)


class ChatAgent:
    """A multi-turn agent: ``turns`` chat calls over HTTP, each followed by a tool result message.
    Each call carries a fresh seed, so its simulated latency is known and its added latency measured."""

    def __init__(self, engine: ReplayLatencyEngine, turns: int) -> None:
        self.engine, self.turns = engine, turns
        self.added: list[float] = []
        self.calls = 0
        self._seeds = itertools.count(1)
        self._http: Any = None

    async def __call__(self, base_url: str, key: str, data: dict[str, Any]) -> float:
        import aiohttp

        if self._http is None:
            self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        messages = [{"role": "user", "content": data["prompt"]}]
        reply = ""
        for _ in range(self.turns):
            seed = next(self._seeds)
            body = {"model": "policy", "messages": messages, "seed": seed, "max_tokens": 4096}
            loop = asyncio.get_running_loop()
            start = loop.time()
            async with self._http.post(f"{base_url}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as resp:
                answer = await resp.json()
                if resp.status != 200:
                    raise RuntimeError(f"proxy answered {resp.status}: {answer}")
            simulated = self.engine.by_seed.pop(seed, None)
            if simulated is not None and (added := self.engine.added_latency(start, simulated)) is not None:
                self.added.append(added)
            self.calls += 1
            reply = answer["choices"][0]["message"]["content"]
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "tool: ok"}]
        return float(reply.strip() == data["answer"])


def items(agent_share: float, seed: int):
    """Endless addition prompts; ``agent_share`` of them are agent episodes."""
    rng = random.Random(seed)
    for i in itertools.count():
        a, b = rng.randrange(100), rng.randrange(100)
        kind = "agent" if rng.random() < agent_share else "rlvr"
        yield {"id": i, "prompt": f"{a}+{b}=", "answer": str(a + b), "kind": kind, EPOCH_KEY: 0}


def time_factor(args: argparse.Namespace) -> tuple[float, float]:
    """The speed-up that makes ``in_flight`` episodes offer ``rate`` requests/s; also the mean
    real-time episode duration (Monte Carlo over the episode mix: an RLVR episode ends with its
    slowest of ``n_samples`` requests, an agent one with its slowest chain of ``turns`` calls)."""
    dist, rng = Lognormal(args.median_s, args.sigma, 1.0), random.Random(0)
    trials, total_time, total_requests = 20000, 0.0, 0.0
    for _ in range(trials):
        turns = args.turns if rng.random() < args.agent_share else 1
        total_time += max(sum(dist(rng)[0] for _ in range(turns)) for _ in range(args.n_samples))
        total_requests += turns * args.n_samples
    episode_s = total_time / trials
    return args.rate * episode_s / (args.in_flight * total_requests / trials), episode_s


class GcPauses:
    """A ``gc.callbacks`` entry: the duration of each cyclic GC pass, in seconds."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.pauses.append(time.perf_counter() - self._start)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """One configuration in this process; returns its figures."""
    if args.cpus:
        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: args.cpus]))
    factor, episode_real_s = time_factor(args)
    batch = args.batch or args.in_flight
    tmp = Path(tempfile.mkdtemp(prefix="areal-scale-"))
    config = load_config(None, [
        f"fileroot={tmp}", "trial_name=scale", "seed=1",
        f"rollout.servers={args.servers}",
        f"rollout.max_concurrent_rollouts={args.in_flight}",
        f"rollout.max_head_offpolicyness={args.eta}",
        f"train_dataset.batch_size={batch}",
        f"gconfig.n_samples={args.n_samples}",
        "gconfig.max_new_tokens=4096",
        f"rollout.pause_mode={args.pause_mode}",
    ])
    tokenizer = build_char_tokenizer(ALPHABET)
    engine = ReplayLatencyEngine(config, CpuPlatform(), sampler=Lognormal(args.median_s, args.sigma, factor, 2.0))
    engine.launch_servers(None)
    agent = ChatAgent(engine, args.turns)
    proxy_server = ProxyServer(AgentProxy(engine, tokenizer, config.gconfig))
    workflow = Mixed(
        RLVRWorkflow(tokenizer, config.gconfig, ExactMatch()),
        AgentWorkflow(proxy_server, agent, n_samples=args.n_samples),
    )
    ledger = Ledger(tmp / "ledger.jsonl")
    controller = RolloutRunner.from_config(engine, config, ledger=ledger)
    loader = items(args.agent_share, seed=1)
    if args.agent_share > 0:
        proxy_server.start()
    rss0 = rss_bytes()
    stop, steps, window, pauses = threading.Event(), [0], {}, []
    gc_pauses = GcPauses()
    gc.callbacks.append(gc_pauses)

    async def snapshot(opens_window: bool = False) -> dict[str, Any]:
        if opens_window:  # added latency of what starts from now: not the pipe's first fill at start
            engine.added_since = asyncio.get_running_loop().time()
        added, engine.added = engine.added, []
        agent_added, agent.added = agent.added, []
        pauses, gc_pauses.pauses = gc_pauses.pauses, []
        return {"t": time.monotonic(), "cpu": time.process_time(), "requests": engine.completed,
                "added": added, "agent_added": agent_added, "agent_calls": agent.calls, "gc_pauses": pauses}

    profiler = cProfile.Profile(time.thread_time) if args.profile else None  # CPU time: the box is shared

    async def profile(on: bool) -> None:  # cProfile follows the thread that enables it: the loop's
        if profiler is not None:
            profiler.enable() if on else profiler.disable()

    def measure() -> None:
        try:
            time.sleep(args.warmup_s)
            controller.run(profile(True))
            first = controller.run(snapshot(opens_window=True))
            in_flight = []
            while time.monotonic() - first["t"] < args.seconds:
                time.sleep(min(1.0, args.seconds))
                stats = controller.stats
                in_flight.append(stats.running)
                rss, held = rss_bytes(), stats.running + controller.staleness.ready
            last = controller.run(snapshot())
            controller.run(profile(False))
            window.update(first=first, last=last, in_flight=in_flight, rss=rss, held=held, steps=steps[0])
        finally:
            stop.set()

    tuning = controller_tuning() if args.tuning == "controller" else contextlib.nullcontext()
    with tuning, controller:
        threading.Thread(target=measure, name="measure", daemon=True).start()
        while not stop.is_set():
            try:
                batch = controller.prepare_batch(loader, workflow, timeout=1.0)
            except TimeoutError:
                continue
            steps[0] += 1
            stop.wait(args.train_s)
            paused_at = time.monotonic()
            controller.pause()
            cleaned = collect_all_soon(batch)  # as the trainer does (--tuning python: freed here, Python's own GC runs)
            stop.wait(args.update_s)
            controller.set_version(controller.version + 1)
            cleaned.wait()
            controller.resume()
            pauses.append(time.monotonic() - paused_at)
    # the agents' HTTP session dies with the loop: closing it earlier would fail running episodes
    proxy_server.close()
    ledger.close()
    if profiler is not None:
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(40)
    problems = audit(read_ledger(tmp / "ledger.jsonl")).problems()
    shutil.rmtree(tmp, ignore_errors=True)
    first, last = window["first"], window["last"]
    wall, requests = last["t"] - first["t"], last["requests"] - first["requests"]
    return {
        "servers": args.servers,
        "in_flight_target": args.in_flight,
        "in_flight_mean": statistics.fmean(window["in_flight"]) if window["in_flight"] else 0.0,
        "time_factor": factor,
        "episode_real_s": episode_real_s,
        "window_s": wall,
        "steps": window["steps"],
        "requests": requests,
        "requests_per_s": requests / wall,
        "cpu_cores": (last["cpu"] - first["cpu"]) / wall,
        "cpu_us_per_request": 1e6 * (last["cpu"] - first["cpu"]) / max(1, requests),
        "added_p50_ms": 1e3 * pct(last["added"], 0.5),
        "added_p99_ms": 1e3 * pct(last["added"], 0.99),
        "measured_requests": len(last["added"]),
        "agent_calls": last["agent_calls"] - first["agent_calls"],
        "agent_added_p50_ms": 1e3 * pct(last["agent_added"], 0.5),
        "agent_added_p99_ms": 1e3 * pct(last["agent_added"], 0.99),
        "gc_ms_per_s": 1e3 * sum(last["gc_pauses"]) / wall,
        "gc_max_ms": 1e3 * max(last["gc_pauses"], default=0.0),
        "update_pauses_s": pauses,
        "kib_per_episode": (window["rss"] - rss0) / 1024 / max(1, window["held"]),
        "ledger_problems": len(problems),
        "ledger_first_problems": problems[:3],
        "failures": controller.failures.report()[1],
    }


COLUMNS = [  # (key, header, format)
    ("requests_per_s", "req/s", "{:.0f}"),
    ("cpu_cores", "cores", "{:.2f}"),
    ("cpu_us_per_request", "CPU us/req", "{:.0f}"),
    ("added_p50_ms", "added p50 ms", "{:.2f}"),
    ("added_p99_ms", "added p99 ms", "{:.2f}"),
    ("agent_added_p50_ms", "agent p50 ms", "{:.1f}"),
    ("agent_added_p99_ms", "agent p99 ms", "{:.1f}"),
    ("gc_ms_per_s", "GC ms/s", "{:.0f}"),
    ("gc_max_ms", "GC max ms", "{:.0f}"),
    ("in_flight_mean", "in flight", "{:.0f}"),
    ("kib_per_episode", "KiB/episode", "{:.1f}"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--in-flight", type=int, default=8192, help="episodes in flight (max_concurrent_rollouts)")
    parser.add_argument("--batch", type=int, default=0, help="episodes per train step (0: --in-flight)")
    parser.add_argument("--eta", type=int, default=4, help="max_head_offpolicyness")
    parser.add_argument("--n-samples", type=int, default=4, help="requests (or agents) per episode")
    parser.add_argument("--rate", type=float, default=2500.0, help="requests/s the pipe offers")
    parser.add_argument("--agent-share", type=float, default=0.1, help="share of episodes run by agents through the proxy")
    parser.add_argument("--turns", type=int, default=3, help="chat calls per agent")
    parser.add_argument("--median-s", type=float, default=60.0, help="median real decode time of a request")
    parser.add_argument("--sigma", type=float, default=1.0, help="lognormal shape of decode times")
    parser.add_argument("--train-s", type=float, default=0.5, help="simulated train time per step")
    parser.add_argument("--update-s", type=float, default=0.1, help="simulated weight update, generation paused")
    parser.add_argument("--warmup-s", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=30.0, help="measurement window")
    parser.add_argument("--cpus", type=int, default=1, help="pin the controller to this many cores (0: no pinning)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--pause-mode", choices=["abort", "keep"], default="abort",
                        help="rollout.pause_mode: a weight update aborts running requests (re-sent after it) or holds them")
    parser.add_argument("--tuning", choices=["controller", "python"], nargs="+", default=["controller"],
                        help="interpreter settings: a run's controller's (areal_core.controller_tuning) and/or Python's "
                             "defaults; with both, their runs alternate and the ratios are printed")
    parser.add_argument("--profile", action="store_true", help="cProfile the rollout loop over the window (stderr)")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # run one configuration, print JSON
    args = parser.parse_args()
    if args.one:
        args.servers, args.tuning = args.servers[0], args.tuning[0]
        print(json.dumps(run_one(args)))
        return
    print(f"{args.in_flight} episodes in flight x {args.n_samples} requests, {args.agent_share:.0%} agent episodes "
          f"({args.turns} turns), offered {args.rate:.0f} req/s, lognormal decode median {args.median_s:.0f}s "
          f"sigma {args.sigma}, {args.cpus or 'all'} core(s), pause mode {args.pause_mode}")
    width = 15 if args.repeats == 1 else 25  # each column also has a leading space: wide values never run together
    header = f"{'servers':>8}" + "".join(f" {h:>{width}}" for _, h, _ in COLUMNS) + "  interpreter settings"
    print(header)
    for servers in args.servers:
        rows: dict[str, list[dict[str, Any]]] = {tuning: [] for tuning in args.tuning}
        for _ in range(args.repeats):  # the settings alternate, so both see the same machine
            for tuning in args.tuning:
                argv = _with_option(_with_option(sys.argv[1:], "--servers", str(servers)), "--tuning", tuning)
                out = subprocess.run([sys.executable, __file__, "--one", *argv], check=True, capture_output=True, text=True)
                rows[tuning].append(json.loads(out.stdout.strip().splitlines()[-1]))
        for tuning, runs in rows.items():
            line = f"{servers:>8}" + "".join(f" {spread([r[k] for r in runs], fmt):>{width}}" for k, _, fmt in COLUMNS)
            print(f"{line}  {tuning}")
            bad = sum(r["ledger_problems"] for r in runs)
            print(f"{'':8}time factor {runs[0]['time_factor']:.1f}, {sum(r['steps'] for r in runs)} batches taken, "
                  f"{sum(r['measured_requests'] for r in runs)} uninterrupted requests, {sum(r['agent_calls'] for r in runs)} "
                  f"agent calls measured; ledger: {'exactly once' if not bad else f'{bad} problems'}; "
                  f"weight update pauses {spread([p for r in runs for p in r['update_pauses_s']], '{:.2f}')} s")
        if len(rows) == 2:
            (a, runs_a), (b, runs_b) = rows.items()
            ratio = {k: statistics.median(r[k] for r in runs_a) / statistics.median(r[k] for r in runs_b)
                     for k in ("requests_per_s", "cpu_us_per_request")}
            print(f"{'':8}{a}/{b} (medians): req/s x{ratio['requests_per_s']:.2f}, "
                  f"CPU per request x{ratio['cpu_us_per_request']:.2f}")
        sys.stdout.flush()


def _with_option(cmd: list[str], option: str, value: str) -> list[str]:
    """``cmd`` with any ``option ...`` values replaced by ``option value``."""
    out, skipping = [], False
    for arg in cmd:
        if arg == option:
            skipping = True
            continue
        if skipping and not arg.startswith("--"):
            continue
        skipping = False
        out.append(arg)
    return [*out, option, value]


if __name__ == "__main__":
    main()
