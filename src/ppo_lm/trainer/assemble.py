"""How a :class:`~ppo_lm.trainer.ppo.PPOTrainer` is built: named steps, each returning a typed part
(docs/architecture.md, "The trainer's parts").

The settings resolve along the way — the estimator's ``auto`` values first, then the ones that go by
the policy's size once it loads, then the micro-batch size once every model's memory is known — and
the run holds only the last: :attr:`Parts.cfg`.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..algorithms import AdaptiveKLController, FixedKLController
from ..config import critics, sizing
from ..config.critics import CriticKind
from ..config.train import TrainConfig
from ..config.unused import check_resolved_critic
from ..config.validate import resolve_algo
from ..models import kernels, sharding
from ..models.actor_critic import CriticModel, PolicyModel, RewardScorer
from ..models.hf_compat import enable_checkpointing
from ..rollout.sample.engine import TorchEngine
from ..rollout.sample.producer import Producer
from ..rollout.sample.sampling import SamplingParams
from ..rollout.score.reward import RewardTerm, Verifier
from ..rollout.score.scoring import RolloutModels, ScoringSettings
from ..rollout.sources.async_source import AsyncSource
from ..rollout.sources.source import SyncSource
from ..runtime import distributed as dist
from . import adapters, inputs, roles, seeds
from .checkpoint.state import RngStreams, RunState, TrainState
from .held_out import HeldOut
from .learner import Learner, build_learner
from .plan import Plan
from .preflight import Preflight


@dataclass
class Models:
    """The roles (docs/algorithm.md §2) as built: the tokenizer, the policy's language model as loaded
    (``lm``) and its module, the reference, the critic's kind (config/critics.py) and its model where it
    has a body of its own (None: critic-free, or a value head on the policy), the reward terms (none with
    an environment) and the monitoring-only gold verifier."""

    tokenizer: object
    lm: nn.Module
    policy: PolicyModel
    ref: PolicyModel
    critic: CriticModel | None
    critic_kind: CriticKind
    rewards: tuple[RewardTerm, ...]
    gold_verifier: Verifier | None

    def for_scoring(self) -> RolloutModels:
        return RolloutModels(self.policy, self.ref, self.critic, self.critic_kind.values_from == "policy",
                             self.rewards, self.gold_verifier)


@dataclass
class Sampler:
    """What samples: the prompts (``prompts.rows`` train, ``prompts.eval_rows`` held out), the sampling
    settings, the engine and the producer of trajectories through it."""

    prompts: inputs.PromptSet
    sampling: SamplingParams
    engine: TorchEngine
    producer: Producer


@dataclass
class Training:
    """Everything a checkpoint restores (``run_state``) and its pieces."""

    learner: Learner
    kl_ctl: AdaptiveKLController | FixedKLController
    sample_gen: torch.Generator
    shuffle_gen: torch.Generator
    state: TrainState
    run_state: RunState


@dataclass
class Parts:
    cfg: TrainConfig  # the settings the run runs with, every auto resolved
    sized: sizing.Resolved  # what the auto values became, and why (the banner shows it)
    device: torch.device
    models: Models
    sampler: Sampler
    training: Training
    plan: Plan
    source: SyncSource | AsyncSource
    scoring: ScoringSettings
    held_out: HeldOut | None


def assemble(cfg: TrainConfig, pre: Preflight, *, policy=None, tokenizer=None, verifier=None,
             prompt_rows=None) -> Parts:
    """The run's parts, step by step (``policy``, ``tokenizer``, ``verifier``, ``prompt_rows``: objects
    given in place of what ``cfg`` names)."""
    cfg = dataclasses.replace(cfg, algo=resolve_algo(cfg.algo))
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = roles.resolve_device(cfg.model.device)
    models, sized = build_models(cfg, pre, device, policy=policy, tokenizer=tokenizer, verifier=verifier)
    cfg = sized.cfg
    sampler = build_sampler(cfg, pre, models, device, prompt_rows=prompt_rows)
    sized = size_micro_batches(sized, models, sampler)
    cfg = sized.cfg
    training = build_training(cfg, models, device)
    models = shard_frozen(cfg, models)
    plan = Plan(sampler.prompts.rows, cfg.rollout.num_prompts, seed=cfg.seed, rank=dist.rank(),
                world=dist.world_size(), shuffle=cfg.data.shuffle, env=cfg.rollout.episodic)
    source = build_source(cfg, models, sampler, training, plan, device)
    training.run_state.pending = source.pending
    return Parts(cfg, sized, device, models, sampler, training, plan, source, scoring_settings(cfg, sampler),
                 held_out(cfg, models, sampler, device))


def build_models(cfg: TrainConfig, pre: Preflight, device: torch.device, *, policy, tokenizer, verifier
                 ) -> tuple[Models, sizing.Resolved]:
    """The tokenizer and the roles; LoRA adapters and gradient checkpointing. Seeded, so every rank
    builds identical initial weights. Returns them with the settings resolved by the policy's size."""
    kernels.set_compiled(cfg.model.compile_kernels, device, roles.DTYPES[cfg.model.dtype])
    torch.manual_seed(cfg.seed)
    tokenizer = tokenizer if tokenizer is not None else roles.build_tokenizer(cfg.model)
    lm = policy if policy is not None else roles.build_policy(cfg, tokenizer)
    # the "auto" learning rates and response limit, by the policy's size (config/sizing.py)
    sized = sizing.resolve_auto(cfg, sum(p.numel() for p in lm.parameters()),
                                getattr(lm.config, "max_position_embeddings", None))
    check_resolved_critic(sized.cfg, cfg.critic.kind == "auto")
    cfg = sized.cfg
    kind = critics.kind_of(cfg)
    policy_module = roles.build_policy_module(cfg, lm, with_value_head=kind.values_from == "policy").to(device)
    terms = ([] if cfg.rollout.episodic  # the environment's turn rewards replace model.reward
             else roles.given_reward_terms(verifier, cfg.model) if verifier is not None
             else roles.reward_terms(cfg, pre.verifiers, cfg.model.dtype))
    for term in terms:
        if term.model is not None:
            term.model.to(device)
    # the first reward model, if any: a separate critic may start from it (critic.init)
    reward_model = next((term.model for term in terms if term.model is not None), None)
    critic = None
    if kind.own_body:
        critic = roles.build_critic(cfg, lm, reward_model).to(device)
    if cfg.model.lora_r:  # only adapters train (docs/lora.md)
        adapters.add_policy_adapters(cfg, policy_module)
    ref = adapters.build_reference(policy_module).to(device)
    if kind.body_frozen(cfg):  # adapters or the value head alone train
        adapters.freeze_critic_body(cfg, critic, ref, reward_model)
    if cfg.model.gradient_checkpointing:
        enable_checkpointing(lm)
        if critic is not None:
            enable_checkpointing(critic.model)
    return Models(tokenizer, lm, policy_module, ref, critic, kind, tuple(terms), pre.gold_verifier), sized


