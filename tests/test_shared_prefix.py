"""actor.share_prefixes: shared prefixes run once, and a step equals the one without sharing."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from areal_core.api.errors import ConfigError
from areal_core.api.trajectory import Trajectory
from areal_core.config import load_config
from areal_core.train.packing import pack_in_one_row
from areal_core.train.shared_prefix import MIN_PREFIX, Cluster, micro_batches, pack_sharing_prefixes, plan_clusters
from test_train_engine import make_engine, model_path, process_group  # noqa: F401 - fixtures

# sequences drawn from a few stems, so that prefixes are shared at several depths
_stems = st.lists(st.integers(2, 5), min_size=0, max_size=14)
_batches = st.lists(
    st.tuples(st.integers(0, 2), _stems, st.lists(st.integers(2, 5), min_size=1, max_size=6)), min_size=1, max_size=9
)


def _sequences(drawn: list[tuple[int, list[int], list[int]]]) -> list[list[int]]:
    roots = [[2] * 10, [3, 4] * 6, []]
    return [roots[r] + stem + tail for r, stem, tail in drawn]


@given(_batches, st.integers(1, 12))
def test_clusters_partition_the_batch_and_share_what_they_claim(drawn, min_prefix):
    seqs = _sequences(drawn)
    clusters = plan_clusters(seqs, min_prefix)
    assert sorted(i for c in clusters for i in c.members) == list(range(len(seqs)))
    for cluster in clusters:
        first = seqs[cluster.members[0]]
        if len(cluster.members) == 1:
            assert cluster.prefix == len(first)
            continue
        assert cluster.prefix >= min_prefix
        for i in cluster.members:
            assert seqs[i][: cluster.prefix] == first[: cluster.prefix] and len(seqs[i]) > cluster.prefix


@given(_batches)
def test_the_layout_gives_every_token_its_own_position(drawn):
    seqs = _sequences(drawn)
    indices = list(range(len(seqs)))
    batch = pack_sharing_prefixes(seqs, indices, 4)
    layout = batch.shared
    assert torch.equal(layout.input_ids[0][layout.expand], batch.flat_ids)
    assert torch.equal(layout.position_ids[0][layout.expand], pack_in_one_row(seqs, indices, 1).position_ids[0])
    assert layout.input_ids.shape[1] == sum(map(len, seqs)) - sum(
        (len(c.members) - 1) * c.prefix for c in plan_clusters(seqs, 4) if len(c.members) > 1
    )


def test_groups_share_their_prompts_rather_than_a_common_template():
    template, rng = [1] * 10, random.Random(0)
    prompts = [template + [rng.randrange(2, 9) for _ in range(20)] for _ in range(3)]
    seqs = [p + [rng.randrange(2, 9) for _ in range(5)] for p in prompts for _ in range(4)]
    clusters = plan_clusters(seqs, MIN_PREFIX)
    assert [c.members for c in clusters] == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11)]
    assert all(c.prefix >= 30 for c in clusters)  # the prompt, and any answer tokens the group agrees on
    assert plan_clusters([[5] * 20, [5] * 20 + [6]], MIN_PREFIX) == [Cluster((0, 1), 19)]  # one token each remains


def _grpo_batch(vocab: int) -> tuple[list[Trajectory], list[float]]:
    """Three prompts x four answers of uneven lengths, plus one prompt alone; behaviour log-probs
    near the model's own."""
    rng = random.Random(1)
    trajs, advantages = [], []
    for g, n in enumerate((4, 4, 4, 1)):
        prompt = [rng.randrange(2, vocab) for _ in range(rng.randint(10, 20))]
        for k in range(n):
            answer = [rng.randrange(2, vocab) for _ in range(rng.randint(1, 12))]
            ids = prompt + answer
            mask = [0] * len(prompt) + [1] * len(answer)
            trajs.append(Trajectory(uid=f"{g}-{k}", prompt_id=str(g), input_ids=ids, loss_mask=mask,
                                    logprobs=[-3.3 * m for m in mask], versions=[0 if m else -1 for m in mask],
                                    reward=float(k % 2)))  # fmt: skip
            advantages.append(1.0 if k % 2 else -1.0)
    return trajs, advantages


@pytest.mark.parametrize(
    "overrides",
    [(), ("actor.ppo_n_minibatches=2", "model.gradient_checkpointing=true"), ("actor.max_tokens_per_mb=64",)],
)
def test_a_step_with_shared_prefixes_equals_one_without(process_group, model_path, overrides):  # noqa: F811
    results = []
    for share in (False, True):
        engine = make_engine(model_path, f"actor.share_prefixes={str(share).lower()}", "actor.optimizer.lr=1.0",
                             "actor.optimizer.eps=1.0", "actor.max_tokens_per_mb=4096", *overrides)  # fmt: skip
        trajs, advantages = _grpo_batch(engine.model.lm.config.vocab_size)
        before = {n: p.full_tensor().detach().clone() for n, p in engine.model.named_parameters()}
        prox = engine.compute_logprobs([t.input_ids for t in trajs])
        stats = engine.ppo_update(trajs, advantages, recompute_prox=True)
        params = {n: p.full_tensor().detach().clone() for n, p in engine.model.named_parameters()}
        results.append((prox, stats, params))
    (prox0, stats0, params0), (prox1, stats1, params1) = results
    assert sum(not torch.equal(before[n], p) for n, p in params0.items()) > len(params0) // 2  # the step trained
    for a, b in zip(prox0, prox1, strict=True):
        torch.testing.assert_close(torch.tensor(b), torch.tensor(a), rtol=2e-5, atol=2e-6)
    for key in ("loss", "grad_norm", "clip_frac", "n_loss_tokens", "entropy"):
        assert stats1[key] == pytest.approx(stats0[key], rel=1e-5, abs=1e-7), key
    for name, param in params0.items():
        torch.testing.assert_close(params1[name], param, rtol=2e-5, atol=2e-6, msg=name)


def test_sharing_and_sequence_parallel_are_one_or_the_other():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["actor.world_size=2", "actor.sequence_parallel=2", "actor.share_prefixes=true"])
    assert str(info.value).startswith("actor.share_prefixes: true does not combine with actor.sequence_parallel")


@given(_batches, st.integers(6, 60))
def test_micro_batches_fit_the_budget_after_sharing(drawn, budget):
    seqs = _sequences(drawn)
    bins = micro_batches(seqs, budget, 4)
    assert sorted(i for b in bins for i in b) == list(range(len(seqs)))
    for b in bins:
        chosen = [seqs[i] for i in b]
        shared = pack_sharing_prefixes(chosen, range(len(chosen)), 4).shared.input_ids.shape[1]
        assert shared <= budget or len(b) == 1 or max(len(s) for s in chosen) > budget  # only what cannot fit goes over
