"""The config tree: frozen attrs classes loaded from YAML plus dotted overrides.

``load_config(path, ["actor.world_size=2"])`` returns a validated :class:`Config`. Every error is
a :class:`ConfigError` whose message starts with the dotted key at fault.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import types
import typing
from pathlib import Path
from typing import Any, Literal, Sequence, Union

import attrs
import yaml

from areal_core.api.errors import ConfigError

frozen = attrs.frozen(kw_only=True)

#: Largest ``seed``: numpy (used by vLLM, SGLang) takes seeds below 2**32, and servers add their index.
MAX_SEED = 2**31


def _ge(bound: float):
    def check(inst: Any, attr: attrs.Attribute, value: Any) -> None:
        if value is not None and value < bound:
            raise ValueError(f"must be >= {bound}, got {value}")

    return check


def _gt(bound: float):
    def check(inst: Any, attr: attrs.Attribute, value: Any) -> None:
        if value is not None and value <= bound:
            raise ValueError(f"must be > {bound}, got {value}")

    return check


def _lt(bound: float):
    def check(inst: Any, attr: attrs.Attribute, value: Any) -> None:
        if value is not None and not value < bound:
            raise ValueError(f"must be < {bound}, got {value}")

    return check


def _le(bound: float):
    def check(inst: Any, attr: attrs.Attribute, value: Any) -> None:
        if value is not None and value > bound:
            raise ValueError(f"must be <= {bound}, got {value}")

    return check


# --------------------------------------------------------------------------- sections


@frozen
class TinyModelSpec:
    """A Qwen3-architecture model built from config (random init) for CPU runs and tests."""

    hidden_size: int = attrs.field(default=128, validator=_ge(32))
    num_layers: int = attrs.field(default=2, validator=_ge(1))
    num_heads: int = attrs.field(default=4, validator=_ge(1))
    num_kv_heads: int = attrs.field(default=2, validator=_ge(1))
    head_dim: int = attrs.field(default=32, validator=_ge(32))  # vLLM-CPU attention needs >= 32
    intermediate_size: int = attrs.field(default=256, validator=_ge(1))
    max_position_embeddings: int = attrs.field(default=512, validator=_ge(16))
    initializer_range: float = attrs.field(default=0.02, validator=_gt(0))  # std of the random weights


@frozen
class ModelConfig:
    """Which model to train: a Hugging Face directory, or the built-in tiny spec."""

    path: str = ""  # HF model dir; empty means build `tiny` with the dataset's tokenizer
    tiny: TinyModelSpec = attrs.Factory(TinyModelSpec)
    dtype: Literal["float32", "bfloat16"] = "float32"
    gradient_checkpointing: bool = False


@frozen
class RolloutConfig:
    engine: str = "hf"
    servers: int = attrs.field(default=1, validator=_ge(1))
    devices_per_server: int = attrs.field(default=1, validator=_ge(1))
    threads_per_server: int = attrs.field(default=1, validator=_ge(1))
    # CPU cores (as os.sched_getaffinity numbers them) every server and its threads are pinned to,
    # local scheduler only; empty: not pinned. With actor.cpus: servers and trainers on their own
    # cores, and the controller (its requests, its reward workers) on the servers' ones
    cpus: list[int] = attrs.Factory(list)
    max_concurrent_rollouts: int = attrs.field(default=64, validator=_ge(1))
    max_head_offpolicyness: int = attrs.field(default=2, validator=_ge(0))
    # What a weight update does to requests in flight: "abort" them (they are re-sent, prompt + partial
    # output, to the new weights) or "keep" them (held, then decoded on the new weights over their KV
    # cache; engines with areal_core.api.SupportsKeepPause: hf, vllm, sglang)
    pause_mode: Literal["abort", "keep"] = "abort"
    request_timeout: float = attrs.field(default=300.0, validator=_gt(0))
    server_startup_timeout: float = attrs.field(default=300.0, validator=_gt(0))
    engine_args: dict[str, Any] = attrs.Factory(dict)  # passed through to the engine's server
    health_check_interval: float = attrs.field(default=5.0, validator=_gt(0))  # seconds between server checks
    health_timeout_s: float = attrs.field(default=30.0, validator=_gt(0))  # silent this long: hung, so lost
    restart_failed: bool = False  # start a replacement when a server dies (it loads the current weights)
    episode_retries: int = attrs.field(default=1, validator=_ge(0))  # re-runs of a failed episode, then it is dropped
    # Abort when more than this share of the last `failure_window_steps` steps' worth of episode
    # attempts fails (1.0 never aborts); reward calls use reward.max_failure_rate over the same window.
    max_failure_rate: float = attrs.field(default=0.5, validator=[_ge(0), _le(1)])
    failure_window_steps: int = attrs.field(default=3, validator=_ge(1))


@frozen
class GenerationConfig:
    n_samples: int = attrs.field(default=8, validator=_ge(1))
    max_new_tokens: int = attrs.field(default=16, validator=_ge(1))
    temperature: float = attrs.field(default=1.0, validator=_gt(0))
    top_p: float = attrs.field(default=1.0, validator=[_gt(0), _le(1)])
    stop: list[str] = attrs.Factory(list)  # non-empty strings: an empty one would end every completion at once


@frozen
class OptimizerConfig:
    lr: float = attrs.field(default=3e-4, validator=_gt(0))
    weight_decay: float = attrs.field(default=0.0, validator=_ge(0))
    beta1: float = attrs.field(default=0.9, validator=[_ge(0), _le(1)])
    beta2: float = attrs.field(default=0.999, validator=[_ge(0), _le(1)])
    eps: float = attrs.field(default=1e-8, validator=_gt(0))
    warmup_steps: int = attrs.field(default=0, validator=_ge(0))
    schedule: Literal["constant", "cosine"] = "constant"
    min_lr_ratio: float = attrs.field(default=0.0, validator=[_ge(0), _le(1)])
    grad_clip: float = attrs.field(default=1.0, validator=_ge(0))  # 0 disables clipping


@frozen
class LoraConfig:
    """LoRA adapters on the policy (peft): only they train, and only they go to the servers."""

    rank: int = attrs.field(default=16, validator=_ge(1))
    alpha: float = attrs.field(default=32.0, validator=_gt(0))  # the update is scaled by alpha / rank
    dropout: float = attrs.field(default=0.0, validator=[_ge(0), _lt(1)])
    # Linear layers (module-name suffixes) that get an adapter; the defaults are every linear
    # layer of a decoder block in Llama/Qwen-style models.
    target_modules: list[str] = attrs.Factory(
        lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


CorrectionName = Literal["tis", "mis", "icepop", "m2po"]
#: The corrections that decide the importance weight itself; a run lists at most one of them.
WEIGHT_CORRECTIONS = ("tis", "mis", "icepop")


@frozen
class TISConfig:
    """Truncated importance sampling: the weight is ``min(rho, cap)`` (Yao et al. 2025; verl's default 2)."""

    level: Literal["token", "sequence"] = "token"
    cap: float = attrs.field(default=2.0, validator=_gt(1))
    sequence_ratio: Literal["product", "geometric"] = "product"  # rho of a sequence at level sequence


@frozen
class MISConfig:
    """Masked importance sampling: weight ``rho``, 0 outside ``[lower, upper]`` (Liu, Li et al. 2025: C = 2)."""

    level: Literal["token", "sequence"] = "token"
    upper: float = attrs.field(default=2.0, validator=_gt(1))
    lower: float | None = attrs.field(default=None, validator=[_gt(0), _lt(1)])  # None: no lower bound
    sequence_ratio: Literal["product", "geometric"] = "geometric"


@frozen
class IcePopConfig:
    """IcePop: token-level masking with a two-sided band (Ring-1T, Ling Team 2025: [0.5, 5])."""

    lower: float = attrs.field(default=0.5, validator=[_gt(0), _lt(1)])
    upper: float = attrs.field(default=5.0, validator=_gt(1))


@frozen
class M2POConfig:
    """M2PO: mask the tokens with the largest ``(log rho)^2`` until the rest's mean is <= threshold
    (Zheng et al. 2025: 0.04)."""

    threshold: float = attrs.field(default=0.04, validator=_gt(0))


@frozen
class OffPolicyConfig:
    """How the trainer/engine ratio ``rho = exp(prox - old)`` of each loss token is corrected
    (docs/algorithms.md). ``corrections`` lists the ones applied: at most one of tis/mis/icepop
    (they set the weight), plus m2po (a mask) with any of them; [] keeps ``rho`` as it is."""

    corrections: list[CorrectionName] = attrs.Factory(lambda: ["icepop"])
    tis: TISConfig = attrs.Factory(TISConfig)
    mis: MISConfig = attrs.Factory(MISConfig)
    icepop: IcePopConfig = attrs.Factory(IcePopConfig)
    m2po: M2POConfig = attrs.Factory(M2POConfig)
    # train/mismatch/out_of_band_frac counts loss tokens whose rho is outside [1/band, band]
    mismatch_band: float = attrs.field(default=2.0, validator=_gt(1))


@frozen
class ActorConfig:
    algorithm: str = "grpo"
    weight_update: str = "disk"
    weight_chunked_mem_mb: int = attrs.field(default=128, validator=_ge(1))  # xccl bucket (bench/weight_sync.py)
    weight_update_timeout_s: float = attrs.field(default=300.0, validator=_gt(0))  # deadline of each xccl step
    world_size: int = attrs.field(default=1, validator=_ge(1))
    # Ulysses: each micro-batch split along the sequence over this many ranks (docs/sequence-parallel.md)
    sequence_parallel: int = attrs.field(default=1, validator=_ge(1))
    threads_per_worker: int = attrs.field(default=1, validator=_ge(1))
    cpus: list[int] = attrs.Factory(list)  # CPU cores every training worker is pinned to; see rollout.cpus
    optimizer: OptimizerConfig = attrs.Factory(OptimizerConfig)
    ppo_n_minibatches: int = attrs.field(default=1, validator=_ge(1))
    # tokens one rank runs per micro-batch: under SP a micro-batch holds sequence_parallel x this
    max_tokens_per_mb: int = attrs.field(default=4096, validator=_ge(1))
    # run a micro-batch's shared prefixes (a GRPO group's prompt) through the model once (docs/shared-prefixes.md)
    share_prefixes: bool = False
    eps_clip: float = attrs.field(default=0.2, validator=_gt(0))
    eps_clip_higher: float | None = attrs.field(default=None, validator=_gt(0))
    offpolicy: OffPolicyConfig = attrs.Factory(OffPolicyConfig)  # corrections of the behaviour weight
    kl_coef: float = attrs.field(default=0.0, validator=_ge(0))
    adv_norm: Literal["group", "batch", "none"] = "group"
    std_norm: bool = True
    leave_one_out: bool = False
    recompute_logprobs: bool = True  # proximal log-probs before the update (decoupled PPO)
    logprob_chunk_size: int = attrs.field(default=1024, validator=_ge(1))
    # a micro-batch's [tokens, vocab] fp32 log-softmax up to this size is kept from forward to
    # backward instead of recomputed chunk by chunk (a fourth of the head's matmuls); 0 = recompute.
    # Measured faster with share_prefixes (SmolLM2 example), slower without (issue 44's notes)
    logprob_keep_mb: int = attrs.field(default=0, validator=_ge(0))
    lora: LoraConfig | None = None  # set (e.g. `actor.lora: {rank: 16}`) to train LoRA adapters only


@frozen
class RewardConfig:
    name: str = "arith"
    timeout: float = attrs.field(default=15.0, validator=_gt(0))
    workers: int = attrs.field(default=1, validator=_ge(1))
    max_failure_rate: float = attrs.field(default=0.5, validator=[_ge(0), _le(1)])  # of calls; see rollout's
    # DAPO's soft overlong punishment (areal_core/reward_shaping.py): answers longer than
    # gconfig.max_new_tokens - overlong_buffer lose up to overlong_penalty of reward; 0 = off
    overlong_buffer: int = attrs.field(default=0, validator=_ge(0))
    overlong_penalty: float = attrs.field(default=1.0, validator=_ge(0))


@frozen
class DatasetConfig:
    name: str = "arith"  # a registered dataset, e.g. "arith" (synthetic) or "gsm8k"
    path: str = ""  # data file/dir for datasets read from disk
    batch_size: int = attrs.field(default=8, validator=_ge(1))  # prompts per train step
    size: int = attrs.field(default=0, validator=_ge(0))  # 0 = whole dataset; synthetic: items
    shuffle: bool = True
    options: dict[str, Any] = attrs.Factory(dict)  # dataset-specific knobs
    overlong: Literal["drop", "error"] = "drop"  # prompts that leave no room for max_new_tokens in the context
    # Each item this many times (ids suffixed #0, #1, ...): a batch larger than the data, as other trainers repeat
    repeat: int = attrs.field(default=1, validator=_ge(1))


@frozen
class SaverConfig:
    freq_steps: int = attrs.field(default=0, validator=_ge(0))  # 0 = only at the end
    keep_last: int = attrs.field(default=1, validator=_ge(1))


@frozen
class RecoverConfig:
    mode: Literal["off", "auto"] = "off"
    freq_steps: int = attrs.field(default=10, validator=_ge(1))
    retries: int = attrs.field(default=0, validator=_ge(0))


@frozen
class RayConfig:
    """Where the ``ray`` scheduler finds its cluster (``scheduler: ray``)."""

    address: str = "auto"  # "auto" = the cluster started by `ray start --head`; or "ray://host:port"
    namespace: str = "areal"
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    # extra Ray resources each server / training worker bundle asks for, e.g. {"rollout": 1}: the role
    # then lands only on nodes started with that resource (`ray start --resources='{"rollout": 4}'`)
    server_resources: dict[str, float] = attrs.Factory(dict)
    trainer_resources: dict[str, float] = attrs.Factory(dict)


@frozen
class ClusterConfig:
    """Addresses of a run whose processes may sit on several machines (docs/scale-out.md)."""

    # what servers, workers and the controller's listeners bind; empty: the node's own address (the
    # node IP Ray reports under `scheduler: ray`, 127.0.0.1 under `local`); 0.0.0.0 binds every
    # interface and advertises the node's address
    bind_host: str = ""


@frozen
class StatsConfig:
    # where the stats go, in order: built-in jsonl (stats.jsonl, samples.jsonl) and tensorboard, or a
    # plugin's (wandb, swanlab, mlflow; options under plugins.<name>)
    sinks: list[str] = attrs.Factory(lambda: ["jsonl", "tensorboard"])
    samples: int = attrs.field(default=8, validator=_ge(0))  # rows of each sample table (prompt, response, reward)
    samples_every: int = attrs.field(default=0, validator=_ge(0))  # a table of training samples every N steps; 0 = none
    sink_timeout: float = attrs.field(default=30.0, validator=_gt(0))  # seconds in one sink call before it is reported
    eval_every: int = attrs.field(default=10, validator=_ge(0))  # greedy held-out accuracy; 0 = off
    eval_at_start: bool = True  # also before the first step: the summary's "before" and the curve's step 0
    progress: bool = True
    timeline: bool = True  # trainer phases and rollout concurrency in RUN_DIR/timeline.jsonl (`areal timeline`)


@frozen
class AgentConfig:
    """Agentic RL through the OpenAI-compatible proxy (:mod:`areal_core.agent`, docs/agents.md)."""

    command: list[str] = attrs.Factory(list)  # agent program run per sample; empty: an async function
    host: str = ""  # where the proxy listens; empty: the controller's address (cluster.bind_host)
    port: int = attrs.field(default=0, validator=[_ge(0), _le(65535)])  # 0 = any free port
    gamma: float = attrs.field(default=1.0, validator=[_gt(0), _le(1)])  # turn discount
    export: Literal["individual", "concat"] = "concat"  # one trajectory per completion, or per chain
    timeout: float = attrs.field(default=300.0, validator=_gt(0))  # seconds per agent run
    max_body_bytes: int = attrs.field(default=1 << 20, validator=_ge(1024))  # larger requests get 413
    chat_template: str = ""  # Jinja template replacing the tokenizer's for proxied chats
    tool_parser: str = "auto"  # hermes, llama3_json, mistral or a plugin's; auto: from the chat template


@frozen
class Config:
    """The whole run. Outputs go to ``{fileroot}/{experiment_name}/{trial_name}/``."""

    experiment_name: str = "quickstart"
    trial_name: str = "trial0"
    fileroot: str = "./runs"
    seed: int = attrs.field(default=1, validator=[_ge(0), _le(MAX_SEED)])
    platform: str = "auto"
    scheduler: Literal["local", "ray"] = "local"
    total_train_steps: int = attrs.field(default=100, validator=_ge(1))
    model: ModelConfig = attrs.Factory(ModelConfig)
    rollout: RolloutConfig = attrs.Factory(RolloutConfig)
    gconfig: GenerationConfig = attrs.Factory(GenerationConfig)
    actor: ActorConfig = attrs.Factory(ActorConfig)
    reward: RewardConfig = attrs.Factory(RewardConfig)
    train_dataset: DatasetConfig = attrs.Factory(DatasetConfig)
    valid_dataset: DatasetConfig | None = None
    saver: SaverConfig = attrs.Factory(SaverConfig)
    recover: RecoverConfig = attrs.Factory(RecoverConfig)
    ray: RayConfig = attrs.Factory(RayConfig)
    cluster: ClusterConfig = attrs.Factory(ClusterConfig)
    stats: StatsConfig = attrs.Factory(StatsConfig)
    agent: AgentConfig = attrs.Factory(AgentConfig)
    plugins: dict[str, Any] = attrs.Factory(dict)  # free-form sections read by plugins

    @property
    def run_dir(self) -> Path:
        return Path(self.fileroot) / self.experiment_name / self.trial_name


# --------------------------------------------------------------------------- structuring


def _type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _structure(value: Any, tp: Any, key: str) -> Any:
    """Convert plain YAML data to ``tp``, raising ConfigError at the first wrong key/type."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if _is_union(tp):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _structure(value, arg, key)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[0] if len(errors) == 1 else ConfigError(
            key, f"expected {_type_name(tp)}, got {value!r}"
        )
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(key, f"must be one of {', '.join(map(repr, choices))}, got {value!r}")
        return value
    if attrs.has(tp):
        return _structure_attrs(value, tp, key)
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(key, f"expected a list, got {value!r}")
        (item_tp,) = typing.get_args(tp)
        return [_structure(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(key, f"expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, f"expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, f"expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if isinstance(value, (bool, int, float)):  # YAML's reading of an unquoted off/yes/123
            raise ConfigError(
                key,
                f"expected a string, got {value!r}: YAML read the unquoted value as a {type(value).__name__}; "
                f"""quote it ('{key}="..."' on the command line, "..." in a file)""",
            )
        if not isinstance(value, str):
            raise ConfigError(key, f"expected a string, got {value!r}")
        return value
    raise TypeError(f"config type {tp!r} at {key} is not supported")  # a bug in this module


#: Keys that older configs may still carry, and what took their place.
REPLACED_KEYS = {
    "actor.behav_imp_weight_cap": "use actor.offpolicy: corrections [mis] with mis.upper=CAP masks, [tis] with "
    "tis.cap=CAP truncates (docs/algorithms.md)",
    "actor.behav_imp_weight_mode": "use actor.offpolicy.corrections: [mis] masks, [tis] truncates (docs/algorithms.md)",
}


def _structure_attrs(value: Any, cls: type, key: str) -> Any:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ConfigError(key, f"expected a mapping, got {value!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in attrs.fields(cls)}
    for name in value:
        if name not in fields:
            dotted = _join(key, str(name))
            if dotted in REPLACED_KEYS:
                raise ConfigError(dotted, f"was replaced: {REPLACED_KEYS[dotted]}")
            near = difflib.get_close_matches(str(name), fields, n=1)
            hint = f"; did you mean {_join(key, near[0])!r}?" if near else ""
            raise ConfigError(dotted, f"unknown key{hint}")
    kwargs = {name: _structure(v, hints[name], _join(key, name)) for name, v in value.items()}
    try:
        return cls(**kwargs)
    except ValueError as exc:  # a field validator: find which field by re-validating each
        for name, field in fields.items():
            if name in kwargs and field.validator is not None:
                try:
                    field.validator(None, field, kwargs[name])
                except ValueError as field_exc:
                    raise ConfigError(_join(key, name), str(field_exc)) from None
        raise ConfigError(key, str(exc)) from None


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def to_dict(config: Any) -> dict[str, Any]:
    """Plain data (YAML-safe) for a config or section."""
    return attrs.asdict(config, recurse=True)


def from_dict(data: dict[str, Any], cls: type = Config, key: str = "") -> Any:
    """Structure ``data`` as ``cls``; errors name keys under the dotted prefix ``key``."""
    return _structure_attrs(data, cls, key)


def dump_yaml(config: Any) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False)


# --------------------------------------------------------------------------- overrides


def parse_override(item: str) -> tuple[list[str], Any, bool]:
    """``"actor.world_size=2"`` -> (["actor", "world_size"], 2, False); the value is parsed as YAML.

    ``key=value`` merges a mapping value into the section key by key; ``key:=value`` replaces it
    (the third item is True).
    """
    key, sep, raw = item.partition("=")
    replace = key.endswith(":")
    key = key.removesuffix(":")
    if not sep or not key.strip():
        raise ConfigError(item, "overrides look like dotted.key=value, e.g. actor.world_size=2")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value, replace


def _merge(node: dict[str, Any], key: str, value: Any) -> None:
    """``node[key] = value``, except that a mapping merges into a mapping key by key."""
    current = node.get(key)
    if isinstance(value, dict) and isinstance(current, dict):
        for name, item in value.items():
            _merge(current, name, item)
    else:
        node[key] = value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        path, value, replace = parse_override(item)
        node = data
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise ConfigError(".".join(path[: i + 1]), f"is a value, not a section ({item})")
            node = child
        if replace:
            node[path[-1]] = value
        else:
            _merge(node, path[-1], value)
    return data


def _read_yaml(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        raise ConfigError("", f"config file {str(p)!r} is a directory; give a YAML file")
    if not p.is_file():
        raise ConfigError("", f"config file {str(p)!r} does not exist")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError("", f"{p} is not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError("", f"{p} must hold a mapping of config keys at the top level")
    return data


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | None = None) -> Config:
    """Read YAML (or start from defaults), apply dotted overrides, structure and check it.

    Plugin-dependent checks (registered names, algorithm needs) happen in
    :func:`areal_core.resolve.resolve_config`.
    """
    data = _read_yaml(path) if path is not None else {}
    data = apply_overrides(data, list(overrides or []))
    config = from_dict(data)
    check_config(config)
    return config


def check_config(config: Config) -> None:
    """Cross-field checks that need no plugins."""
    if config.train_dataset.batch_size * config.gconfig.n_samples < config.actor.ppo_n_minibatches:
        raise ConfigError(
            "actor.ppo_n_minibatches",
            f"{config.actor.ppo_n_minibatches} minibatches but only "
            f"{config.train_dataset.batch_size * config.gconfig.n_samples} samples per step; lower it",
        )
    if config.actor.eps_clip_higher is not None and config.actor.eps_clip_higher < config.actor.eps_clip:
        raise ConfigError(
            "actor.eps_clip_higher",
            f"{config.actor.eps_clip_higher} is below actor.eps_clip={config.actor.eps_clip}; "
            "clip-higher must be >= eps_clip",
        )
    if config.reward.overlong_buffer > config.gconfig.max_new_tokens:
        raise ConfigError(
            "reward.overlong_buffer",
            f"{config.reward.overlong_buffer} is more than gconfig.max_new_tokens={config.gconfig.max_new_tokens}; "
            "give at most that",
        )
    _check_offpolicy(config.actor.offpolicy)
    _check_sequence_parallel(config)
    _check_cluster(config)
    _check_cpus(config)
    _check_model_path_value(config.model.path)
    if config.actor.lora is not None:
        _check_lora(config.actor.lora)
    for i, stop in enumerate(config.gconfig.stop):
        if not stop:
            raise ConfigError(
                f"gconfig.stop[{i}]", "empty stop string: it would end every completion at once; remove it"
            )
    for key in ("experiment_name", "trial_name"):
        value = getattr(config, key)
        if not value or "/" in value or value.startswith("."):
            raise ConfigError(key, f"{value!r} must be a plain directory name")


def _check_offpolicy(offpolicy: OffPolicyConfig) -> None:
    names = offpolicy.corrections
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError("actor.offpolicy.corrections", f"{names}: {repeated[0]} is listed twice; list it once")
    weights = [n for n in names if n in WEIGHT_CORRECTIONS]
    if len(weights) > 1:
        raise ConfigError(
            "actor.offpolicy.corrections",
            f"{names}: {' and '.join(weights)} each set the importance weight; keep one (m2po combines with any)",
        )


def sequence_parallel_problem(heads: int, kv_heads: int, sp: int) -> str | None:
    """Why a model with ``heads`` query and ``kv_heads`` key/value heads cannot run at SP size
    ``sp`` (None: it can). Query heads split over the SP ranks; kv heads split too, or, when there
    are fewer of them than ranks, are repeated to one per rank."""
    if heads % sp:
        return f"{sp} does not divide the model's {heads} attention heads; use a divisor of {heads}"
    if kv_heads % sp and sp % kv_heads:
        return (
            f"{sp} and the model's {kv_heads} kv heads do not divide one another; use a divisor or multiple of {kv_heads}"
        )
    return None


def _check_sequence_parallel(config: Config) -> None:
    sp, world = config.actor.sequence_parallel, config.actor.world_size
    if world % sp:
        raise ConfigError(
            "actor.sequence_parallel",
            f"{sp} does not divide actor.world_size={world}; world_size = data x sequence parallel",
        )
    if sp > 1 and config.actor.share_prefixes:
        raise ConfigError(
            "actor.share_prefixes", "true does not combine with actor.sequence_parallel > 1; set one of them off"
        )
    if sp > 1 and not config.model.path:  # the tiny model's heads are known now; a model directory's at preflight
        problem = sequence_parallel_problem(config.model.tiny.num_heads, config.model.tiny.num_kv_heads, sp)
        if problem:
            raise ConfigError("actor.sequence_parallel", problem)


def _check_cpus(config: Config) -> None:
    """``rollout.cpus`` / ``actor.cpus``: distinct cores this process may use, local scheduler only."""
    for key, cpus in (("rollout.cpus", config.rollout.cpus), ("actor.cpus", config.actor.cpus)):
        if not cpus:
            continue
        if config.scheduler != "local":
            raise ConfigError(key, f"pins processes under the local scheduler only (scheduler: {config.scheduler}); remove it")
        available = sorted(os.sched_getaffinity(0))
        bad = [c for c in cpus if c not in available]
        if bad or len(set(cpus)) != len(cpus):
            what = f"CPU {bad[0]!r} is not available here" if bad else f"{cpus} repeats a CPU"
            raise ConfigError(key, f"{what}; give distinct CPUs from {available}")


def _check_model_path_value(path: str) -> None:
    """An existing path, a source of a known scheme (converted at run time) or a hub id."""
    from areal_core.api.hub import is_hub_id
    from areal_core.model_source import check_scheme, is_source

    if not path or Path(path).exists():
        return
    check_scheme(path, "model.path")
    if not is_source(path) and not is_hub_id(path):
        raise ConfigError(
            "model.path", f"{path!r} does not exist; give a HF model directory, a hub id (org/name), a source "
            "(pypi:<distribution>, gguf:<file.gguf>) or leave it empty for the tiny model"
        )  # fmt: skip


def _check_lora(lora: LoraConfig) -> None:
    if not lora.target_modules or not all(isinstance(m, str) and m for m in lora.target_modules):
        raise ConfigError(
            "actor.lora.target_modules",
            f"{lora.target_modules!r}: list the linear layers to adapt, e.g. [q_proj, v_proj]",
        )
    import importlib.util

    if importlib.util.find_spec("peft") is None:
        raise ConfigError("actor.lora", "LoRA needs peft, which is not installed; pip install 'areal-core[lora]'")


def config_and_overrides(config: str | None, args: Sequence[str]) -> tuple[str | None, list[str]]:
    """The config file and the overrides from ``[--config] CONFIG.yaml [k=v ...]``: both ``areal``
    and the launcher take the file as the first argument without ``=`` or after ``--config``."""
    args = list(args)
    if args and "=" not in args[0]:
        if config is not None:
            raise ConfigError("", f"two config files given ({config} and {args[0]}); give one, as --config FILE or FILE")
        config = args.pop(0)
    stray = [a for a in args if "=" not in a]
    if stray:
        raise ConfigError("", f"{stray[0]!r} is not a key=value override; give the config file first, once")
    return config, args


_ROLE_RESOURCE_KEYS = ("ray.server_resources", "ray.trainer_resources")


def _check_cluster(config: Config) -> None:
    """``cluster.bind_host`` is an IP address; role resources are positive custom Ray resources."""
    host = config.cluster.bind_host
    if host:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ConfigError(
                "cluster.bind_host", f"{host!r} is not an IP address; give this node's IP, 0.0.0.0, or leave it empty"
            ) from None
    for key, resources in zip(_ROLE_RESOURCE_KEYS, (config.ray.server_resources, config.ray.trainer_resources)):
        for name, amount in resources.items():
            if name in ("CPU", "GPU", "NPU", "memory") or amount <= 0:
                raise ConfigError(
                    f"{key}.{name}",
                    f"{amount!r} is not allowed; give a custom node resource with a positive amount, e.g. "
                    '{"rollout": 1} (CPUs and devices come from threads_per_* and devices_per_server)',
                )
