"""FSDP2 policy: the trained model of one training process (rank), sharded with FSDP2.

The policy is a Hugging Face causal LM sharded with ``fully_shard`` (one unit per decoder layer,
one root); with ``actor.lora`` it carries peft LoRA adapters and only they train
(:mod:`areal_core.api.lora`). Every public method is collective: all ranks call it with the same arguments, each rank
works on a token-balanced share, and results are combined with ``torch.distributed``.
"""

from __future__ import annotations

import datetime
import math
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import torch
import torch.distributed as dist
from torch import nn

from areal_core.api.algorithm import Algorithm, LossInput
from areal_core.api import lora
from areal_core.config import sequence_parallel_problem
from areal_core.train import shared_prefix
from areal_core.train.checkpoint import load_checkpoint, save_checkpoint
from areal_core.train.logprobs import packed_token_logprobs
from areal_core.train.optim import build_optimizer, clip_grad_norm
from areal_core.train.logprob_gap import gap_stats
from areal_core.train.packing import PackedBatch, first_fit_decreasing, pack, pack_in_one_row, pack_per_token
from areal_core.train.sequence_parallel import (
    ATTENTION, SPGroup, new_sp_group, register_attention, sharded_token_logprobs,
)
from areal_core.train.safetensors_file import write_safetensors

if TYPE_CHECKING:
    from areal_core.config import Config
    from areal_core.api.platform import Platform
    from areal_core.api.trajectory import Trajectory
    from areal_core.api.weight_channel import ChannelSpec, WeightChannel

#: Files in a model directory that are weights (not copied next to saved weights by save_hf).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".safetensors.index.json", ".bin.index.json")
#: Two tokens: enough for the head to take part, so a padding micro-batch touches every parameter.
_DUMMY_SEQUENCE = [0, 0]
MINIBATCH_S = "minibatch_s/"  # stats key prefix: one optimizer step's seconds, per minibatch