def build_sampler(cfg: TrainConfig, pre: Preflight, models: Models, device: torch.device, *,
                  prompt_rows) -> Sampler:
    """The training and held-out prompts (rendered, checked against the context), the sampling settings
    with every stop token, and what samples (docs/architecture.md): the engine — the policy's own
    weights, in process — and the producer through it, of single-turn responses or with ``rollout.env``
    the environment's episodes (its worker processes start on first use)."""
    tok, env = models.tokenizer, cfg.rollout.episodic
    rows = list(prompt_rows) if prompt_rows is not None else pre.prompt_rows
    prompts = inputs.build_prompts(cfg, tok, models.lm, rows, pre.eval_rows, given=prompt_rows is not None,
                                     env=env)
    r = cfg.rollout
    sampling = SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_k=r.top_k,
                              top_p=r.top_p, stop_token_ids=prompts.stop_ids, min_new_tokens=r.min_new_tokens)
    engine = TorchEngine(models.policy.lm, pad_token_id=tok.pad_token_id, root=models.policy)
    episodes = inputs.episode_setup(cfg, tok, models.lm) if r.env is not None else None
    agents = (inputs.agent_setup(cfg, inputs.renderer_of(cfg, tok), sampling, models.lm)
              if r.agent is not None else None)
    producer = Producer(engine, tok, device=device, prompt_column=cfg.data.prompt_column,
                        add_special_tokens=not prompts.chat, agents=agents,
                        **(episodes._asdict() if episodes is not None else {}))
    return Sampler(prompts, sampling, engine, producer)


def size_micro_batches(sized: sizing.Resolved, models: Models, sampler: Sampler) -> sizing.Resolved:
    """An ``auto`` ``optim.micro_batch_size`` from the activations of the longest rows the update can see
    (the longest prompt, or an episode's limit, plus the response limit) against the memory of the
    models and their training state (config/sizing.py)."""
    cfg = sized.cfg
    r, o = cfg.rollout, cfg.optim
    env = sampler.producer.episodes if sampler.producer.environment else None
    return sizing.size_micro_batches(
        sized, minibatch_rows=r.num_prompts // dist.world_size() * r.samples_per_prompt // o.num_minibatches,
        tokens_per_row=(env.max_episode_tokens if env is not None
                        else sampler.prompts.longest_prompt + r.max_new_tokens),
        bodies=[models.lm] + ([models.critic.model] if models.critic is not None else []),
        models=[models.policy, models.critic, models.ref, *(term.model for term in models.rewards)],
        dtype_bytes=roles.DTYPES[cfg.model.dtype].itemsize)


