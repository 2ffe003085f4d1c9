"""The built-in RL trainer: one controller process driving the rollout and training planes.

Each step: ``prepare_batch`` (rollouts keep flowing between steps, bounded by the staleness) ->
advantages -> PPO minibatches on the FSDP2 workers (which take the proximal log-probs when the
algorithm needs them, from the update's own forward when there is one minibatch) -> the updater's
own part of the update while generation goes on (``stage``, where it can), pause generation,
``weight_updater.update(v+1)``, bump the version, resume (in asynchronous runs on a thread while
the next step trains: :mod:`areal_core.weight_publisher`) -> stats, evaluation, checkpoints and
recover points on their schedules. ``time/*`` stats say where each step went;
``timeline.jsonl`` records each phase and the rollout concurrency (:mod:`areal_core.timeline`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import attrs

from areal_core.api.errors import PluginError
from areal_core.api.stats_sink import SampleRow, SinkRun
from areal_core.config import Config, DatasetConfig, dump_yaml, to_dict
from areal_core.controller_tuning import controller_tuning
from areal_core.plugins import Plugins, load_plugins
from areal_core.process_memory import peak_rss_by_group, render_peaks
from areal_core.recover import RecoverInfo, RecoverStore, check_fingerprint, fingerprint
from areal_core.resolve import adapter_weight_path_note, resolve_config
from areal_core.rollout.runner import RolloutRunner
from areal_core.rollout.failures import FailureCounts, FailureTracker
from areal_core.sample_tables import eval_rows, train_rows
from areal_core.sink_runner import RunStats
from areal_core.api.workflow import Workflow
from areal_core.timeline import Timeline, open_timeline
from areal_core.weight_publisher import WeightPublisher
from areal_core.api.trajectory import Trajectory

if TYPE_CHECKING:
    from areal_core.rollout.reward_runner import RewardRunner

logger = logging.getLogger(__name__)

EVAL_SAMPLES_FILE = "eval_samples.jsonl"  # every held-out answer of every evaluation, in the run dir
LIVENESS_POLL_S = 5.0  # while waiting for rollouts, check this often that no process has died


@attrs.frozen(kw_only=True)
class RunSummary:
    steps: int
    samples: int
    output_tokens: int
    wall_seconds: float  # the training loop (tokens/s is over this)
    startup_seconds: float  # from Trainer() to the first step: data, model, servers, workers, weight path
    reward_first: float
    reward_last: float
    eval_accuracy: float | None
    eval_accuracy_start: float | None = None  # before the first step (``stats.eval_at_start``)
    peak_rss: dict[str, tuple[int, int]] = attrs.Factory(dict)  # process group -> (processes, bytes)
    episode_failures: FailureCounts  # failed episode attempts (retries included)
    reward_failures: FailureCounts  # reward calls that raised, timed out or killed their worker
    eval_failures: FailureCounts = attrs.Factory(FailureCounts)  # held-out episodes that failed (scored 0)
    run_dir: Path
    final_model: Path
    sinks: tuple[str, ...] = ("jsonl", "tensorboard")  # stats.sinks

    def render(self) -> str:
        """Plain text: print it with ``print`` (rich would wrap long paths at 80 columns without a TTY)."""
        rate = self.output_tokens / max(self.wall_seconds, 1e-9)
        acc = "-" if self.eval_accuracy is None else f"{self.eval_accuracy:.2f}"
        if self.eval_accuracy_start is not None:
            acc = f"{self.eval_accuracy_start:.2f} -> {acc}"
        ep, rw, ev = self.episode_failures, self.reward_failures, self.eval_failures
        held_out = f"   {ev.failed} of {ev.total} held-out episodes ({ev.rate:.0%})" if ev.total else ""
        return "\n".join(
            [
                f"steps {self.steps}   samples {self.samples}   generated tokens {self.output_tokens}   ({rate:.0f} tokens/s)",
                f"wall {self.startup_seconds + self.wall_seconds:.0f}s   start-up {self.startup_seconds:.0f}s"
                f"   training {self.wall_seconds:.0f}s",
                f"train reward {self.reward_first:.2f} -> {self.reward_last:.2f}   held-out greedy accuracy {acc}",
                f"failures     {ep.failed} of {ep.total} episode attempts ({ep.rate:.0%})   "
                f"{rw.failed} of {rw.total} reward calls ({rw.rate:.0%}){held_out}",
                *([f"peak RSS     {render_peaks(self.peak_rss)}"] if self.peak_rss else []),
                f"run dir      {self.run_dir}",
                f"final model  {self.final_model}",
                f"reward curve {self.run_dir / 'reward_curve.png'}",
                *([f"stats        {self._sinks_line()}"] if self.sinks else []),
            ]
        )

    def _sinks_line(self) -> str:
        where = {"jsonl": str(self.run_dir / "stats.jsonl"), "tensorboard": f"TensorBoard: {self.run_dir / 'tensorboard'}"}  # fmt: skip
        first, *rest = [where.get(name, name) for name in self.sinks]
        return f"{first} ({', '.join(rest)})" if rest else first


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def order_batch(batch: list[Trajectory]) -> list[Trajectory]:
    """Groups in prompt order, samples in sampling order: the same rollouts give the same update."""
    return sorted(batch, key=lambda t: (t.prompt_id, t.info.get("epoch", 0), t.info.get("sample_index", 0)))


WorkflowFactory = Callable[["Planes"], Workflow]


def rlvr_workflow(planes: Planes) -> Workflow:
    """The default workflow: sample ``gconfig.n_samples`` completions per prompt, score each."""
    from areal_core.rollout.rlvr import RLVRWorkflow

    return RLVRWorkflow(planes.tokenizer, planes.config.gconfig, planes.rewards, seed=planes.config.seed)


class Trainer:
    """Builds both planes from a resolved config and runs the training loop.

    ``workflow`` builds the training workflow once the planes are up (it gets the tokenizer, the
    reward runner, the engine and the config through ``planes``); the default is RLVR.
    """

    def __init__(
        self, config: Config, plugins: Plugins | None = None, workflow: WorkflowFactory = rlvr_workflow
    ) -> None:
        self.created = time.perf_counter()  # start-up is counted from here
        self.workflow_factory = workflow
        self.plugins = plugins or load_plugins()
        self.config, self.platform = resolve_config(config, self.plugins)
        if (note := adapter_weight_path_note(config, self.plugins)) is not None:
            say(note)
        self.run_dir = self.config.run_dir

    # ------------------------------------------------------------------ set-up
    def _model_path(self, items: list[dict[str, Any]]) -> str:
        from areal_core.api.hub import is_hub_id, snapshot
        from areal_core.model_source import is_source, prepare_model

        path, models_root = self.config.model.path, Path(self.config.fileroot) / "models"
        if path:  # a source becomes its converted directory, a hub id its snapshot: servers load directories
            if is_source(path):
                return str(prepare_model(path, models_root))
            return str(snapshot(path, "model.path")) if is_hub_id(path) else path
        from areal_core.api.dataset import corpus
        from areal_core.tiny_model import ensure_tiny_model

        return str(ensure_tiny_model(self.config.model.tiny, corpus(items), models_root, self.config.seed))

    def run(self) -> RunSummary:
        """Check what the config points at, lock the run directory, start both planes, train."""
        from areal_core.active_platform import activate_platform
        from areal_core.preflight import preflight
        from areal_core.run_lock import RunLock

        items = preflight(self.config, self.plugins)
        train_items, valid_items = items["train"], items.get("valid", [])
        with RunLock(self.run_dir):
            fixed = fingerprint(self.config)
            latest = RecoverStore(self.run_dir / "recover").latest() if self.config.recover.mode == "auto" else None
            if latest is not None and latest.fingerprint:
                check_fingerprint(latest.fingerprint, self.config, latest.step)
            activate_platform(self.platform)
            model_path = self._model_path(train_items + valid_items)
            say(f"run dir {self.run_dir}; {len(train_items)} train / {len(valid_items)} held-out items; model {model_path}")
            config = attrs.evolve(self.config, model=attrs.evolve(self.config.model, path=model_path))
            (self.run_dir / "config.yaml").write_text(dump_yaml(config))
            _stop_on_signals()
            with controller_tuning(), Planes(config, self.plugins, self.platform) as planes:
                loop = _Loop(config, planes, train_items, valid_items, self.workflow_factory(planes), fixed)
                return loop.run(self.created)


class Planes:
    """Starts the reward workers, servers, training workers and the weight path (stopped on exit).

    A workflow factory is given them once they are up, to read ``config``, ``plugins``, ``tokenizer``,
    ``rewards``, ``engine``, ``scheduler``, ``trainer``, ``updater``, ``fleet`` and ``algorithm`` and
    to register its own clean-up with ``on_exit``.
    """

    def __init__(self, config: Config, plugins: Plugins, platform: Any) -> None:
        self.config, self.plugins, self.platform = config, plugins, platform

    def __enter__(self) -> Planes:
        from areal_core.control_endpoint import ControlServer
        from areal_core.rollout.fleet import ServerFleet
        from areal_core.rollout.ledger import LEDGER_FILE, Ledger
        from areal_core.scheduler import controller_cpus, make_scheduler
        from areal_core.scheduler.local import pinned
        from areal_core.train.worker_group import TrainWorkerGroup

        config = self.config
        self._stack = ExitStack()
        try:
            if cpus := controller_cpus(config):  # before the reward workers start: they inherit it
                self._stack.enter_context(pinned(cpus))
            self.rewards = self._stack.enter_context(self._start_rewards())
            say(
                f"starting {config.rollout.servers} {config.rollout.engine} inference server(s) and "
                f"{config.actor.world_size} training worker(s) ({config.scheduler} scheduler)"
            )
            self.scheduler = self._stack.enter_context(make_scheduler(config, self.platform))
            self.engine = self.plugins.get("engine", config.rollout.engine)(config, self.platform)
            self._stack.callback(self.engine.close)
            servers_up = self.engine.start_servers(self.scheduler)  # they load while the controller and trainer do
            from transformers import AutoTokenizer  # here, not above: its import is start-up the servers overlap

            self.tokenizer = AutoTokenizer.from_pretrained(config.model.path)
            self.trainer = self._stack.enter_context(
                TrainWorkerGroup(config, self.platform, self.scheduler, config.model.path, config.run_dir)
            )
            servers_up()
            say(
                f"connecting the {config.actor.weight_update} weight path; reward {config.reward.name} "
                f"in {config.reward.workers} worker process(es)"
            )
            self.updater = self.plugins.get("weight_updater", config.actor.weight_update)(config, self.platform)
            self.updater.connect(self.trainer, self.engine)
            self._stack.callback(self.updater.close)
            self.ledger = Ledger(config.run_dir / LEDGER_FILE)  # appended to across restarts
            self._stack.callback(self.ledger.close)
            self.fleet = self._stack.enter_context(ServerFleet(self.engine, config, self.ledger))
            self._stack.enter_context(ControlServer(self.fleet, config.run_dir))  # `areal servers ...`
            self.algorithm = self.plugins.get("algorithm", config.actor.algorithm)(config.actor)
        except BaseException:
            self._stack.close()
            raise
        return self

    def _start_rewards(self) -> RewardRunner:
        """The reward runner with its workers up: their start-up (the forkserver imports ``__main__``
        and the reward's module) is start-up time, not the first batch's, and a reward that cannot
        load in a worker stops the run here, before any server starts."""
        from areal_core.rollout.reward_runner import RewardRunner

        config = self.config
        window = config.rollout.failure_window_steps * config.train_dataset.batch_size * config.gconfig.n_samples
        failures = FailureTracker(
            "reward calls", "reward.max_failure_rate", max_rate=config.reward.max_failure_rate, window=window
        )
        runner = RewardRunner(
            self.plugins.get("reward", config.reward.name),
            workers=config.reward.workers, timeout=config.reward.timeout, failures=failures,
        )  # fmt: skip
        try:
            runner.start()
        except RuntimeError as exc:
            runner.close()
            raise PluginError(f"reward.name {config.reward.name!r}: {exc}") from None
        return runner

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def on_exit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when the planes stop, before the servers (e.g. a workflow's agent proxy)."""
        self._stack.callback(callback)


def _stop_on_signals() -> None:
    """SIGINT and SIGTERM (from a launcher or scheduler) unwind like Ctrl-C, so every plane is
    stopped; also where SIGINT was inherited ignored (a shell's background job, ``nohup ... &``)."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _fit(items: list[dict], tokenizer: Any, config: Config, dataset: DatasetConfig | None, split: str) -> list[dict]:
    """``items`` that fit the model's context (``max_position_embeddings`` in its config.json)."""
    import json

    from areal_core.dataset_loading import fit_context

    context = json.loads((Path(config.model.path) / "config.json").read_text()).get("max_position_embeddings")
    if dataset is None or not items or not isinstance(context, int):
        return items
    return fit_context(items, tokenizer, context, config.gconfig.max_new_tokens, dataset, split)


class _Loop:
    def __init__(
        self,
        config: Config,
        planes: Planes,
        train_items: list[dict],
        valid_items: list[dict],
        workflow: Workflow,
        fixed: dict[str, Any],
    ) -> None:
        from areal_core.rollout.dataloader import PromptLoader
        from areal_core.rollout.rlvr import RLVRWorkflow

        self.config, self.planes = config, planes
        train_items = _fit(train_items, planes.tokenizer, config, config.train_dataset, "train")
        self.loader = PromptLoader(train_items, shuffle=config.train_dataset.shuffle, seed=config.seed)
        self.valid_items = _fit(valid_items, planes.tokenizer, config, config.valid_dataset, "valid")
        self.workflow = workflow
        self.eval_workflow = RLVRWorkflow(
            planes.tokenizer, attrs.evolve(config.gconfig, n_samples=1), planes.rewards, greedy=True
        )
        self.recover = RecoverStore(config.run_dir / "recover")
        self.fixed = fixed  # the fingerprint each recover point stores
        self.run_dir = config.run_dir
        self.timeline = Timeline(None)  # replaced by the run's recorder in run()
        self.eval_failures = FailureCounts()  # held-out episodes of every evaluation so far
        self.train_items_by_id = {str(item["id"]): item for item in train_items}  # the sample tables' prompts

    # ------------------------------------------------------------------ helpers
    def _restore(self) -> int:
        """Resume from the last recover point when ``recover.mode=auto``; returns the start step.

        Restores the trainer's checkpoint, the loader position and the servers' weights, and
        re-queues the items that were in flight when the recover point was written.
        """
        info = self.recover.latest() if self.config.recover.mode == "auto" else None
        version = info.version if info else 0
        self.rollout = RolloutRunner.from_config(
            self.planes.engine, self.config, version, self.planes.ledger, self.timeline
        )
        self.planes.ledger.record("start", version=version, dataset_size=len(self.loader), recovered=info is not None)
        if info is None:
            return 0
        self.planes.trainer.load_checkpoint(str(info.checkpoint))
        self.loader.load_state_dict(info.loader_state)
        self.planes.updater.update(info.version)
        for item in info.in_flight:
            self.rollout.submit(item, self.workflow)
        logger.warning("recovered from step %d (weight version %d)", info.step, info.version)
        return info.step

    def _evaluate(self, step: int) -> float:
        """Greedy accuracy (mean reward) on the held-out set, through the live servers; each answer
        is appended to ``eval_samples.jsonl`` in the run directory (step, id, reward, completion and
        the item's gold ``answer``, if it has one). An episode that fails scores 0, its error in
        its row and one line for all of them."""
        import asyncio

        self.publisher.wait()  # on the version just published

        async def one(item: dict[str, Any]) -> Trajectory | Exception:
            try:
                (traj,) = await self.eval_workflow(self.planes.engine, item)
            except Exception as exc:  # noqa: BLE001 - a failed held-out episode scores 0, as in training
                return exc
            return traj

        async def all_items() -> list[Trajectory | Exception]:
            return list(await asyncio.gather(*(one(item) for item in self.valid_items)))

        results = self.rollout.run(all_items())
        if self.stats.takes_tables:
            self.stats.log_samples(step, eval_rows(step, self.valid_items, results, self.config.stats.samples))
        with (self.run_dir / EVAL_SAMPLES_FILE).open("a") as out:
            for item, result in zip(self.valid_items, results, strict=True):
                row: dict[str, Any] = {"step": step, "id": str(item["id"]), "answer": item.get("answer")}
                if isinstance(result, Exception):
                    row.update(reward=0.0, error=f"{type(result).__name__}: {result}")
                else:
                    row.update(reward=result.reward, output_tokens=result.n_output_tokens,
                               stop_reason=result.info.get("stop_reason"), completion=result.info.get("completion"))  # fmt: skip
                out.write(json.dumps(row) + "\n")
        failed = [result for result in results if isinstance(result, Exception)]
        self.eval_failures = FailureCounts(self.eval_failures.failed + len(failed), self.eval_failures.total + len(results))
        if failed:
            say(f"evaluation at step {step}: {len(failed)} of {len(results)} held-out episodes failed and score 0 "
                f"(last: {type(failed[-1]).__name__}: {failed[-1]})")  # fmt: skip
        return _mean([0.0 if isinstance(result, Exception) else result.reward for result in results])

    def _evaluate_at_start(self, start_step: int, timeline: Timeline) -> float | None:
        """The held-out accuracy before training (the summary's and the reward curve's step 0; its
        answers in ``eval_samples.jsonl``), where ``stats.eval_at_start`` asks for it and this run
        starts at step 0 with evaluation on."""
        stats = self.config.stats
        if start_step or not (stats.eval_at_start and stats.eval_every and self.valid_items):
            return None
        with timeline.span("eval", 0):
            accuracy = self._evaluate(0)
        self.stats.log_scalars(0, {"eval/accuracy": accuracy})
        say(f"held-out greedy accuracy before training: {accuracy:.2f} ({len(self.valid_items)} items)")
        return accuracy

    def _open_stats(self, start_step: int) -> RunStats:
        """The run's sinks (``stats.sinks``), and its history: a recovered run's rows up to its resume step."""
        from areal_core.builtin.stats_sinks.jsonl import STATS_FILE, read_rows

        config = self.config
        run = SinkRun(
            run_dir=self.run_dir, experiment_name=config.experiment_name, trial_name=config.trial_name,
            config=to_dict(config), options={}, resume_step=start_step,
        )  # fmt: skip
        return RunStats(
            {name: self.planes.plugins.get("stats_sink", name) for name in config.stats.sinks},
            run,
            options=config.plugins,
            history=read_rows(self.run_dir / STATS_FILE, start_step) if start_step else [],
            timeout=config.stats.sink_timeout,
            report=say,
        )

    def _train_sample_rows(self, step: int, batch: list[Trajectory]) -> list[SampleRow]:
        """Every ``stats.samples_every`` steps, a table of the samples the step trained on."""
        every = self.config.stats.samples_every
        if not (self.stats.takes_tables and every and step % every == 0):
            return []
        return train_rows(step, batch, self.train_items_by_id, self.config.stats.samples)

    def _next_batch(self, step: int, version: int) -> list[Trajectory]:
        """``prepare_batch`` for the trainer's ``version``, checking between waits that the workers are
        up and servers are serving, and reporting failures meanwhile (a step whose episodes keep
        failing may never come)."""
        while True:
            try:
                return self.rollout.prepare_batch(
                    self.loader,
                    self.workflow,
                    self.config.train_dataset.batch_size,
                    timeout=LIVENESS_POLL_S,
                    trainer_version=version,
                )
            except TimeoutError:
                self._report_failures(f"waiting for step {step}")
                self._tend_fleet()

    def _trackers(self) -> list[FailureTracker]:
        return [self.rollout.failures, self.planes.rewards.failures]

    def _report_failures(self, when: str) -> None:
        """One warning line per tracker with failures since the last report; abort on too many."""
        for tracker in self._trackers():
            _, line = tracker.report()
            if line is not None:
                logger.warning("%s: %s", when, line)
            tracker.check()

    def _failure_stats(self, last: list[FailureCounts]) -> dict[str, float]:
        """This step's failure shares (``last``: the run's counts at the previous step, updated)."""
        rates = []
        for i, tracker in enumerate(self._trackers()):
            now = tracker.run
            rates.append(FailureCounts(now.failed - last[i].failed, now.total - last[i].total).rate)
            last[i] = now
        return {"rollout/failure_rate": rates[0], "reward/error_rate": rates[1]}

    def _tend_fleet(self) -> None:
        """A dead training worker stops the run; lost servers are the fleet's (it raises when none
        is left), and a server waiting to join loads the current weights now, not after the step."""
        fleet = self.planes.fleet
        self.publisher.wait()  # its load is the fleet's business too
        self.planes.scheduler.check_alive(exclude=fleet.server_handles())
        fleet.ensure_serving()
        if fleet.has_pending():
            self.publisher.publish(self.rollout.version, self.rollout.version)

    def _train_on(self, batch: list[Trajectory], step: int) -> dict[str, float]:
        import torch

        from areal_core.reward_shaping import shaped_rewards
        from areal_core.train.fsdp_policy import MINIBATCH_S

        planes = self.planes
        rewards, stats = shaped_rewards(batch, self.config)
        prompt_index = {pid: i for i, pid in enumerate(dict.fromkeys(t.prompt_id for t in batch))}
        group_ids = torch.tensor([prompt_index[t.prompt_id] for t in batch])
        keep = planes.algorithm.filter_groups(rewards, group_ids)
        stats["rollout/kept_fraction"] = float(keep.float().mean())
        if not bool(keep.any()):
            return stats
        batch = [t for t, k in zip(batch, keep.tolist()) if k]
        rewards, group_ids = rewards[keep], group_ids[keep]
        advantages = planes.algorithm.compute_advantages(rewards, group_ids).tolist()
        recompute = planes.algorithm.needs_proximal_logprobs and self.config.actor.recompute_logprobs
        call_start = time.perf_counter()
        result = planes.trainer.train_step(batch, advantages, None, recompute_prox=recompute)
        minibatch_s = [result.pop(f"{MINIBATCH_S}{i}") for i in range(sum(k.startswith(MINIBATCH_S) for k in result))]
        self._worker_spans(step, call_start, time.perf_counter(), result.get("time/prox_logp_s", 0.0), minibatch_s)
        stats.update({k if k.startswith("time/") else f"train/{k}": float(v) for k, v in result.items()})
        return stats

    def _worker_spans(self, step: int, start: float, end: float, prox_s: float, minibatch_s: list[float]) -> None:
        """The workers' phases on the timeline, laid out from the call's ``start`` (worker clocks are
        not the controller's): proximal pass, each minibatch, then the call's rest (``rpc``)."""
        t = start
        if prox_s > 0:
            self.timeline.add_span("prox_logp", step, t, t + prox_s, parent="train")
            t += prox_s
        for i, seconds in enumerate(minibatch_s):
            self.timeline.add_span("minibatch", step, t, t + seconds, parent="train", index=i)
            t += seconds
        self.timeline.add_span("rpc", step, min(t, end), end, parent="train")

    def _save_recover_point(self, step: int) -> None:
        self.publisher.wait()  # the servers hold this step's version

        def write_checkpoint(path: Path) -> None:
            self.planes.trainer.save_checkpoint(str(path))

        with self.rollout.intake_held():  # the loop refills the pipe from the loader between steps
            loader_state, in_flight = self.loader.state_dict(), self.rollout.in_flight()
        self.recover.save(
            RecoverInfo(
                step=step,
                version=step,
                loader_state=loader_state,
                in_flight=in_flight,
                checkpoint=Path(),
                fingerprint=self.fixed,
            ),
            write_checkpoint,
        )

    # ------------------------------------------------------------------ the loop
    def run(self, created: float) -> RunSummary:
        """Train to ``total_train_steps``; ``created`` (perf_counter) is when start-up began."""
        from areal_core.stats import plot_reward_curve

        config, planes = self.config, self.planes
        self.timeline = timeline = open_timeline(self.run_dir, config.stats.timeline, config.train_dataset.batch_size)
        start_step = self._restore()
        version = start_step
        rollout = self.rollout
        self.publisher = WeightPublisher(
            rollout, planes.fleet, planes.updater, timeline, overlap=config.rollout.max_head_offpolicyness > 0
        )
        rollout.start()
        self.stats = stats_log = self._open_stats(start_step)
        t0 = time.perf_counter()
        say(f"start-up took {t0 - created:.0f}s; training steps {start_step + 1}-{config.total_train_steps}")
        samples = tokens = 0
        last_eval: float | None = None
        first_eval = self._evaluate_at_start(start_step, timeline)
        progress = _Progress(config.total_train_steps, start_step, enabled=config.stats.progress)
        failure_counts = [tracker.run for tracker in self._trackers()]
        try:
            with progress:
                for step in range(start_step + 1, config.total_train_steps + 1):
                    step_start = time.perf_counter()
                    with timeline.span("rollout_wait", step) as wait:
                        batch = order_batch(self._next_batch(step, version))
                    if step == config.total_train_steps:
                        rollout.end_intake()  # no episode would be used
                    rollout_stats = rollout.stats
                    with timeline.span("train", step) as train:
                        stats = self._train_on(batch, step)
                    stats["time/rollout_wait_s"] = wait.seconds
                    stats["time/train_s"] = train.seconds
                    n_tokens = sum(t.n_output_tokens for t in batch)
                    samples, tokens = samples + len(batch), tokens + n_tokens
                    reward_mean = _mean([t.reward for t in batch])
                    train_rows = self._train_sample_rows(step, batch)  # the weight update frees the batch
                    version += 1
                    stats["time/weight_update_s"] = self.publisher.publish(version, step, done_with=batch)
                    stats.update(
                        {
                            "reward/mean": reward_mean,
                            "rollout/max_lag": float(rollout_stats.batch_max_lag),
                            "rollout/mean_lag": rollout_stats.batch_mean_lag,
                            "rollout/rejected": float(rollout_stats.rejected),
                            "rollout/failed": float(rollout_stats.failed),
                            "rollout/retried": float(rollout_stats.retried),
                            "rollout/reward_errors": float(planes.rewards.stats.errors + planes.rewards.stats.timeouts),
                            "rollout/aborted_weight_updates": float(self.publisher.aborted),
                            "time/step_s": time.perf_counter() - step_start,
                            "perf/tokens_per_s": tokens / (time.perf_counter() - t0),
                            "perf/output_tokens": float(n_tokens),
                        }
                    )
                    every = config.stats.eval_every
                    if self.valid_items and every and (step % every == 0 or step == config.total_train_steps):
                        with timeline.span("eval", step):
                            last_eval = stats["eval/accuracy"] = self._evaluate(step)
                    stats.update(self._failure_stats(failure_counts))
                    stats_log.log_scalars(step, stats)
                    stats_log.log_samples(step, train_rows)
                    progress.update(step, stats)
                    self._report_failures(f"step {step}")
                    if config.recover.mode == "auto" and step % config.recover.freq_steps == 0:
                        with timeline.span("recover_point", step):
                            self._save_recover_point(step)
                    if config.saver.freq_steps and step % config.saver.freq_steps == 0:
                        with timeline.span("checkpoint", step):
                            self._save_hf(f"step{step}")
                    timeline.flush()
            self.publisher.wait()  # the last version's load, if it runs on
            with timeline.span("checkpoint", config.total_train_steps, final=True):
                final = self._save_hf("final")
            loop_seconds = time.perf_counter() - t0  # the loop ends here; stopping and plotting follow
            peaks = peak_rss_by_group(
                (handle.name, pid) for handle in planes.scheduler.handles if (pid := getattr(handle, "pid", None))
            )  # fmt: skip
        finally:
            self.publisher.close()
            timeline.flush()
            stats_log.close()
            rollout.stop()
        history = stats_log.history
        title = f"{config.experiment_name}/{config.trial_name}"
        plot_reward_curve(history, self.run_dir / "reward_curve.png", title, eval_at_start=first_eval)
        rewards = [row["reward/mean"] for row in history]
        return RunSummary(
            steps=len(history),
            samples=samples,
            output_tokens=tokens,
            wall_seconds=loop_seconds,
            startup_seconds=t0 - created,
            reward_first=rewards[0] if rewards else 0.0,
            reward_last=_mean(rewards[-5:]),
            eval_accuracy=last_eval,
            eval_accuracy_start=first_eval,
            peak_rss=peaks,
            episode_failures=self.rollout.failures.run,
            reward_failures=self.planes.rewards.failures.run,
            eval_failures=self.eval_failures,
            run_dir=self.run_dir,
            final_model=final,
            sinks=tuple(config.stats.sinks),
        )

    def _save_hf(self, name: str) -> Path:
        """Write an HF checkpoint under ``checkpoints/``, keeping ``saver.keep_last`` step ones."""
        root = self.run_dir / "checkpoints"
        path = root / name
        tmp = root / f".tmp-{name}"
        shutil.rmtree(tmp, ignore_errors=True)
        self.planes.trainer.save_hf(str(tmp))
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
        steps = sorted((p for p in root.glob("step*") if p.is_dir()), key=lambda p: int(p.name[4:]))
        for old in steps[: -self.config.saver.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        return path


def say(message: str) -> None:
    """One line for the user on stdout, shown at once (the log is for warnings and errors)."""
    print(f"areal: {message}", flush=True)


class _Progress:
    """A rich progress bar with step, reward, staleness and tokens/s; one plain line per step
    instead when disabled (``stats.progress=false``) or when stdout is not a terminal."""

    def __init__(self, total: int, done: int, *, enabled: bool) -> None:
        self.total, self.done = total, done
        self.enabled = enabled and sys.stdout.isatty()
        self._progress = None

    def __enter__(self) -> _Progress:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("{task.fields[status]}"),
            )
            self._progress.start()
            self._task = self._progress.add_task("train", total=self.total, completed=self.done, status="")
        return self

    def update(self, step: int, stats: dict[str, float]) -> None:
        status = (
            f"reward {stats['reward/mean']:.2f}  lag {stats['rollout/max_lag']:.0f}"
            f"  {stats['perf/tokens_per_s']:.0f} tok/s"
        )
        if "eval/accuracy" in stats:
            status += f"  eval {stats['eval/accuracy']:.2f}"
        if self._progress is not None:
            self._progress.update(self._task, completed=step, status=status)
        else:
            say(f"step {step}/{self.total}  {status}")

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
