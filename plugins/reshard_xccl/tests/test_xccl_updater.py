"""The xccl weight path with real processes: FSDP2 training workers, hf servers, gloo groups.

Correctness is bit for bit: each server's ``/weights_digest`` (sha256 of every parameter's dtype,
shape and bytes) must equal the digest of what the trainer itself saves with ``save_hf``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_core.config import Config, TinyModelSpec, load_config
from areal_core.api.engine import GenerationRequest, SamplingParams
from areal_core.api.errors import ConfigError
from areal_core.builtin.engine_hf.client import HFEngine
from areal_core.api.weight_channel import tensor_digest
from areal_core.builtin.engine_hf.server import FAIL_COMMIT_ENV
from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.plugins import load_plugins
from areal_core.resolve import adapter_weight_path_note, resolve_config
from areal_core.scheduler.local import LocalScheduler
from areal_core.tiny_model import ensure_tiny_model
from areal_core.train.worker_group import TrainWorkerGroup
from areal_core.api.trajectory import Trajectory
from areal_core.api.weight_channel import plan_buckets
from areal_reshard_xccl.updater import WeightUpdateError, XcclWeightUpdater

REPO = Path(__file__).resolve().parents[3]
CORPUS = ["0123456789+-=? abcdefghij"]


# --------------------------------------------------------------------------- pure logic


@settings(max_examples=50, deadline=None)
@given(sizes=st.lists(st.integers(1, 100), max_size=30), max_bytes=st.integers(1, 150))
def test_plan_buckets_is_an_ordered_cover_within_the_limit(sizes: list[int], max_bytes: int) -> None:
    specs = [(f"t{i}", "uint8", (n,)) for i, n in enumerate(sizes)]  # one byte per element
    buckets = [[int(name[1:]) for name in b.names] for b in plan_buckets(specs, max_bytes)]
    assert [i for b in buckets for i in b] == list(range(len(sizes)))  # every tensor once, in order
    for b in buckets:
        total = sum(sizes[i] for i in b)
        assert len(b) >= 1 and (total <= max_bytes or len(b) == 1)  # only a lone tensor may exceed
    for b, nxt in zip(buckets, buckets[1:]):  # greedy: the next tensor did not fit
        assert sum(sizes[i] for i in b) + sizes[nxt[0]] > max_bytes


# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def tied_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(TinyModelSpec(), CORPUS, tmp_path_factory.mktemp("models"), seed=0)


@pytest.fixture(scope="module")
def untied_model(tied_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3 with a separate ``lm_head.weight``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    out = tmp_path_factory.mktemp("untied")
    config = AutoConfig.from_pretrained(tied_model)
    config.tie_word_embeddings = False
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    for item in tied_model.iterdir():
        if item.name.startswith("tokenizer") or item.name == "special_tokens_map.json":
            shutil.copy2(item, out / item.name)
    return out


@attrs.frozen
class Rig:
    config: Config
    trainer: TrainWorkerGroup
    engine: HFEngine  # or another engine's client (the vLLM test)
    updater: XcclWeightUpdater
    scheduler: LocalScheduler


def make_config(root: Path, model: Path, servers: int, world_size: int, engine: str = "hf") -> Config:
    return load_config(
        None,
        [f"fileroot={root}", f"model.path={model}", f"rollout.servers={servers}", f"actor.world_size={world_size}",
         f"rollout.engine={engine}",
         "actor.weight_update=xccl", "actor.weight_chunked_mem_mb=1", "rollout.request_timeout=60",
         "rollout.server_startup_timeout=120", "total_train_steps=10"],
    )  # fmt: skip


@contextmanager
def rig(root: Path, model: Path, servers: int = 1, world_size: int = 1, engine_name: str = "hf") -> Iterator[Rig]:
    """Servers, training workers and a connected xccl updater; everything stopped on exit."""
    config = make_config(root, model, servers, world_size, engine_name)
    with ExitStack() as stack:
        scheduler = stack.enter_context(LocalScheduler(CpuPlatform()))
        engine = load_plugins().get("engine", engine_name)(config, CpuPlatform())
        stack.callback(engine.close)
        engine.launch_servers(scheduler)
        trainer = stack.enter_context(TrainWorkerGroup(config, CpuPlatform(), scheduler, str(model), config.run_dir))
        updater = load_plugins().get("weight_updater", "xccl")(config, CpuPlatform())
        updater.connect(trainer, engine)
        stack.callback(updater.close)
        yield Rig(config, trainer, engine, updater, scheduler)


def train_once(trainer: TrainWorkerGroup, seed: int) -> None:
    """One PPO step on made-up trajectories: enough to change every weight."""
    trajs = [
        Trajectory(uid=str(i), prompt_id=str(i // 2), input_ids=[3 + i, 5, 7 + seed % 5, 9, 11, 4 + i],
                   loss_mask=[0, 0, 1, 1, 1, 1], logprobs=[0.0] * 2 + [-1.0] * 4, versions=[-1, -1, 0, 0, 0, 0],
                   reward=float(i % 2))
        for i in range(4)
    ]  # fmt: skip
    trainer.train_step(trajs, [1.0, -1.0, 1.0, -1.0], None)


def trainer_digest(trainer: TrainWorkerGroup, path: Path) -> dict[str, str]:
    """Digest of what the trainer itself publishes (its HF save), independent of the xccl path."""
    from safetensors.torch import load_file

    trainer.save_hf(str(path))
    return {name: tensor_digest(t) for name, t in load_file(path / "model.safetensors").items()}


def greedy_versions(engine: HFEngine, n_requests: int) -> list[list[int]]:
    async def run() -> list[list[int]]:
        params = SamplingParams(max_new_tokens=4, greedy=True)
        requests = [GenerationRequest(input_ids=[3, 4, 5], sampling=params) for _ in range(n_requests)]
        return [r.versions for r in await asyncio.gather(*(engine.agenerate(r) for r in requests))]

    return asyncio.run(run())


def check_update(r: Rig, version: int, tmp: Path) -> None:
    """Train, check the servers differ, update, check every server equals the trainer bit for bit."""
    train_once(r.trainer, seed=version)
    expected = trainer_digest(r.trainer, tmp / f"v{version}")
    assert all(d != expected for d in r.engine.weights_digest())  # the step changed the weights
    r.engine.pause()
    try:
        r.updater.update(version)
    finally:
        r.engine.resume()
    assert r.engine.weights_digest() == [expected] * len(r.engine.addresses)
    log = (r.config.run_dir / "logs" / "hf_server0.log").read_text()
    assert f"committed {len(expected)} staged tensors as version {version}" in log  # what save_hf saves: a tied head once
    assert [h.version for h in r.engine.server_health()] == [version] * len(r.engine.addresses)
    assert greedy_versions(r.engine, len(r.engine.addresses)) == [[version] * 4] * len(r.engine.addresses)


# --------------------------------------------------------------------------- correctness


@pytest.mark.slow
def test_one_server_tied_model_is_bit_exact_after_each_update(tmp_path: Path, tied_model: Path) -> None:
    with rig(tmp_path, tied_model) as r:
        check_update(r, 1, tmp_path)
        check_update(r, 2, tmp_path)


@pytest.mark.slow
def test_two_servers_two_fsdp_ranks_untied_model_are_bit_exact(tmp_path: Path, untied_model: Path) -> None:
    with rig(tmp_path, untied_model, servers=2, world_size=2) as r:
        check_update(r, 1, tmp_path)


@pytest.mark.slow
def test_a_server_killed_mid_update_leaves_old_weights_then_a_replacement_joins(
    tmp_path: Path, tied_model: Path
) -> None:
    with rig(tmp_path, tied_model, servers=2) as r:
        check_update(r, 1, tmp_path)
        served = r.engine.weights_digest()[0]
        train_once(r.trainer, seed=2)
        r.scheduler.handles[1].stop(timeout=5)  # server 1 dies; its peers learn it from the group
        with pytest.raises(WeightUpdateError, match="version 2 failed before its commit.*previous weights"):
            r.updater.update(2)
        survivor = r.engine.addresses[0]
        r.engine.attach([survivor])
        assert r.engine.weights_digest() == [served]  # staged buckets were never committed
        assert [h.version for h in r.engine.server_health()] == [1]

        replacement = HFEngine(attrs.evolve(r.config, rollout=attrs.evolve(r.config.rollout, servers=1)), CpuPlatform())
        replacement.token = r.engine.token
        (new_address,) = replacement.launch_servers(r.scheduler)
        r.engine.attach([survivor, new_address])
        expected = trainer_digest(r.trainer, tmp_path / "v3")
        r.updater.update(3)  # a fresh group (new store, new name) with the replacement
        assert r.engine.weights_digest() == [expected, expected]
        assert [h.version for h in r.engine.server_health()] == [3, 3]


@pytest.mark.slow
def test_a_commit_failing_on_one_server_rolls_the_others_back(
    tmp_path: Path, tied_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two-phase commit: both servers stage version 2, one commit fails (the test hook), so the
    other rolls back; each serves exactly what it served before, and the next update reaches both."""
    with rig(tmp_path, tied_model) as r:
        check_update(r, 1, tmp_path)
        monkeypatch.setenv(FAIL_COMMIT_ENV, "2")  # only the server started now inherits it
        second = HFEngine(r.config, CpuPlatform())
        second.token = r.engine.token
        (failing,) = second.launch_servers(r.scheduler)
        monkeypatch.delenv(FAIL_COMMIT_ENV)
        r.engine.attach([r.engine.addresses[0], failing])
        before = r.engine.weights_digest()
        train_once(r.trainer, seed=2)
        r.engine.pause()
        try:
            with pytest.raises(WeightUpdateError, match="commit of version 2 aborted.*fails on purpose"):
                r.updater.update(2)
        finally:
            r.engine.resume()
        assert r.engine.weights_digest() == before
        assert [h.version for h in r.engine.server_health()] == [1, 0]
        check_update(r, 3, tmp_path)