def build_training(cfg: TrainConfig, models: Models, device: torch.device) -> Training:
    """Optimisers, schedules, KL controller, RNG streams: everything a checkpoint restores."""
    a, rank = cfg.algo, dist.rank()
    kl_ctl = (AdaptiveKLController(a.kl_coef, a.adaptive_kl_target, a.adaptive_kl_horizon)
              if a.adaptive_kl_target is not None else FixedKLController(a.kl_coef))
    learner = build_learner(cfg, models.policy, models.critic, device)
    sample_gen = torch.Generator(device=device).manual_seed(seeds.sampling_seed(cfg.seed, rank))
    shuffle_gen = torch.Generator().manual_seed(seeds.shuffle_seed(cfg.seed, rank))
    state = TrainState()
    run_state = RunState(learner, models.tokenizer, kl_ctl, RngStreams(sample_gen, shuffle_gen), state)
    return Training(learner, kl_ctl, sample_gen, shuffle_gen, state, run_state)


def shard_frozen(cfg: TrainConfig, models: Models) -> Models:
    """The reward models wrapped for scoring and, under FSDP, the frozen models sharded too: each rank
    holds 1/world of them (a LoRA reference is the policy, sharded with it by the learner)."""
    rewards = tuple(dataclasses.replace(term, model=RewardScorer(term.model)) if term.model is not None else term
                    for term in models.rewards)
    if cfg.model.fsdp and dist.is_initialized():
        if not models.ref.base_only:
            sharding.shard(models.ref, models.ref.lm, bf16=cfg.model.fsdp_bf16)
        for term in rewards:
            if term.model is not None:
                sharding.shard(term.model, term.model.model, bf16=cfg.model.fsdp_bf16)
    return dataclasses.replace(models, rewards=rewards)


def build_source(cfg: TrainConfig, models: Models, sampler: Sampler, training: Training, plan: Plan,
                 device: torch.device) -> SyncSource | AsyncSource:
    """Where each iteration's trajectories come from: sampled when the learner asks (``rollout.max_staleness``
    0), or ahead of it by a producer process with its own copy of the policy and, with an environment,
    its own pool of workers (docs/async.md)."""
    r = cfg.rollout
    if not r.max_staleness:
        return SyncSource(sampler.producer, plan, samples=r.samples_per_prompt, sampling=sampler.sampling,
                          generator=training.sample_gen)
    tok = models.tokenizer
    # the producer's engine decodes with a copy of the learner's model, made where it is unpickled
    engine = TorchEngine(models.policy.lm, pad_token_id=tok.pad_token_id)
    episodes = inputs.episode_setup(cfg, tok, models.lm) if r.env is not None else None
    producer = Producer(engine, tok, device=device, prompt_column=cfg.data.prompt_column,
                        add_special_tokens=not sampler.prompts.chat,
                        **(episodes._asdict() if episodes is not None else {}))
    return AsyncSource(producer, plan, samples=r.samples_per_prompt, sampling=sampler.sampling,
                       max_staleness=r.max_staleness, learner_lm=models.policy.lm, learner_engine=sampler.engine,
                       last=cfg.iterations,
                       seed_for=functools.partial(seeds.producer_sampling_seed, cfg.seed, dist.rank()),
                       device=device, threads=producer_threads(cfg), stall_timeout_s=r.stall_timeout_s,
                       checkpoints=str(Path(cfg.output_dir).resolve()), box_dir=r.weight_box_dir)


def producer_threads(cfg: TrainConfig) -> int:
    """``rollout.producer_threads``; auto: half the learner's torch threads, at least 1."""
    if cfg.rollout.producer_threads != "auto":
        return int(cfg.rollout.producer_threads)
    return max(1, (cfg.threads or torch.get_num_threads()) // 2)


def scoring_settings(cfg: TrainConfig, sampler: Sampler) -> ScoringSettings:
    r = cfg.rollout
    return ScoringSettings(temperature=sampler.sampling.temperature or 1.0, forward_batch_size=r.forward_batch_size,
                           missing_eos_penalty=r.missing_eos_penalty, logp_from_sampler=r.logp_from_sampler,
                           prompt_column=cfg.data.prompt_column)


def held_out(cfg: TrainConfig, models: Models, sampler: Sampler, device: torch.device) -> HeldOut | None:
    """What held-out evaluation runs on (None without ``data.eval_prompts``)."""
    if sampler.prompts.eval_rows is None:
        return None
    return HeldOut(producer=sampler.producer, rows=sampler.prompts.eval_rows, sampling=sampler.sampling,
                   samples=cfg.log.eval_samples, pass_score=cfg.log.eval_pass_score, seed=cfg.seed, device=device,
                   rank=dist.rank(), world=dist.world_size(), rewards=models.rewards,
                   gold_verifier=models.gold_verifier)
