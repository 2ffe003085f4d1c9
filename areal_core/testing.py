"""pytest fixtures for plugin authors (loaded through the ``pytest11`` entry point).

Example::

    def test_my_reward(areal_plugins):
        areal_plugins.add(my_plugin_module)
        plugins = areal_plugins.load()
        assert plugins.get("reward", "my_reward")("1+1=", "2", answer="2") == 1.0
"""

from __future__ import annotations

import types
from typing import Any, Iterator

import pytest

from areal_core.plugins import Plugins, load_plugins


class PluginSetFactory:
    """Builds fresh plugin sets from the built-ins plus inline plugins added by the test."""

    def __init__(self) -> None:
        self._extra: list[tuple[str, object]] = []

    def add(self, plugin: object, name: str | None = None) -> object:
        """Add an inline plugin: a module, a class/object with ``@hookimpl`` methods."""
        self._extra.append((name or getattr(plugin, "__name__", None) or f"inline-{len(self._extra)}", plugin))
        return plugin

    def add_hooks(self, name: str, **hooks: Any) -> object:
        """Add an inline plugin made of ``hook_name=function`` pairs (functions get ``@hookimpl``)."""
        from areal_core.api import hookimpl

        module = types.SimpleNamespace(**{hook: hookimpl(fn) for hook, fn in hooks.items()})
        return self.add(module, name)

    def load(self, *, autoload: bool = False) -> Plugins:
        """A fresh plugin set; entry points are loaded only with ``autoload=True``."""
        return load_plugins(autoload=autoload, extra=self._extra)


@pytest.fixture
def areal_plugins() -> Iterator[PluginSetFactory]:
    """A fresh :class:`PluginSetFactory`; the active platform is reset afterwards."""
    from areal_core.active_platform import _reset_for_tests

    yield PluginSetFactory()
    _reset_for_tests()


# --------------------------------------------------------------------------- engine test kit
# Helpers for testing an InferenceEngine against transformers (used by the hf, vLLM and SGLang tests).
# Heavy imports stay inside the functions: this module is loaded by every pytest session.


class LoopThread:
    """An asyncio loop in a background thread, as the rollout runner runs engines."""

    def __init__(self) -> None:
        import asyncio
        import threading

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def submit(self, coro: Any) -> Any:
        """Schedule ``coro`` on the loop; returns a ``concurrent.futures.Future``."""
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


def wait_for(predicate: Any, what: str, timeout: float = 60.0) -> None:
    """Poll until ``predicate()``; the deadline only guards against hanging, it asserts no timing."""
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.005)


def greedy_request(prompt: list[int], n: int, **sampling: Any) -> Any:
    """A greedy :class:`~areal_core.api.engine.GenerationRequest` for ``n`` new tokens."""
    from areal_core.api.engine import GenerationRequest, SamplingParams

    return GenerationRequest(input_ids=prompt, sampling=SamplingParams(max_new_tokens=n, greedy=True, **sampling))


def generate_all(engine: Any, requests: list[Any]) -> list[Any]:
    """Run ``requests`` concurrently through ``engine.agenerate`` and return the responses in order."""
    import asyncio

    async def run() -> list[Any]:
        return list(await asyncio.gather(*(engine.agenerate(r) for r in requests)))

    return asyncio.run(run())


def load_model(directory: Any, *, tied: bool | None = None) -> Any:
    """A float32 transformers model in eval mode (``tied`` overrides the saved tie setting)."""
    import torch
    from transformers import AutoModelForCausalLM

    extra = {} if tied is None else {"tie_word_embeddings": tied}
    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, **extra).eval()


def perturbed_model(base: Any, seed: int, scale: float = 0.3, tied: bool | None = None) -> Any:
    """The model at ``base`` with N(0, scale) noise on every parameter and no end-of-sequence id,
    so greedy outputs are long and differ between weight versions."""
    import torch

    model = load_model(base, tied=tied)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * scale)
    model.config.eos_token_id = None
    model.generation_config.eos_token_id = None
    return model