class _PolicyRoot(nn.Module):
    """The root FSDP unit: its forward is the whole log-prob computation, so embedding, final
    norm and (tied) head stay gathered for exactly as long as they are used."""

    def __init__(self, lm: nn.Module, sp: SPGroup | None) -> None:
        super().__init__()
        self.lm = lm
        self.sp = sp

    def forward(
        self, batch: PackedBatch, temperature: float, chunk_size: int, keep_bytes: int, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        options = {"temperature": temperature, "chunk_size": chunk_size, "keep_bytes": keep_bytes,
                   "with_entropy": with_entropy}  # fmt: skip
        if self.sp is not None:
            return sharded_token_logprobs(self.lm, batch, self.sp, **options)
        return packed_token_logprobs(self.lm, batch, **options)


@attrs.define
class _StepStats:
    """Per-rank accumulators for one ``ppo_update``; merged over ranks by :meth:`merge`."""

    weighted: dict[str, float] = attrs.Factory(dict)  # sum of value * loss tokens
    weights: dict[str, float] = attrs.Factory(dict)
    maxima: dict[str, float] = attrs.Factory(dict)
    minima: dict[str, float] = attrs.Factory(dict)
    totals: dict[str, float] = attrs.Factory(dict)
    gaps: list[torch.Tensor] = attrs.Factory(list)  # prox - old of each loss token (logprob_gap.py)
    fresh: list[torch.Tensor] = attrs.Factory(list)  # bool: sampled by the weights the trainer holds

    def add_gaps(self, gaps: torch.Tensor, fresh: torch.Tensor) -> None:
        self.gaps.append(gaps.detach().float().cpu())
        self.fresh.append(fresh.cpu())

    def add_mean(self, key: str, value: float, weight: float) -> None:
        self.weighted[key] = self.weighted.get(key, 0.0) + value * weight
        self.weights[key] = self.weights.get(key, 0.0) + weight

    def add_extremes(self, key: str, values: torch.Tensor) -> None:
        if values.numel():
            self.add_max(f"{key}_max", float(values.max()))
            self.add_min(f"{key}_min", float(values.min()))

    def add_max(self, key: str, value: float) -> None:
        self.maxima[key] = max(self.maxima.get(key, -math.inf), value)

    def add_min(self, key: str, value: float) -> None:
        self.minima[key] = min(self.minima.get(key, math.inf), value)

    def add_algorithm_stats(self, stats: dict[str, float], n_loss_tokens: float) -> None:
        """``*_max``/``*_min`` keys stay extremes; every other key is a loss-token mean."""
        for key, value in stats.items():
            if key.endswith("_max"):
                self.add_max(key, float(value))
            elif key.endswith("_min"):
                self.add_min(key, float(value))
            else:
                self.add_mean(key, float(value), n_loss_tokens)

    def add_total(self, key: str, value: float) -> None:
        self.totals[key] = self.totals.get(key, 0.0) + value

    @staticmethod
    def merge(parts: list[_StepStats], mismatch_band: float) -> dict[str, float]:
        """Combine every rank's accumulators into flat stats (``mismatch/*`` from the gaps)."""
        weighted, weights = _sum_dicts(p.weighted for p in parts), _sum_dicts(p.weights for p in parts)
        out = {k: weighted[k] / weights[k] for k in weighted if weights[k] > 0}
        for p in parts:
            for k, v in p.maxima.items():
                out[k] = max(out.get(k, -math.inf), v)
            for k, v in p.minima.items():
                out[k] = min(out.get(k, math.inf), v)
        out.update(_sum_dicts(p.totals for p in parts))
        gaps = [g for p in parts for g in p.gaps]
        if gaps:
            out.update(gap_stats(torch.cat(gaps), torch.cat([f for p in parts for f in p.fresh]), mismatch_band))
        return out


def _sum_dicts(dicts: Iterator[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0.0) + v
    return out


def split_minibatches(n: int, n_minibatches: int) -> list[list[int]]:
    """Contiguous, near-equal index ranges ``0..n-1`` (the first ``n % k`` get one more)."""
    if n < n_minibatches:
        raise ValueError(
            f"{n} sequences cannot fill actor.ppo_n_minibatches={n_minibatches}; lower it or train on more samples"
        )
    base, extra = divmod(n, n_minibatches)
    bounds = [0]
    for k in range(n_minibatches):
        bounds.append(bounds[-1] + base + (k < extra))
    return [list(range(bounds[k], bounds[k + 1])) for k in range(n_minibatches)]


def token_balanced_shares(lengths: Sequence[int], n_ranks: int) -> list[list[int]]:
    """Split positions ``0..len-1`` over ranks, longest first onto the least-loaded rank."""
    loads = [0] * n_ranks
    shares: list[list[int]] = [[] for _ in range(n_ranks)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        r = min(range(n_ranks), key=lambda r: (loads[r], r))
        shares[r].append(i)
        loads[r] += lengths[i]
    return [sorted(s) for s in shares]


class FSDPPolicy:
    """The policy (+ frozen reference), AdamW and the PPO update on one rank.

    With LoRA the reference policy is the same model with its adapter disabled (no second copy),
    and weights out (sync, ``save_hf``) are the adapter's alone."""

    def __init__(self, config: Config, platform: Platform, model_path: str, algorithm: Algorithm) -> None:
        self.config = config
        self.platform = platform
        self.model_path = str(model_path)
        self.algorithm = algorithm
        self.step = 0  # train steps (ppo_update calls) done
        self.model: nn.Module | None = None
        self.ref_model: nn.Module | None = None
        self._owns_process_group = False
        self._channel: WeightChannel | None = None  # the engine's weight channel, once opened
        self._saved_buffers: frozenset[str] | None = None  # buffers the state_dict keeps (see _weights_out)
        self.sp: SPGroup | None = None  # this rank's sequence-parallel group (actor.sequence_parallel > 1)

    # ------------------------------------------------------------------ set-up
    def initialize(self) -> None:
        """Join (or create, from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT) the process group; build
        the sharded policy, the reference model if the algorithm needs one, and the optimizer."""
        from torch.distributed.device_mesh import init_device_mesh

        self.platform.init_process()
        index = 0
        if self.platform.device_type != "cpu":
            index = int(os.environ.get("LOCAL_RANK", "0")) % self.platform.device_count()
            self.platform.set_device(index)
        if not dist.is_initialized():
            dist.init_process_group(backend=self.platform.dist_backend, init_method="env://")
            self._owns_process_group = True
        self.device = self.platform.device(index)
        self.mesh = init_device_mesh(self.platform.device_type, (dist.get_world_size(),))
        sp = self.config.actor.sequence_parallel
        self.sp = new_sp_group(sp) if sp > 1 else None
        torch.manual_seed(self.config.seed)
        self.model = self._build_model(trainable=True)
        if self.algorithm.needs_ref and not self.uses_lora:
            self.ref_model = self._build_model(trainable=False)
        actor = self.config.actor
        total_steps = self.config.total_train_steps * actor.ppo_n_minibatches
        self.optimizer, self.scheduler = build_optimizer(self._trainable(), actor.optimizer, total_steps)

    @property
    def uses_lora(self) -> bool:
        return self.config.actor.lora is not None

    def _trainable(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def _build_model(self, trainable: bool) -> nn.Module:
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
        from transformers import AutoModelForCausalLM

        lm = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        if self.sp is not None:
            self._use_ulysses_attention(lm)
        elif self.config.actor.share_prefixes:
            shared_prefix.register_attention()
            lm.set_attn_implementation(shared_prefix.ATTENTION)
        if trainable and self.config.model.gradient_checkpointing:
            enable_activation_checkpointing(lm)
        lm.train(trainable)
        lm.requires_grad_(trainable)
        if trainable and self.config.actor.lora is not None:
            lm = lora.apply_lora(lm, self.config.actor.lora, self.model_path)
        compute = getattr(torch, self.config.model.dtype)
        # fp32 master weights and gradient reduction; compute in model.dtype
        mp = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
        root = _PolicyRoot(lm, self.sp)
        # Resharding after forward frees (1 - 1/world) of each layer's gathered weights until the
        # backward re-gathers them; on one rank it frees nothing worth the extra gather (~5% CPU).
        reshard = dist.get_world_size() > 1
        for layer in lm.get_decoder().layers:
            fully_shard(layer, mesh=self.mesh, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(root, mesh=self.mesh, mp_policy=mp)
        for module in root.modules():
            if isinstance(module, FSDPModule):
                # loss shares are globally normalised: sum gradients over ranks, do not average
                module.set_gradient_divide_factor(1.0)
                module.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no PREMUL_SUM)
        return root

    def _use_ulysses_attention(self, lm: nn.Module) -> None:
        heads = lm.config.num_attention_heads
        kv_heads = getattr(lm.config, "num_key_value_heads", None) or heads
        problem = sequence_parallel_problem(heads, kv_heads, self.sp_size)
        if problem:
            raise ValueError(f"actor.sequence_parallel: {problem}")
        register_attention()
        lm.set_attn_implementation(ATTENTION)

    @property
    def rank(self) -> int:
        return dist.get_rank()

    @property
    def sp_size(self) -> int:
        """Ranks each micro-batch is split over (``actor.sequence_parallel``)."""
        return self.config.actor.sequence_parallel

    @property
    def dp_size(self) -> int:
        """Ranks that take different sequences: the world over the sequence-parallel size."""
        return self.world_size // self.sp_size

    @property
    def dp_rank(self) -> int:
        return self.rank // self.sp_size

    def _pack(
        self, sequences: Sequence[Sequence[int]], indices: Sequence[int], scored: Sequence[Sequence[int]] | None = None
    ) -> PackedBatch:
        """Rows of at most the longest sequence's width; with SP one row, split over the SP ranks;
        with ``actor.share_prefixes`` one row of shared prefixes (shared_prefix.py). ``scored``
        (per sequence, 0/1 per token) becomes :attr:`PackedBatch.scored`."""
        if self.sp is not None:
            batch = pack_in_one_row(sequences, indices, self.sp_size)
        elif self.config.actor.share_prefixes:
            batch = shared_prefix.pack_sharing_prefixes(sequences, indices, shared_prefix.MIN_PREFIX)
        else:
            batch = pack(sequences, indices)
        if scored is None:
            return batch
        return attrs.evolve(batch, scored=pack_per_token(scored, batch, torch.bool))

    @property
    def world_size(self) -> int:
        return dist.get_world_size()

    def destroy(self) -> None:
        """Release the weight group, and the process group if this engine created it."""
        self.close_weight_channel()
        if self._owns_process_group and dist.is_initialized():
            if dist.get_world_size() > 1:
                try:  # leave together: a peer tearing gloo down early can abort this process
                    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
                except RuntimeError:  # a peer is gone already; nothing to wait for
                    pass
            dist.destroy_process_group()
            self._owns_process_group = False

    # ------------------------------------------------------------------ forward helpers
    def _logprobs(
        self, model: nn.Module, batch: PackedBatch, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        actor = self.config.actor
        keep_bytes = actor.logprob_keep_mb * 2**20
        return model(batch.to(self.device), self.config.gconfig.temperature, actor.logprob_chunk_size, keep_bytes,
                     with_entropy)  # fmt: skip

    def _micro_batches(self, sequences: Sequence[Sequence[int]], mine: list[int]) -> tuple[list[list[int]], int]:
        """FFD bins (global indices) of this rank's sequences (by their size after sharing, with
        ``actor.share_prefixes``), and the bin count every rank runs."""
        # max_tokens_per_mb is what one rank runs: under SP a micro-batch is split over sp ranks
        budget = self.config.actor.max_tokens_per_mb * self.sp_size
        if self.config.actor.share_prefixes:
            bins = shared_prefix.micro_batches([sequences[i] for i in mine], budget, shared_prefix.MIN_PREFIX)
        else:
            bins = first_fit_decreasing([len(sequences[i]) for i in mine], budget)
        count = torch.tensor([len(bins)], dtype=torch.long, device=self.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return [[mine[j] for j in b] for b in bins], int(count)

    def _my_share(self, lengths: Sequence[int], positions: Sequence[int]) -> list[int]:
        share = token_balanced_shares([lengths[i] for i in positions], self.dp_size)[self.dp_rank]
        return [positions[j] for j in share]

    # ------------------------------------------------------------------ public API
    @torch.no_grad()
    def compute_logprobs(
        self, sequences: list[list[int]], scored: list[list[int]] | None = None
    ) -> list[list[float]]:
        """Current-policy log-probs of each token sequence, aligned to tokens (0 at position 0).

        ``scored`` (per sequence, 0/1 per token: the loss masks): only those tokens' log-probs are
        needed, and the others come back as 0 (the output head skips them)."""
        lengths = [len(s) for s in sequences]
        bins, n_micro = self._micro_batches(sequences, self._my_share(lengths, range(len(sequences))))
        mine: dict[int, list[float]] = {}
        for k in range(n_micro):
            batch = self._pack(sequences, bins[k], scored) if k < len(bins) else self._pack([_DUMMY_SEQUENCE], [0])
            logp, _ = self._logprobs(self.model, batch, with_entropy=False)
            if k < len(bins):
                for i, values in zip(batch.indices, logp.float().cpu().split(batch.seq_lens)):
                    mine[i] = values.tolist()
        gathered: list[dict[int, list[float]]] = [{} for _ in range(self.world_size)]
        dist.all_gather_object(gathered, mine)
        merged = {i: v for part in gathered for i, v in part.items()}
        return [merged[i] for i in range(len(sequences))]

    def ppo_update(
        self,
        trajs: list[Trajectory],
        advantages: list[float],
        prox_logprobs: list[list[float]] | None = None,
        *,
        recompute_prox: bool = False,
    ) -> dict[str, float]:
        """One train step: ``ppo_n_minibatches`` optimizer steps over packed micro-batches.

        ``recompute_prox``: the proximal log-probs are the current policy's, taken here. With one
        minibatch no update happens before its forward, so that forward's (detached) log-probs
        are them and no extra pass runs; with more, one :meth:`compute_logprobs` pass runs first.
        The ``time/*`` entries say where the step went (seconds, this rank); ``minibatch_s/<i>``
        is minibatch ``i``'s.
        """
        if len(advantages) != len(trajs):
            raise ValueError(f"got {len(advantages)} advantages for {len(trajs)} trajectories; pass one per trajectory")
        if prox_logprobs is not None and len(prox_logprobs) != len(trajs):
            raise ValueError(f"got {len(prox_logprobs)} prox_logprobs lists for {len(trajs)} trajectories")
        if prox_logprobs is not None and recompute_prox:
            raise ValueError("pass prox_logprobs or recompute_prox=True, not both")
        start = time.perf_counter()
        minibatches = split_minibatches(len(trajs), self.config.actor.ppo_n_minibatches)
        fused = recompute_prox and len(minibatches) == 1
        prox_s = 0.0
        if recompute_prox and not fused:
            prox_logprobs = self.compute_logprobs([t.input_ids for t in trajs], [t.loss_mask for t in trajs])
            prox_s = time.perf_counter() - start
        lengths = [len(t.input_ids) for t in trajs]
        stats = _StepStats()
        steps, minibatch_s = [], []
        for mb in minibatches:
            mb_start = time.perf_counter()
            steps.append(self._minibatch_step(trajs, advantages, prox_logprobs, lengths, mb, stats, fused))
            minibatch_s.append(time.perf_counter() - mb_start)
        self.step += 1
        gathered: list[_StepStats | None] = [None] * self.world_size
        dist.all_gather_object(gathered, stats)
        out = _StepStats.merge(gathered, self.config.actor.offpolicy.mismatch_band)
        out["loss"] = out.pop("loss_share", 0.0) / len(minibatches)  # the objective, not a token mean
        out["grad_norm"] = sum(norm for norm, _, _ in steps) / len(steps)
        out["skipped_updates"] = float(sum(not math.isfinite(norm) for norm, _, _ in steps))
        out["lr"] = steps[-1][1]  # used by the last optimizer step
        out["n_seqs"] = float(len(trajs))
        out["n_tokens"] = float(sum(lengths))
        out["n_loss_tokens"] = float(sum(t.n_output_tokens for t in trajs))
        elapsed = time.perf_counter() - start
        out["tokens_per_s"] = sum(lengths) / elapsed
        out["time/prox_logp_s"] = prox_s
        out["time/optimizer_s"] = sum(t for _, _, t in steps)
        out["time/train_fwd_bwd_s"] = elapsed - prox_s - out["time/optimizer_s"]
        out.update({f"{MINIBATCH_S}{i}": t for i, t in enumerate(minibatch_s)})  # for the run's timeline
        return out

    def _minibatch_step(
        self,
        trajs: list[Trajectory],
        advantages: list[float],
        prox_logprobs: list[list[float]] | None,
        lengths: list[int],
        minibatch: list[int],
        stats: _StepStats,
        fused_prox: bool,
    ) -> tuple[float, float, float]:
        """One optimizer step over ``minibatch``; returns (grad norm, lr used, optimizer seconds)."""
        mine = self._my_share(lengths, minibatch)
        local = [sum(trajs[i].n_output_tokens for i in mine), len(mine)]
        norms = torch.tensor(local, dtype=torch.float64, device=self.device)
        dist.all_reduce(norms)
        norms /= self.sp_size  # an SP group's ranks all count the same sequences
        token_norm, seq_norm = max(1.0, float(norms[0])), max(1.0, float(norms[1]))
        bins, n_micro = self._micro_batches([t.input_ids for t in trajs], mine)
        self.optimizer.zero_grad(set_to_none=True)
        for k in range(n_micro):
            # One rank: keep weights gathered and reduce gradients once per optimizer step (costs
            # no extra memory there). More ranks: every micro-batch, so nothing unsharded piles up.
            per_step = self.world_size > 1 or k == n_micro - 1
            self.model.set_requires_gradient_sync(per_step)
            self.model.set_reshard_after_backward(per_step)
            if k < len(bins):
                loss = self._micro_loss(
                    trajs, advantages, prox_logprobs, bins[k], token_norm, seq_norm, stats, fused_prox
                )
            else:  # every rank runs the same number of forwards/backwards (FSDP collectives)
                loss = self._padding_loss()
            loss.backward()
        opt_start = time.perf_counter()
        params = self._trainable()
        grad_norm = clip_grad_norm(params, self.config.actor.optimizer.grad_clip)
        lr = self.optimizer.param_groups[0]["lr"]
        if math.isfinite(grad_norm):  # the same on every rank: all skip a non-finite update
            self.optimizer.step()
        self.scheduler.step()
        return grad_norm, lr, time.perf_counter() - opt_start

    def _micro_loss(
        self,
        trajs: list[Trajectory],
        advantages: list[float],
        prox_logprobs: list[list[float]] | None,
        indices: list[int],
        token_norm: float,
        seq_norm: float,
        stats: _StepStats,
        fused_prox: bool,
    ) -> torch.Tensor:
        """``fused_prox``: no update has happened yet this step, so this forward's detached
        log-probs are the proximal ones."""
        seqs = [t.input_ids for t in trajs]
        batch = self._pack(seqs, indices, [t.loss_mask for t in trajs])  # the head runs for loss tokens only
        dev = self.device
        mask = batch.scored.to(dev)
        old = pack_per_token([t.logprobs for t in trajs], batch, torch.float32).to(dev)
        prox = pack_per_token(prox_logprobs, batch, torch.float32).to(dev) if prox_logprobs is not None else None
        adv = torch.tensor([advantages[i] for i in batch.indices], dtype=torch.float32)[batch.seq_ids].to(dev)
        ref = self._ref_logprobs(batch)
        logprobs, entropy = self._logprobs(self.model, batch, with_entropy=True)
        if fused_prox:
            prox = logprobs.detach().clone()
        loss_input = LossInput(
            old_logprobs=old,
            prox_logprobs=prox,
            advantages=adv,
            loss_mask=mask,
            seq_ids=batch.seq_ids.to(dev),
            n_seqs=batch.n_seqs,
            token_normalizer=token_norm,
            seq_normalizer=seq_norm,
            max_new_tokens=self.config.gconfig.max_new_tokens,
            ref_logprobs=ref,
            entropy=entropy.detach(),
        )
        loss, algo_stats = self.algorithm.loss(logprobs, loss_input)
        if self.sp is not None and self.sp.rank > 0:  # the group's first rank reports what all of it computed
            return loss
        n_loss = float(mask.sum())
        stats.add_algorithm_stats(algo_stats, n_loss)
        with torch.no_grad():
            if "entropy" not in algo_stats:
                stats.add_mean("entropy", float(entropy[mask].sum()) / max(n_loss, 1.0), n_loss)
            anchor = prox if prox is not None else old
            stats.add_extremes("ratio", torch.exp(logprobs.detach() - anchor)[mask])
            if prox is not None:
                stats.add_extremes("behav_imp_weight", torch.exp(prox - old)[mask])
                versions = pack_per_token([t.versions for t in trajs], batch, torch.long).to(dev)
                stats.add_gaps((prox - old)[mask], (versions == self.step)[mask])
        stats.add_total("loss_share", float(loss.detach()))
        return loss

    def _padding_loss(self) -> torch.Tensor:
        """A zero loss over a dummy sequence (and a matching reference forward)."""
        batch = self._pack([_DUMMY_SEQUENCE], [0])
        self._ref_logprobs(batch)
        logprobs, _ = self._logprobs(self.model, batch, with_entropy=False)
        return logprobs.sum() * 0.0

    @torch.no_grad()
    def _ref_logprobs(self, batch: PackedBatch) -> torch.Tensor | None:
        """The reference policy's log-probs (None without one): the frozen copy, or with LoRA
        the policy with its adapter disabled."""
        if self.ref_model is not None:
            return self._logprobs(self.ref_model, batch, with_entropy=False)[0]
        if self.uses_lora and self.algorithm.needs_ref:
            with lora.adapter_disabled(self.model.lm):
                return self._logprobs(self.model, batch, with_entropy=False)[0]
        return None

    # ------------------------------------------------------------------ weights out
    def _weights_out(self) -> list[tuple[str, torch.Tensor]]:
        """(name, tensor) of what leaves the trainer: every saved parameter/buffer by HF name, or
        with LoRA the adapter's tensors by peft's saved names."""
        lm = self.model.lm
        if self.uses_lora:
            return lora.adapter_parameters(lm)
        if self._saved_buffers is None:  # the model's structure is fixed: its state_dict is built once
            self._saved_buffers = frozenset(lm.state_dict().keys()) & {name for name, _ in lm.named_buffers()}
        return [*lm.named_parameters(), *((n, b) for n, b in lm.named_buffers() if n in self._saved_buffers)]

    def iter_full_tensors(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Collective: yield (name, full tensor) for every tensor of :meth:`_weights_out`, one
        ``DTensor.full_tensor()`` all-gather at a time; tied weights appear once."""
        from torch.distributed.tensor import DTensor

        for name, value in self._weights_out():  # named_parameters() lists a tied weight once
            if isinstance(value, DTensor):  # one rank holds it all: no gather, no copy
                full = value.to_local() if value.device_mesh.size() == 1 else value.full_tensor()
            else:
                full = value
            yield name, full.detach().to(dtype) if dtype is not None else full.detach()

    def full_tensor_specs(self) -> list[tuple[str, str, tuple[int, ...]]]:
        """(name, dtype, shape) of each tensor ``iter_full_tensors(model dtype)`` yields, in order,
        without gathering anything."""
        dtype = str(getattr(torch, self.config.model.dtype)).removeprefix("torch.")
        return [(name, dtype, tuple(value.shape)) for name, value in self._weights_out()]

    def open_weight_channel(self, spec: ChannelSpec) -> str | None:
        """Collective: open the engine's weight channel ``spec`` on this rank (rank 0 joins the
        servers' group). Returns rank 0's error message if joining failed (training is unaffected)."""
        from areal_core.api.weight_channel import open_channel

        self.close_weight_channel()
        channel = open_channel(spec, rank=self.rank, device=self.device)
        try:
            channel.join()
        except Exception as exc:  # noqa: BLE001 - reported to the controller; training goes on
            channel.leave()
            return f"joining weight group {spec.group_name!r} failed: {type(exc).__name__}: {exc}"
        self._channel = channel
        return None

    def send_weights(self, version: int) -> str | None:
        """Collective: every rank gathers the full tensors (model dtype, in order) and rank 0 sends
        them through the open channel as ``version``. A send failure does not stop the gathers
        (the training group stays consistent): the channel is closed and the error returned."""
        source = _FullTensors(self)
        if self._channel is None:
            source.drain()
            return "no weight channel is open; open_weight_channel first"
        try:
            self._channel.send(source, version)
        except Exception as exc:  # noqa: BLE001 - reported to the controller; training goes on
            source.drain()
            self.close_weight_channel()
            return f"sending weights v{version} failed: {type(exc).__name__}: {exc}"
        return None

    def close_weight_channel(self) -> None:
        """Leave the weight channel, if any: peers blocked in it fail instead of waiting."""
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.leave()

    def save_hf(self, path: str | os.PathLike) -> None:
        """Collective; rank 0 writes safetensors + config + tokenizer files into ``path`` (with
        LoRA: the peft adapter directory, naming the base model, + tokenizer files)."""
        dtype = getattr(torch, self.config.model.dtype)
        tensors = {name: t.cpu().contiguous() for name, t in self.iter_full_tensors(dtype) if self.rank == 0}
        if self.rank == 0 and self.uses_lora:
            lora.write_adapter(Path(path), tensors, self.model.lm)
            _copy_tokenizer_files(Path(self.model_path), Path(path))
        elif self.rank == 0:
            out = Path(path)
            out.mkdir(parents=True, exist_ok=True)
            write_safetensors(tensors, out / "model.safetensors", metadata={"format": "pt"})
            hf_config = self.model.lm.config
            saved_dtype = hf_config.dtype
            hf_config.dtype = dtype
            try:
                hf_config.save_pretrained(out)
            finally:
                hf_config.dtype = saved_dtype
            if self.model.lm.generation_config is not None:
                self.model.lm.generation_config.save_pretrained(out)
            _copy_tokenizer_files(Path(self.model_path), out)
        dist.barrier()

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: str | os.PathLike) -> None:
        """Collective DCP checkpoint of model, optimizer, LR schedule, RNG state and step."""
        save_checkpoint(path, self.model, self.optimizer, self.scheduler, self.step, self.platform.device_type)

    def load_checkpoint(self, path: str | os.PathLike) -> int:
        """Collective restore of :meth:`save_checkpoint`'s directory; returns the restored step."""
        self.step = load_checkpoint(path, self.model, self.optimizer, self.scheduler, self.platform.device_type)
        return self.step


class _FullTensors:
    """The engine's weights as a channel's :class:`~areal_core.api.weight_channel.TensorSource`: one
    iteration per send, which :meth:`drain` finishes (the gathers are collective over ranks)."""

    def __init__(self, engine: FSDPPolicy) -> None:
        self._engine = engine
        self._iterator: Iterator[tuple[str, torch.Tensor]] | None = None

    def specs(self) -> list[tuple[str, str, tuple[int, ...]]]:
        return self._engine.full_tensor_specs()

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        self._iterator = self._engine.iter_full_tensors(getattr(torch, self._engine.config.model.dtype))
        return self._iterator

    def drain(self) -> None:
        """Finish the gathers this rank owes its peers (a whole pass if none was started)."""
        for _ in self._iterator if self._iterator is not None else iter(self):
            pass


def enable_activation_checkpointing(lm: nn.Module) -> None:
    """Recompute each decoder layer in backward (non-reentrant, as FSDP2 needs)."""
    kwargs = {"use_reentrant": False}
    if hasattr(lm, "activation_checkpointing_enable"):  # transformers >= 5.x
        lm.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _copy_tokenizer_files(src: Path, dst: Path) -> None:
    """Copy everything but weights and configs (tokenizer, chat template, ...) from ``src``."""
    skip = {"config.json", "generation_config.json"}
    for item in src.iterdir():
        if item.is_file() and item.name not in skip and not item.name.endswith(_WEIGHT_SUFFIXES):
            shutil.copy2(item, dst / item.name)
