"""The PPO loop of docs/algorithm.md §1, top to bottom: rollout → shaped reward → advantages → K epochs of updates.

Read :meth:`PPOTrainer.train_iteration` first; everything else sets up or persists state.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..algorithms import (
    AdvantageInputs,
    AdvantageSettings,
    assume_valid_masks,
    check_response_mask,
    compute_advantages,
    episode_returns,
    get_advantage_estimator,
    shape_rewards,
    whiten,
)
from ..config.io import dump_yaml, to_dict
from ..config.train import TrainConfig
from ..config.validate import effective_algo
from ..records import console
from ..records.metrics_log import MetricsLogger, truncate_jsonl
from ..rollout.score.batch import RolloutBatch
from ..rollout.score.scoring import score_trajectories
from ..rollout.trajectory import TrajectoryBatch
from ..runtime import distributed as dist
from ..runtime.files import OutputDirLock
from ..runtime.timing import Timer, throughput
from . import credit
from .assemble import assemble
from .banner import banner
from .checkpoint.state import load_checkpoint, save_checkpoint
from .correction import off_policy_correction
from .diagnostics import rollout_metrics, warn_if_no_signal
from .held_out import held_out_metrics
from .preflight import preflight
from .update import UpdateBatch, ppo_update


@dataclass
class Iteration:
    """What one iteration gives back: its metrics, and its rollout with the per-token targets computed
    from it (what ``credit.jsonl`` shows of sampled episodes)."""

    metrics: dict[str, float]
    batch: RolloutBatch
    targets: credit.CreditTargets


class PPOTrainer:
    """PPO (or a critic-free estimator) on Hugging Face causal LMs.

    Python API: ``PPOTrainer(cfg).train()``. ``policy``, ``tokenizer``, ``verifier`` and
    ``prompt_rows`` may be passed as objects instead of being built from ``cfg.model``/``cfg.data``.
    """

    def __init__(self, cfg: TrainConfig, *, policy=None, tokenizer=None, verifier=None, prompt_rows=None):
        dist.init_from_env()
        # Every check that needs no model first (docs/errors.md): a bad path fails in a second.
        pre = preflight(cfg, policy_given=policy is not None, tokenizer_given=tokenizer is not None,
                        verifier_given=verifier is not None, prompt_rows_given=prompt_rows is not None)
        self.resuming = pre.resuming
        # What the run's config.yaml and trackers record: the settings as given, "auto" kept, so a config
        # reused with another estimator resolves for that one. ``self.cfg`` is what runs.
        self.recorded_config = to_dict(cfg)
        parts = assemble(cfg, pre, policy=policy, tokenizer=tokenizer, verifier=verifier, prompt_rows=prompt_rows)
        self.cfg, self.sized, self.device = parts.cfg, parts.sized, parts.device
        self.rank, self.world = dist.rank(), dist.world_size()
        self.output_dir = Path(self.cfg.output_dir)
        self.estimator = get_advantage_estimator(self.cfg.algo.estimator)
        # the parts (trainer/assemble.py): the loop reads each through the part that holds it
        self.models, self.sampler, self.training = parts.models, parts.sampler, parts.training
        self.plan, self.source, self.scoring, self.held_out = parts.plan, parts.source, parts.scoring, parts.held_out
        self.warned_no_signal = False
        console.say(banner(self))

    # ------------------------------------------------------------------------------------------
    def train_iteration(self, iteration: int) -> Iteration:
        """One PPO iteration: take its trajectories from the source, score them, :meth:`learn` from
        them, publish the new weights to the engine. Returns the iteration's metrics and the credit
        data of its rollout."""
        timer = Timer()
        batch = self.rollout(iteration, timer)
        done = self.learn(batch, iteration, timer)
        with timer("publish_s"):  # an asynchronous learner may wait here for its producer: in iteration_s
            self.source.publish(iteration)  # the weights after this iteration's update, to whatever samples
        report = self.source.metrics(iteration)  # an asynchronous producer's own clock, the waits
        done.metrics.update(throughput(timer, batch.loss_mask, batch.size * self.world, epochs=self.cfg.optim.epochs,
                                       asynchronous=bool(self.cfg.rollout.max_staleness),
                                       sampled_s=report.get("producer_decode_s")), **report)
        return done

    def rollout(self, iteration: int, timer: Timer | None = None) -> RolloutBatch:
        # 1. Rollout: the iteration's trajectories from the source — responses sampled with π_old, or an
        #    environment's episodes played turn by turn — then scored here with π_old, π_ref, V_old and
        #    the reward. ``timer`` receives ``generate_s`` (sampling and the environments) and ``score_s``.
        timer = timer if timer is not None else Timer()
        with timer("generate_s"):
            trajectories = self.source.take(iteration)
        with timer("score_s"):
            return self.score(trajectories)

    def score(self, trajectories: TrajectoryBatch) -> RolloutBatch:
        """Trajectories → the rollout batch: every model's forward over them, then the reward."""
        return score_trajectories(self.models.for_scoring(), self.models.tokenizer, trajectories, self.scoring, device=self.device,
                                  lanes=self.training.learner.lanes)

    def learn(self, batch: RolloutBatch, iteration: int, timer: Timer | None = None) -> Iteration:
        """Steps 2–5 on this rank's share of a rollout; statistics are global over ranks. ``timer``: the
        one the rollout was timed with; :meth:`train_iteration` adds the rates once it has published."""
        cfg, a = self.cfg, self.cfg.algo
        timer = timer if timer is not None else Timer()
        beta = self.training.kl_ctl.value
        if not a.bootstrap_truncated and batch.bootstrap_values is not None:
            # the reward scored a cut response as it stands: nothing follows it, so V after it is 0
            batch = dataclasses.replace(batch, bootstrap_values=torch.zeros_like(batch.bootstrap_values))
        reward_beta = beta if a.kl_in == "reward" else 0.0

        # Checked once here; the algorithm functions below then skip their per-call mask checks.
        check_response_mask(batch.response_mask, batch.action_mask)
        mask = batch.loss_mask  # the sampled tokens: a multi-turn episode's observations carry no loss
        with assume_valid_masks():
            with timer("advantage_s"):
                # 2. Shaped reward: r_t = step_t − β·kl_t, plus the score at the last token (KL in the
                #    reward), or without the KL part when it is a loss term. Step rewards stay on their
                #    tokens for a critic; the critic-free estimators see the episode total.
                scores, steps = batch.scores, batch.step_rewards
                if steps is not None and not self.estimator.needs_critic:
                    scores, steps = episode_returns(batch.scores, batch.step_rewards, mask), None
                rewards = shape_rewards(scores, batch.logp_old, batch.logp_ref, mask, kl_coef=reward_beta,
                                        kl_estimator=a.kl_estimator, step_rewards=steps)
                critic_rewards = None
                if cfg.critic.target == "score" and reward_beta > 0:
                    critic_rewards = shape_rewards(scores, batch.logp_old, batch.logp_ref, mask, kl_coef=0.0,
                                                   step_rewards=steps)

                # 3. Advantages and critic targets (GAE, or a critic-free estimator).
                inputs = AdvantageInputs(
                    rewards=rewards, mask=mask, scores=scores, terminated=batch.terminated,
                    values=batch.values_old, bootstrap_values=batch.bootstrap_values,
                    group_size=cfg.rollout.samples_per_prompt, critic_rewards=critic_rewards,
                )
                settings = AdvantageSettings(gamma=a.gamma, lam=a.gae_lambda, critic_lam=cfg.critic.gae_lambda,
                                             adaptive_lam_alpha=a.adaptive_lambda_alpha)
                advantages, returns = compute_advantages(a.estimator, inputs, settings,
                                                         all_reduce=dist.all_reduce_sum)
                raw_advantages = advantages  # as the estimator returned them: the credit file shows both
                if self.estimator.whitened_by_trainer and a.whiten_advantages:
                    advantages = whiten(advantages, mask, all_reduce=dist.all_reduce_sum)

                # 3b. An off-policy correction (docs/algorithm.md §1.6): per-token weights on the policy loss
                #     for what π_behav sampled and the update clips against π_prox = π_old; its statistics.
                is_weights, off_policy = off_policy_correction(batch, mask, a, iteration=iteration,
                                                               lagged=bool(cfg.rollout.max_staleness))

            # 4. K epochs of minibatch updates on the fixed rollout.
            with timer("update_s"):
                upd = ppo_update(self.training.learner, UpdateBatch.of(batch, advantages, returns, is_weights), cfg, self.training.shuffle_gen,
                                 train_policy=iteration > cfg.critic.warmup_iterations,
                                 kl_coef=beta if a.kl_in == "loss" else 0.0,
                                 nonfinite_in_row=self.training.state.nonfinite_in_row, iteration=iteration)
        self.training.state.nonfinite_in_row = upd.nonfinite_in_row
        self.training.state.nonfinite_total += upd.skipped

        # 5. Diagnostics over the global batch, then the KL controller sees this batch's KL.
        metrics = rollout_metrics(batch, rewards, advantages, returns, beta=beta, kl_estimator=a.kl_estimator,
                                  samples_per_prompt=cfg.rollout.samples_per_prompt)
        self.warned_no_signal = warn_if_no_signal(metrics, warned=self.warned_no_signal)
        metrics.update(off_policy)  # and, asynchronous, how old the sampling weights were
        metrics.update(upd.stats.as_dict())
        metrics["lr_actor"] = upd.lr_actor
        if upd.lr_critic is not None:
            metrics["lr_critic"] = upd.lr_critic
        metrics["nonfinite_skipped_total"] = float(self.training.state.nonfinite_total)
        self.training.kl_ctl.update(metrics["ref_kl"], batch.size * self.world)
        targets = credit.CreditTargets(rewards, raw_advantages, advantages, returns, reward_beta)
        return Iteration(metrics, batch, targets)

    def evaluate(self, iteration: int) -> dict[str, float]:
        """Held-out evaluation (``data.eval_prompts``), trainer/held_out.py."""
        if self.held_out is None:
            raise ValueError("this run has no held-out prompts (`data.eval_prompts`)")
        return held_out_metrics(self.held_out, iteration)

    # ------------------------------------------------------------------------------------------
    def train(
        self, eval_fn: Callable[[int, PPOTrainer], dict[str, float]] | None = None, eval_every: int = 1
    ) -> list[dict[str, float]]:
        """Run up to ``cfg.iterations`` (resuming first with ``cfg.resume``, or with ``cfg.auto_resume``
        when there is a checkpoint); returns the metrics logged.

        ``eval_fn(iteration, trainer)``, called every ``eval_every`` iterations and after the last,
        returns extra metrics (e.g. held-out accuracy) logged with that iteration's.
        """
        lock = OutputDirLock(self.output_dir)  # rank 0 writes the folder; the lock goes when it returns or dies
        if dist.is_main():
            self.output_dir.mkdir(parents=True, exist_ok=True)
            lock.acquire()
        try:
            return self._train(eval_fn, eval_every)
        finally:
            lock.release()

    def _train(self, eval_fn, eval_every: int) -> list[dict]:
        cfg = self.cfg
        start = 0
        if self.resuming:
            start = load_checkpoint(self.training.run_state, self.output_dir)
            self.sampler.engine.update_weights(start)
            console.say(f"resumed from the checkpoint of iteration {start}")
            if start >= cfg.iterations:
                if dist.is_main():
                    print(f"{self.output_dir}: the run is at iteration {start}, which already reaches "
                          f"--iterations {cfg.iterations}; nothing to do (pass a larger --iterations to continue)")
                return []
            if effective_algo(cfg.algo).kl_coef == 0:
                # a run that computes no KL term (e.g. one saved with a reward KL its estimator ignored)
                # must not pick one up from the β its checkpoint restored
                self.training.kl_ctl.value = 0.0
            if dist.is_main():
                for name in ("metrics.jsonl", "samples.jsonl", credit.CREDIT_FILE):
                    truncate_jsonl(self.output_dir / name, start)
        elif cfg.auto_resume and dist.is_main():  # no checkpoint yet: lines of a killed first attempt go
            for name in ("metrics.jsonl", "samples.jsonl", credit.CREDIT_FILE):
                truncate_jsonl(self.output_dir / name, -1)
        if dist.is_main():
            dump_yaml(self.recorded_config, self.output_dir / "config.yaml")
        logger = MetricsLogger(self.output_dir, tensorboard=cfg.log.tensorboard, progress=cfg.log.progress,
                               report_to=cfg.log.report_to, run_name=cfg.log.run_name, config=self.recorded_config,
                               total=cfg.iterations, print_every=cfg.log.print_every) if dist.is_main() else None
        history = []
        every = cfg.log.eval_every
        try:
            if logger:
                logger.start(start)
            began = time.perf_counter()
            self.source.start(start, self.training.run_state.restored)  # an asynchronous one: its producer process
            if self.held_out is not None and start == 0:  # the policy before training, as iteration 0
                before = self.evaluate(0)
                if logger:
                    logger.log(0, before)
            for it in range(start + 1, cfg.iterations + 1):
                done = self.train_iteration(it)
                metrics = done.metrics
                metrics["elapsed_s"] = time.perf_counter() - began  # the wall clock, waits and start-up included
                if self.held_out is not None and ((every and it % every == 0) or it == cfg.iterations):
                    metrics.update(self.evaluate(it))
                if eval_fn is not None and (it % eval_every == 0 or it == cfg.iterations):
                    metrics.update(eval_fn(it, self))
                history.append(metrics)
                if logger:
                    logger.log(it, metrics)
                if cfg.log.sample_every and it % cfg.log.sample_every == 0:  # every rank: FSDP forwards are collective
                    credit.log_samples(logger, it, done.batch, done.targets, self.models.policy, self.models.tokenizer, cfg)
                if it == cfg.iterations or (cfg.log.save_every and it % cfg.log.save_every == 0):
                    save_checkpoint(self.training.run_state, self.output_dir, it, cfg.log.keep_last)
        finally:
            self.source.close()  # the environments' workers: started again if the trainer goes on
            if logger:
                logger.close()
        return history