@pytest.fixture(scope="module")
def wider_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = TinyModelSpec()
    spec = attrs.evolve(spec, intermediate_size=2 * spec.intermediate_size)
    return ensure_tiny_model(spec, CORPUS, tmp_path_factory.mktemp("wider"), seed=0)


@pytest.mark.slow
def test_a_bucket_the_servers_refuse_fails_the_update_cleanly(
    tmp_path: Path, tied_model: Path, wider_model: Path
) -> None:
    """A trainer whose MLP shapes differ from the servers': its buckets are refused, nothing is committed."""
    with rig(tmp_path, tied_model, servers=2) as r:
        before = r.engine.weights_digest()
        wider = make_config(tmp_path / "wider", wider_model, servers=2, world_size=1)
        with TrainWorkerGroup(wider, CpuPlatform(), r.scheduler, str(wider_model), wider.run_dir) as other:
            updater = XcclWeightUpdater(wider, CpuPlatform())
            updater.connect(other, r.engine)
            with pytest.raises(WeightUpdateError, match="does not match the model's"):
                updater.update(5)
            updater.close()
        assert r.engine.weights_digest() == before
        assert [h.version for h in r.engine.server_health()] == [0, 0]
        r.updater.connect(r.trainer, r.engine)  # the servers left its group for the other one's
        check_update(r, 6, tmp_path)


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_quickstart_trains_with_xccl_weight_updates(tmp_path: Path) -> None:
    cmd = [
        sys.executable, "-m", "areal_core.launcher.local", str(REPO / "examples/quickstart/train.py"),
        "--config", str(REPO / "examples/quickstart/config.yaml"), f"fileroot={tmp_path}",
        "actor.weight_update=xccl", "total_train_steps=3", "gconfig.n_samples=4", "train_dataset.batch_size=4",
        "valid_dataset.size=4", "stats.eval_every=3", "stats.progress=false",
    ]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    run_dir = tmp_path / "quickstart" / "trial0"
    rows = [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(row["time/weight_update_s"] > 0 for row in rows)
    server_log = (run_dir / "logs" / "hf_server0.log").read_text()
    assert "as version 3" in server_log and "committed" in server_log  # the xccl path, not disk
    assert not (run_dir / "weights").exists()


@pytest.mark.slow
def test_vllm_engine_serves_the_trainers_weights_after_an_xccl_update(tmp_path: Path, tied_model: Path) -> None:
    """Greedy outputs of the vLLM servers equal transformers' on the weights the trainer saves."""
    if importlib.util.find_spec("areal_engine_vllm") is None or importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm or plugins/engine_vllm is not installed here; the hf tests above cover the xccl path")
    from transformers import AutoModelForCausalLM

    with rig(tmp_path, tied_model, engine_name="vllm") as r:
        train_once(r.trainer, seed=1)
        r.trainer.save_hf(str(tmp_path / "v1"))
        r.engine.pause()
        try:
            r.updater.update(1)
        finally:
            r.engine.resume()
        reference = AutoModelForCausalLM.from_pretrained(tmp_path / "v1").eval()
        prompts = [[3, 4, 5], [7, 8, 9, 10], [12]]

        async def run() -> list[list[int]]:
            params = SamplingParams(max_new_tokens=8, greedy=True)
            requests = [GenerationRequest(input_ids=p, sampling=params) for p in prompts]
            return [resp.output_ids for resp in await asyncio.gather(*(r.engine.agenerate(q) for q in requests))]

        import torch

        for prompt, output in zip(prompts, asyncio.run(run())):
            out = reference.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=8, pad_token_id=0)
            assert output == out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("engine", ["hf", "vllm", "sglang"])