def hf_greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    """transformers' greedy continuation of ``prompt`` (``n`` tokens)."""
    import torch

    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


PAUSE_SETTLE_S = 1.0


def pause_while_running(engine: Any, submit: Any, started: Any, attempts: int = 3, *, keep: bool = False) -> Any:
    """``submit()`` a request and ``engine.pause()`` (``keep``: ``engine.pause_keeping()``) while it
    is decoding; returns its pending future.

    ``started()`` tells when the server is decoding it. On a loaded box a request can finish
    before the pause lands; then the engine is resumed and the request submitted again. A request
    the pause cut short (or holds) waits for ``resume()``; one the server finished first may still
    have its reply on the way, so it is given ``PAUSE_SETTLE_S`` to arrive.
    """
    import concurrent.futures

    for _ in range(attempts):
        future = submit()
        wait_for(lambda: started() or future.done(), "the request to start decoding")
        engine.pause_keeping() if keep else engine.pause()
        if not concurrent.futures.wait([future], timeout=PAUSE_SETTLE_S).done:  # held while paused
            return future
        engine.resume()
    raise AssertionError(f"the request finished before pause() {attempts} times in a row")


def vllm_requests_running(engine: Any) -> int:
    """``vllm:num_requests_running`` from the Prometheus metrics of ``engine``'s first vLLM server."""
    import re
    import urllib.request

    with urllib.request.urlopen(f"http://{engine.addresses[0]}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return int(sum(float(v) for v in re.findall(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", text, flags=re.M)))


def sglang_requests_running(engine: Any) -> int:
    """``num_running_reqs`` of SGLang's ``GET /v1/loads`` on ``engine``'s first server (the fake serves it too)."""
    import json
    import urllib.request

    request = urllib.request.Request(f"http://{engine.addresses[0]}/v1/loads?include=core", headers=engine._headers())
    with urllib.request.urlopen(request, timeout=10) as resp:
        return sum(load["num_running_reqs"] for load in json.loads(resp.read())["loads"])


def check_update_mid_generation(engine: Any, prompt: list[int], running: Any, versions: tuple[int, int], before: Any,
                                update: Any, n: int = 300, tol: float = 1e-3) -> None:
    """Pause ``engine`` while it greedily decodes ``n`` tokens of ``prompt`` (``running()``: the
    server is decoding), ``update()`` (which returns the model served next), resume: the one response
    is ``versions[0]`` tokens that follow ``before`` greedily, then ``versions[1]`` tokens that
    follow the updated model."""
    loop = LoopThread()
    try:
        future = pause_while_running(engine, lambda: loop.submit(engine.agenerate(greedy_request(prompt, n))), running)
        after = update()
        engine.resume()
        resp = future.result(timeout=300)
    finally:
        loop.close()
    old, new = versions
    switch = resp.versions.index(new)
    assert 0 < switch < n and resp.versions == [old] * switch + [new] * (n - switch)
    assert_greedy_under(before, prompt, resp.output_ids[:switch], tol)
    assert_greedy_under(after, prompt + resp.output_ids[:switch], resp.output_ids[switch:], tol)


