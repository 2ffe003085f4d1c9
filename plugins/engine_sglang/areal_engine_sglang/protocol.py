"""The parts of SGLang 0.5.23's native HTTP API this client uses: request bodies and reply parsing.

Written from the sources of the ``sglang==0.5.23`` wheel (read for the protocol, nothing copied):

- ``sglang/srt/managers/io_struct.py``: ``GenerateReqInput``, ``PauseGenerationReqInput``,
  ``ContinueGenerationReqInput``, ``UpdateWeightFromDiskReqInput``, ``InitWeightsUpdateGroupReqInput``,
  ``DestroyWeightsUpdateGroupReqInput``, ``BeginWeightUpdateReqInput``, ``EndWeightUpdateReqInput``,
  ``UpdateWeightsFromDistributedReqInput``, ``UpdateWeightVersionReqInput``;
- ``sglang/api/v1/api_types.py`` (the ``/generate`` contract): ``SamplingParams`` (unknown keys are
  rejected), ``GenerateResponse``, ``GenerateMetaInfo`` (``finish_reason``, ``output_token_logprobs``
  as ``[logprob, token_id, text]`` rows, ``weight_version``, ``weight_versions`` spans);
- ``sglang/srt/entrypoints/http_server.py``: the routes and their status codes;
- ``LoadLoRAAdapterReqInput``, ``UnloadLoRAAdapterReqInput``, ``LoRAUpdateOutput`` (io_struct.py) and
  ``GenerateReqInput.lora_path`` (the name of a loaded adapter) for LoRA.

A body holds only the fields this client sets; SGLang fills the others with its defaults.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from areal_core.api.engine import SamplingParams
from areal_core.api.http_engine import Segment
from areal_core.api.errors import ArealError
from areal_core.api.wire import to_json

if TYPE_CHECKING:
    from areal_core.api.weight_channel import ChannelSpec

__all__ = ["to_json"]

#: ``/update_weights_from_distributed``'s ``load_format`` for one flat uint8 broadcast per bucket:
#: tensors' raw bytes back to back (``areal_core.api.weight_channel.flatten_bucket``), each at a byte offset that is
#: a multiple of its dtype's size.
FLAT_BUCKET = "flattened_bucket"


@attrs.frozen(kw_only=True)
class GenerateBody:
    """``POST /generate`` (``GenerateReqInput``): one prompt as token ids, log-probs of the output."""

    rid: str
    input_ids: list[int]
    sampling_params: dict[str, Any]
    return_logprob: bool = True
    stream: bool = False
    lora_path: str | None = None  # SGLang's name for the adapter to use: a loaded adapter's lora_name


@attrs.frozen(kw_only=True)
class PauseBody:
    """``POST /pause_generation``: ``abort`` ends every running and queued request with its partial
    output; ``in_place`` holds them where they are, KV cache kept, until ``/continue_generation``."""

    mode: str = "abort"


@attrs.frozen(kw_only=True)
class DiskUpdateBody:
    """``POST /update_weights_from_disk`` (``UpdateWeightFromDiskReqInput``)."""

    model_path: str
    weight_version: str
    abort_all_requests: bool = False
    flush_cache: bool = True


@attrs.frozen(kw_only=True)
class LoraLoadBody:
    """``POST /load_lora_adapter`` (``LoadLoRAAdapterReqInput``): a peft adapter directory, by name."""

    lora_name: str
    lora_path: str


@attrs.frozen(kw_only=True)
class LoraUnloadBody:
    """``POST /unload_lora_adapter`` (``UnloadLoRAAdapterReqInput``)."""

    lora_name: str


@attrs.frozen(kw_only=True)
class WeightGroupBody:
    """``POST /init_weights_update_group`` (``InitWeightsUpdateGroupReqInput``): join as ``rank_offset`` (+ tp rank)."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str
    backend: str


def weight_group_bodies(spec: ChannelSpec) -> list[dict[str, Any]]:
    """One ``/init_weights_update_group`` body per server of ``spec``: server ``i``'s tp workers
    join from rank ``1 + i * tp``."""
    return [
        to_json(WeightGroupBody(
            master_address=spec.master_addr, master_port=spec.master_port, rank_offset=spec.first_rank(i),
            world_size=spec.world_size, group_name=spec.group_name, backend=spec.backend,
        ))
        for i in range(len(spec.servers))
    ]  # fmt: skip


@attrs.frozen(kw_only=True)
class GroupNameBody:
    """``POST /destroy_weights_update_group``."""

    group_name: str


@attrs.frozen(kw_only=True)
class DistributedUpdateBody:
    """``POST /update_weights_from_distributed``: receive one broadcast bucket and load it at once.

    Only valid between ``/begin_weight_update`` and ``/end_weight_update``.
    """

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str
    load_format: str = FLAT_BUCKET
    flush_cache: bool = True  # drop the KV cache the old weights computed (SGLang's default)
    abort_all_requests: bool = False


@attrs.frozen(kw_only=True)
class WeightVersionBody:
    """``POST /update_weight_version``; SGLang's default ``abort_all_requests`` is true, ours is false."""

    new_version: str
    abort_all_requests: bool = False


def sampling_params(params: SamplingParams, generated: int) -> dict[str, Any]:
    """``sampling_params`` continuing after ``generated`` tokens of ``params``' budget.

    Temperature 0 is SGLang's greedy (top-k 1). SGLang draws a seeded token from
    (``sampling_seed``, token position), so a re-submitted rest keeps the seed and samples what
    an uninterrupted request would have.
    """
    body: dict[str, Any] = {
        "max_new_tokens": params.max_new_tokens - generated,
        "temperature": 0.0 if params.greedy else params.temperature,
        "top_p": 1.0 if params.greedy else params.top_p,
        "stop_token_ids": list(params.stop_token_ids),
    }
    if params.seed is not None:
        body["sampling_seed"] = params.seed
    return body


def parse_generate(data: dict[str, Any]) -> Segment:
    """One non-streamed ``GenerateResponse`` with ``return_logprob``; ArealError on an unexpected shape."""
    try:
        meta = data["meta_info"]
        output_ids = [int(t) for t in data["output_ids"]]
        rows = meta["output_token_logprobs"]
        finish = (meta["finish_reason"] or {}).get("type", "")
        versions = _token_versions(meta, len(output_ids))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ArealError(
            f"unexpected /generate reply from sglang ({type(exc).__name__}: {exc}): {str(data)[:300]}"
        ) from None
    if [int(row[1]) for row in rows] != output_ids:
        raise ArealError("sglang /generate: output_token_logprobs do not match output_ids")
    if finish not in ("stop", "length", "abort"):
        raise ArealError(f"sglang /generate: unknown finish_reason {meta['finish_reason']!r}")
    logprobs = [float(row[0]) for row in rows]
    return Segment(output_ids=output_ids, logprobs=logprobs, versions=versions, stop_reason=finish)


def _token_versions(meta: dict[str, Any], n: int) -> list[int]:
    """Per-token versions from the ``weight_versions`` spans (else the reply's ``weight_version``)."""
    spans = meta.get("weight_versions") or [{"version": meta["weight_version"], "start": 0, "end": n}]
    versions: list[int] = []
    for span in spans:
        versions += [_version_number(span["version"])] * (int(span["end"]) - int(span["start"]))
    if len(versions) != n:
        raise ValueError(f"weight_versions spans cover {len(versions)} of {n} tokens")
    return versions


def _version_number(version: str) -> int:
    try:
        return int(version)
    except ValueError:
        raise ArealError(
            f"sglang server reports weight version {version!r}; start it with --weight-version 0 "
            "(areal versions are integers)"
        ) from None