def test_lora_over_xccl_takes_disk_where_the_channel_takes_full_weights_only(engine: str, capsys) -> None:
    from areal_core.cli import main
    from areal_core.trainer import Trainer

    if engine != "hf" and importlib.util.find_spec(f"areal_engine_{engine}") is None:
        pytest.skip(f"plugins/engine_{engine} is not installed: pip install -e plugins/engine_{engine}")
    config = load_config(None, ["actor.lora.rank=4", "actor.weight_update=xccl", f"rollout.engine={engine}"])
    plugins = load_plugins()
    resolved, _ = resolve_config(config, plugins)
    takes = plugins.get("engine", engine).channel_takes_adapter
    assert takes == (engine == "hf") and resolved.actor.weight_update == ("xccl" if takes else "disk")
    note = adapter_weight_path_note(config, plugins)
    assert note == (None if takes else f"engine {engine!r} loads LoRA adapters from disk only: "
                    "actor.weight_update=xccl uses the disk path for the adapter")
    # without LoRA, or asked for disk, nothing changes
    for other in (attrs.evolve(config, actor=attrs.evolve(config.actor, lora=None)),
                  attrs.evolve(config, actor=attrs.evolve(config.actor, weight_update="disk"))):
        assert resolve_config(other, plugins)[0].actor.weight_update == other.actor.weight_update
    # a run says why (its config.yaml is the resolved config); `areal config` prints the path the
    # run takes and says why on stderr
    capsys.readouterr()
    assert Trainer(config, plugins).config == resolved
    assert capsys.readouterr().out == ("" if note is None else f"areal: {note}\n")
    assert main(["config", "actor.lora.rank=4", "actor.weight_update=xccl", f"rollout.engine={engine}"]) == 0
    out, err = capsys.readouterr()
    assert f"weight_update: {resolved.actor.weight_update}" in out and (note is None or f"areal: note: {note}\n" in err)


def test_lora_over_xccl_without_the_disk_updater_says_what_to_install(areal_plugins) -> None:
    import areal_engine_sglang
    import areal_reshard_xccl

    areal_plugins.add(areal_reshard_xccl)
    areal_plugins.add(areal_engine_sglang)
    config = load_config(None, ["actor.lora.rank=4", "actor.weight_update=xccl", "rollout.engine=sglang"])
    with pytest.raises(ConfigError) as err:
        resolve_config(config, areal_plugins.load())
    assert str(err.value) == (
        "actor.weight_update: xccl: engine 'sglang' loads LoRA adapters from disk only, and weight_updater 'disk' "
        "is not installed; pip install areal-reshard-disk (installed weight_updaters: xccl)"
    )