def save_tokenizer_without_eos(base: Any, out: Any) -> None:
    """Save ``base``'s tokenizer to ``out`` without an end-of-sequence token: servers that stop at
    the tokenizer's eos (vLLM) then run every request to its budget, like :func:`perturbed_model`."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.eos_token = None
    tokenizer.save_pretrained(out)


class InProcessTrainer:
    """Test double of ``TrainWorkerGroup`` for the weight updaters: a transformers model in this process,
    the one at ``base`` with N(0, ``scale``) noise (:func:`perturbed_model`).

    ``disk`` uses ``save_hf``; ``xccl`` opens the engine's own weight channel in this process (as
    trainer rank 0) and sends its parameters through it, like the training workers do.
    """

    rendezvous_host = "127.0.0.1"  # this process hosts the channel's rendezvous

    def __init__(self, base: Any, seed: int, device: Any, scale: float = 0.2) -> None:
        self.base = base
        self.model = perturbed_model(base, seed=seed, scale=scale)
        self.device = device
        self._channel: Any = None

    def save_hf(self, path: str) -> None:
        self.model.save_pretrained(path)
        save_tokenizer_without_eos(self.base, path)

    def specs(self) -> list[tuple[str, str, tuple[int, ...]]]:
        return [(name, "float32", tuple(p.shape)) for name, p in self.model.named_parameters()]

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return ((name, p.detach().to(self.device)) for name, p in self.model.named_parameters())

    def open_weight_channel(self, spec: Any) -> None:
        import attrs

        from areal_core.api.weight_channel import open_channel

        if self.device.type == "cpu" and spec.backend in ("nccl", "hccl"):  # one GPU: the engine's
            spec = attrs.evolve(spec, backend="gloo")  # nccl cannot reach a CPU trainer
        self._channel = open_channel(spec, rank=0, device=self.device)
        self._channel.join()

    def send_weights(self, version: int) -> None:
        assert self._channel is not None, "open_weight_channel first"
        self._channel.send(self, version)

    def close_weight_channel(self) -> None:
        if self._channel is not None:
            self._channel.leave()
            self._channel = None


def assert_greedy_under(model: Any, prefix: list[int], tokens: list[int], tol: float = 1e-3) -> None:
    """Each of ``tokens`` is a (near-)argmax of ``model`` given everything before it.

    Teacher-forced, so one near-tie between two fp32 implementations cannot derail the rest of a
    long sequence, while tokens chosen by other weights (e.g. stale ones) still fail.
    """
    import torch

    ids = torch.tensor([prefix + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prefix) - 1 : -1]
    _assert_near_argmax(logits, tokens, tol)


def assert_greedy_on_kept_cache(before: Any, after: Any, prefix: list[int], tokens: list[int], switch: int,
                                tol: float = 1e-3) -> None:
    """``tokens[switch:]`` are (near-)argmaxes of ``after`` decoding on top of the KV cache that
    ``before`` computed for ``prefix + tokens[:switch - 1]`` (a request held through a weight update,
    ``rollout.pause_mode: keep``); teacher-forced, like :func:`assert_greedy_under`."""
    import torch
    from transformers import DynamicCache

    from areal_core.builtin.engine_hf.generator import cache_kwarg

    cache = {cache_kwarg(before): DynamicCache(config=before.config)}  # filled by ``before``, read by ``after``
    with torch.no_grad():
        before(torch.tensor([prefix + tokens[: switch - 1]]), use_cache=True, **cache)
        logits = after(torch.tensor([tokens[switch - 1 : -1]]), use_cache=True, **cache).logits[0]
    _assert_near_argmax(logits, tokens[switch:], tol, first=switch)


def _assert_near_argmax(logits: Any, tokens: list[int], tol: float, first: int = 0) -> None:
    """Row ``i`` of ``logits`` gives ``tokens[i]`` a logit within ``tol`` of its maximum (``first``:
    the index of ``tokens[0]`` in the message)."""
    import torch

    logits = logits.float()
    chosen = logits.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)
    gaps = logits.max(-1).values - chosen
    assert float(gaps.max()) <= tol, f"token {first + int(gaps.argmax())} is {float(gaps.max()):.4f} below the argmax"


def random_adapter(base_dir: Any, out: Any, lora: Any, seed: int, scale: float = 0.3) -> Any:
    """A peft LoRA adapter (``lora``: an ``actor.lora`` section) on the model at ``base_dir`` with
    N(0, scale) weights, saved at ``out``; returns the model with it merged in."""
    import torch
    from peft import get_peft_model

    from areal_core.api.lora import peft_config

    model = get_peft_model(load_model(base_dir), peft_config(lora, str(base_dir)))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * scale)
    model.save_pretrained(out)
    return model.merge_and_unload().eval()


def assert_logprobs_under(model: Any, responses: list[Any], atol: float, temperature: float = 1.0) -> None:
    """Each response's sampled log-probs (at ``temperature``) equal ``model``'s within ``atol``."""
    import torch

    for resp in responses:
        ids = torch.tensor([resp.input_ids + resp.output_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(resp.input_ids) - 1 : -1].float() / temperature
        want = logits.log_softmax(-1).gather(-1, torch.tensor(resp.output_ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(resp.logprobs), want, atol=atol, rtol=0)


def check_adapter_updates(engine: Any, base_dir: Any, out_root: Any, lora: Any, prompts: list[list[int]],
                          atol: float, name_of: Any) -> None:
    """Publish random adapters as versions 1 and 2 (saved as ``out_root/v{v}``, loaded while paused)
    and check each against transformers with it merged: greedy outputs equal, every token tagged with
    the version, sampled log-probs within ``atol``; the adapter requests name (``name_of(engine)``) is
    ``areal-lora-v{v}``; and the outputs differ from the base model's."""
    from pathlib import Path

    from areal_core.api.engine import GenerationRequest, SamplingParams

    greedy = [greedy_request(p, 12) for p in prompts]
    sampled = [GenerationRequest(input_ids=p, sampling=SamplingParams(max_new_tokens=12, seed=i))
               for i, p in enumerate(prompts)]
    base = load_model(base_dir)
    assert [r.output_ids for r in generate_all(engine, greedy)] == [hf_greedy(base, p, 12) for p in prompts]
    for version in (1, 2):
        path = Path(out_root) / f"v{version}"
        merged = random_adapter(base_dir, path, lora, seed=version)
        engine.pause()
        engine.load_weights_from_disk(str(path), version)
        engine.resume()
        assert name_of(engine) == f"areal-lora-v{version}"
        outputs = generate_all(engine, greedy)
        assert [r.output_ids for r in outputs] == [hf_greedy(merged, p, 12) for p in prompts]
        assert all(r.versions == [version] * 12 for r in outputs)
        assert_logprobs_under(merged, generate_all(engine, sampled), atol)
    assert [r.output_ids for r in outputs] != [hf_greedy(base, p, 12) for p in prompts]



def drive_sink(
    name: str,
    run_dir: Any,
    steps: Any,
    *,
    resume_step: int = 0,
    options: dict[str, Any] | None = None,
    samples: Any = (),
    config: dict[str, Any] | None = None,
) -> list[str]:
    """Drive the installed stats sink ``name`` through the run's own sink runner, as one attempt of
    a run in ``run_dir`` would (``resume_step > 0``: the attempt recovered from that step). Each
    step first gets the ``samples`` rows of that step, then the scalars ``{"reward/mean": step / 8 +
    resume_step, "eval/accuracy": 0.25}``, so the attempts' values differ. Returns the lines the
    runner reported (failures); a sink's tests read back what the tracker stored."""
    from pathlib import Path

    from areal_core.api.stats_sink import SinkRun
    from areal_core.sink_runner import RunStats

    lines: list[str] = []
    run = SinkRun(run_dir=Path(run_dir), experiment_name="exp", trial_name="t1", config=config or {"seed": 7},
                  options={}, resume_step=resume_step)  # fmt: skip
    sink = load_plugins().get("stats_sink", name)
    stats = RunStats({name: sink}, run, options={name: options or {}}, history=[], timeout=60, report=lines.append)
    for step in steps:
        stats.log_samples(step, [row for row in samples if row.step == step])
        stats.log_scalars(step, {"reward/mean": step / 8 + resume_step, "eval/accuracy": 0.25})
    stats.close()
    return lines


def sink_test_rows() -> list[Any]:
    """A sample table for :func:`drive_sink`: three held-out answers at step 2, one training sample."""
    from areal_core.api.stats_sink import SampleRow

    return [
        SampleRow(step=2, split=split, id=str(i), prompt=f"What is {i} + 1?", response=f"It is {i + 1}.",
                  reward=1.0, output_tokens=5 + i, version=2)
        for i, split in enumerate(["eval", "eval", "eval", "train"])
    ]  # fmt: skip
