"""The table of settings a run would ignore (config/unused.py checks it): for each group of fields,
when this run's path ignores them — a predicate of the settings and of what the start-up checks found
(:class:`Facts`) that returns the reason, or None where the fields are used — and the fix."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..algorithms import get_advantage_estimator
from ..algorithms.off_policy import resolve_correction
from ..tasks import reasoning_gym
from . import critics
from .specs import is_model_path, reward_specs
from .train import TrainConfig

BUILTIN = "builtin:equations"
NAMING_TRACKERS = ("wandb", "mlflow", "trackio")
"""The trackers that name a run (`log.run_name`); tensorboard writes to OUTPUT_DIR/tensorboard."""


@dataclass(frozen=True)
class Facts:
    """What decides a run's path besides its settings, as far as it is known; None: not known (yet), and
    the rules that need it wait."""

    files_read: bool = False
    """Every file the settings name has been read and checked (the start-up checks): rules that involve
    such a setting wait for it, so that a missing or broken file is named as such first."""
    torchrun: bool | None = None
    """The run is one of torchrun's processes (torch.distributed initialised)."""
    cuda: bool | None = None
    """`model.device` resolves to a CUDA device."""
    chat_prompts: bool | None = None
    """The prompt column holds chat messages (training or held-out rows); None: rows given from Python."""


Why = Callable[[TrainConfig, Facts], "str | None"]


@dataclass(frozen=True)
class Rule:
    fields: tuple[str, ...]
    """Dotted names, e.g. ``critic.epochs``."""
    why: Why
    """Why this run ignores the fields (a clause after "`field`=value"), or None where it uses them or
    cannot tell yet."""
    fix: str
    after_files: bool = False
    """Waits for :attr:`Facts.files_read`: the rule involves a setting that names a file (model.policy,
    model.reward, model.gold_reward, critic.init, data.prompts, data.eval_prompts,
    data.chat_template, rollout.env), which the start-up checks read first."""
    shared_by: str = ""
    """Non-empty: a warning, not an error, because this workflow writes the setting for runs that ignore it."""


def _spec(c: TrainConfig):
    return get_advantage_estimator(c.algo.estimator)


def _no_critic(c: TrainConfig, f: Facts) -> str | None:
    if _spec(c).needs_critic:
        return None
    return f"is unused: `algo.estimator`={c.algo.estimator!r} has no critic, and this setting is the critic's or GAE's"


def _no_critic_to_train(c: TrainConfig, f: Facts) -> str | None:
    return None if _spec(c).needs_critic else (
        f"has no critic to train: `algo.estimator`={c.algo.estimator!r} is critic-free")


def _no_bootstrap(c: TrainConfig, f: Facts) -> str | None:
    return None if _spec(c).needs_critic else (
        f"has no effect: `algo.estimator`={c.algo.estimator!r} has no critic to bootstrap from")


def _scores_only(c: TrainConfig, f: Facts) -> str | None:
    return None if _spec(c).uses_shaped_rewards else (
        f"is unused: `algo.estimator`={c.algo.estimator!r} builds its advantages from the scores alone, with no "
        "discounting (docs/algorithm.md §3)")


def _not_whitened(c: TrainConfig, f: Facts) -> str | None:
    return None if _spec(c).whitened_by_trainer else (
        f"is unused: the trainer whitens only gae's advantages; `algo.estimator`={c.algo.estimator!r} "
        "normalises its own")


def _shared_critic(c: TrainConfig) -> bool:
    """Values from the policy's own forward (a shared critic), as far as the settings tell."""
    kind = critics.kind_of(c)
    return kind is not None and kind.values_from == "policy"


def _kind_ignores(field: str) -> Why:
    """The rule of a setting only some kinds of critic read (config/critics.py's ``settings``): unused with
    a critic-free estimator, or with a kind that does not read it; unknown while an ``auto`` kind waits for
    the policy's size (config/unused.py's ``check_resolved_critic`` decides then)."""
    def why(c: TrainConfig, f: Facts) -> str | None:
        kind = critics.kind_of(c)
        if kind is critics.NONE:
            return _no_critic(c, f)
        if kind is None or field in kind.settings:
            return None
        named = f"`critic.kind`={c.critic.kind!r}" + (
            f" resolves to {kind.name!r} with `rollout.env`" if c.critic.kind == "auto" else "")
        readers = " or ".join(k.name for k in critics.CriticKind.REGISTRY.values() if field in k.settings)
        return (f"is unused: a {kind.name} critic ({named}) {kind.what}; only a {readers} critic reads it, "
                f"where it {critics.KIND_SETTINGS[field]}")
    return why


def _critic_init_unused(c: TrainConfig, f: Facts) -> str | None:
    if (why := _kind_ignores("critic.init")(c, f)) is not None:
        return why
    if c.critic.init == "reward" and c.rollout.episodic:
        return "needs a reward model, but `rollout.env`'s turn rewards replace `model.reward`: none is loaded"
    if c.critic.init == "reward" and not any(is_model_path(s) for s, _ in reward_specs(c)):
        return "needs a reward model, but `model.reward` names verifiers only"
    return None


def _sampler_logp_unused(c: TrainConfig, f: Facts) -> str | None:
    if _shared_critic(c):
        return ("has no effect: the shared critic's values need the policy's scoring forward, which gives "
                "logp_old as well")
    return None


def _kl_in(c: TrainConfig) -> str:
    """Where the KL goes, ``auto`` resolved as validate.resolve_algo does (which imports this module)."""
    return c.algo.kl_in if c.algo.kl_in != "auto" else ("reward" if _spec(c).uses_shaped_rewards else "loss")


def _kl_not_a_loss(c: TrainConfig, f: Facts) -> str | None:
    if c.algo.kl_coef == 0:
        return "is unused: `algo.kl_coef` is 0, so there is no KL term to clamp"
    if _kl_in(c) == "reward":
        how = "resolves to" if c.algo.kl_in == "auto" else "is"
        return f"is unused: only a KL loss term is clamped, and `algo.kl_in` {how} 'reward' for {c.algo.estimator!r}"
    return None


def _fixed_beta(c: TrainConfig, f: Facts) -> str | None:
    return None if c.algo.adaptive_kl_target is not None else (
        "is unused: `algo.adaptive_kl_target` is not set, so β is fixed")


def _no_kl_in_reward(c: TrainConfig, f: Facts) -> str | None:
    if not _spec(c).needs_critic:
        return _no_critic(c, f)
    if c.algo.kl_coef > 0 and _kl_in(c) == "reward":
        return None
    return ("has no effect: the KL is not in the reward (`algo.kl_coef` 0, or `algo.kl_in` 'loss'), so the "
            "shaped and the score-only critic targets are the same")


def _unclipped(c: TrainConfig, f: Facts) -> str | None:
    return "is unused: `algo.policy_loss`='pg' does not clip the ratio" if c.algo.policy_loss == "pg" else None


def _no_correction(c: TrainConfig, f: Facts) -> str | None:
    if c.algo.off_policy_correction in (None, "none"):
        return "is unused: no `algo.off_policy_correction`"
    return None


def _parts(c: TrainConfig):
    return resolve_correction(c.algo.off_policy_correction or "none", c.algo.off_policy_mask)


def _uncapped(c: TrainConfig, f: Facts) -> str | None:
    p = _parts(c)
    if p.weight.endswith("-truncated") or p.mask == "token-cap":
        return None
    return f"is unused: `algo.off_policy_correction` {c.algo.off_policy_correction!r} truncates or caps nothing"


def _no_band(c: TrainConfig, f: Facts) -> str | None:
    if (_parts(c).mask or "").endswith("-band"):
        return None
    return f"is unused: `algo.off_policy_correction` {c.algo.off_policy_correction!r} has no band mask"


def _correction_of_nothing(c: TrainConfig, f: Facts) -> str | None:
    if c.algo.off_policy_correction not in (None, "none") and c.rollout.logp_from_sampler and not _shared_critic(c):
        return ("has no effect: with `rollout.logp_from_sampler` logp_old is the sampler's log-probabilities, "
                "so π_prox = π_behav and every weight is 1")
    return None


def _env(why: str) -> Why:
    return lambda c, f: why if c.rollout.episodic else None


def _synchronous(c: TrainConfig, f: Facts) -> str | None:
    return "is unused: `rollout.max_staleness` is 0 (no producer process)" if not c.rollout.max_staleness else None


def _no_env(c: TrainConfig, f: Facts) -> str | None:
    return None if c.rollout.env is not None else "is unused: `rollout.env` is not set (single-turn responses)"


def _no_agent(c: TrainConfig, f: Facts) -> str | None:
    return None if c.rollout.agent is not None else "is unused: `rollout.agent` is not set"


def _not_episodic(c: TrainConfig, f: Facts) -> str | None:
    return None if c.rollout.episodic else "is unused: neither `rollout.env` nor `rollout.agent` is set"


def _no_eval(c: TrainConfig, f: Facts) -> str | None:
    return None if c.data.eval_prompts is not None else (
        "is unused: `data.eval_prompts` is not set, so there is no held-out evaluation")


def _greedy_eval(c: TrainConfig, f: Facts) -> str | None:
    return None if c.log.eval_samples > 1 else (
        "is unused: eval_pass_at_k is measured only with `log.eval_samples` > 1 (1 = one greedy response)")


def _not_builtin(setting: str, value: Callable[[TrainConfig], str | None], builtin: str, what: str) -> Why:
    def why(c: TrainConfig, f: Facts) -> str | None:
        v = value(c)
        if v is None or v == builtin:
            return None  # None: no held-out prompts, which _no_eval says
        return f"is unused: `{setting}` is {v!r}, not {what}"

    return why


def _no_task(c: TrainConfig, f: Facts) -> str | None:
    """The settings of a reasoning-gym task's generator, with no such task among the prompts."""
    if any(reasoning_gym.task_of(p) is not None for p in (c.data.prompts, c.data.eval_prompts)):
        return None
    return "is unused: neither `data.prompts` nor `data.eval_prompts` names a reasoning-gym task ('reasoning-gym:TASK')"


def _no_task_reward(c: TrainConfig, f: Facts) -> str | None:
    """How a response's answer is taken, with no reasoning-gym scorer to hand it to."""
    named = [s for s in (c.model.reward, c.model.gold_reward) if s is not None]
    if reasoning_gym.task_of(c.data.prompts) is not None and "auto" in named:
        return None
    if any(reasoning_gym.REWARD in [p.strip() for p in s.split(",")] for s in named):
        return None
    return "is unused: no reward is a reasoning-gym task's scorer ('reasoning-gym')"


def _not_task(setting: str, value: Callable[[TrainConfig], str | None]) -> Why:
    def why(c: TrainConfig, f: Facts) -> str | None:
        v = value(c)
        if v is None or reasoning_gym.task_of(v) is not None:
            return None  # None: no held-out prompts, which _no_eval says
        return f"is unused: `{setting}` is {v!r}, not a reasoning-gym task ('reasoning-gym:TASK')"

    return why


def _splitless(setting: str, value: Callable[[TrainConfig], str | None]) -> Why:
    """The data has no splits to pick from: the built-in task, one file, or a saved Dataset (a saved
    DatasetDict and a directory of files have splits: data/rows.py)."""
    def why(c: TrainConfig, f: Facts) -> str | None:
        v = value(c)
        if v is None:
            return None  # no held-out prompts: _no_eval says so
        p = Path(v).expanduser()
        if v == BUILTIN:
            kind = "the built-in task's prompts"
        elif p.is_file():
            kind = "one file"
        elif (p / "state.json").is_file() and not (p / "dataset_dict.json").is_file():
            kind = "a saved Dataset"
        else:
            return None
        return f"is unused: `{setting}` {v!r} is {kind}, which has no splits"

    return why


def _plain_text(c: TrainConfig, f: Facts) -> str | None:
    if c.rollout.episodic or c.data.chat_template in ("auto", "none") or f.chat_prompts is not False:
        return None  # an environment's answers are rendered with it; 'none' only refuses messages
    return "is unused: the prompts are plain text, and a chat template renders chat messages only"


def _single_process(c: TrainConfig, f: Facts) -> str | None:
    if f.torchrun is False:
        return "is unused: FSDP shards the models over torchrun's processes, and this run is one process"
    return None


def _no_fsdp(c: TrainConfig, f: Facts) -> str | None:
    if not c.model.fsdp:
        return "is unused: `model.fsdp` is off"
    return "is unused: this run is one process, so `model.fsdp` is too" if f.torchrun is False else None


def _lanes_unused(cuda: bool) -> Why:
    def why(c: TrainConfig, f: Facts) -> str | None:
        if cuda:
            return "is unused: lanes share the CPU's threads, and `model.device` is a CUDA device" if f.cuda else None
        return "is unused under torchrun: each process scores and updates its rows in one lane" if f.torchrun else None

    return why


def _no_lora(c: TrainConfig, f: Facts) -> str | None:
    if c.model.lora_r or (_spec(c).needs_critic and critics.settings_kind(c).adapter_rank(c)):
        return None
    return "is unused: `model.lora_r` is 0 and no critic has adapters (every weight trains)"


def _no_samples(c: TrainConfig, f: Facts) -> str | None:
    return "is unused: `log.sample_every` is 0, so no samples are written" if not c.log.sample_every else None


def _unnamed_run(c: TrainConfig, f: Facts) -> str | None:
    if any(t in NAMING_TRACKERS for t in c.log.report_to):
        return None
    return f"is unused: only {', '.join(NAMING_TRACKERS)} name runs, and `log.report_to` has none of them"


def _no_progress(c: TrainConfig, f: Facts) -> str | None:
    return None if c.log.progress else "is unused: `log.progress` is false, so no progress lines are printed"


GAE_ONLY = "leave it out (in `ppo-lm compare`, set it in the gae section of `per_estimator`)"
LEAVE = "leave it out"
COMPARE_BASE = ("`ppo-lm compare` gives every estimator the demo preset's `critic.lr` "
                "(src/ppo_lm/presets/demo_ppo.yaml), and `ppo-lm demo --ppo.algo.estimator grpo` does too")
RECIPE_ENV = ("examples/real_model/run.py passes its reward `--model.reward rewards.py:correct` with any --config, "
              "examples/multi_turn/ppo.yaml's environment included")

RULES: tuple[Rule, ...] = (
    # The critic and GAE: estimators without a critic (docs/algorithm.md §3).
    Rule(("critic.epochs", "critic.warmup_iterations"), _no_critic_to_train, GAE_ONLY),
    Rule(("algo.bootstrap_truncated",), _no_bootstrap, GAE_ONLY),
    Rule(("critic.kind", "algo.gae_lambda", "critic.gae_lambda",
          "algo.adaptive_lambda_alpha", "critic.value_clip_eps", "critic.vf_coef"), _no_critic, GAE_ONLY),
    Rule(("critic.target",), _no_kl_in_reward, GAE_ONLY),
    Rule(("critic.lr",), _no_critic, "leave it out, or pass `--critic.lr auto` over a preset that sets it "
         "(the demo's does; `ppo-lm compare` gives it to every estimator)", shared_by=COMPARE_BASE),
    Rule(("algo.whiten_advantages",), _not_whitened, GAE_ONLY),
    Rule(("algo.gamma",), _scores_only,
         "leave it out (in `ppo-lm compare`, set it in the gae and reinforce++ sections of `per_estimator`)"),
    # a path is checked as a model directory first
    Rule(("critic.init",), _critic_init_unused, "leave it out ('auto'), or give a critic that uses it",
         after_files=True),
    Rule(("critic.value_grad_scale",), _kind_ignores("critic.value_grad_scale"),
         "leave it out, or set `critic.kind` to 'shared'"),
    Rule(("rollout.logp_from_sampler",), _sampler_logp_unused, "leave it out, or set `critic.kind` to 'separate'"),
    # The KL and the policy loss.
    # `algo.kl_in` with `algo.kl_coef` 0 is accepted: it is the fix validate.py's refusal of a reward KL with a
    # score-only estimator names (old GRPO runs resume that way), and placing no KL anywhere is harmless.
    Rule(("algo.kl_clamp",), _kl_not_a_loss, "leave it out, or set `algo.kl_in` to 'loss' (and `algo.kl_coef` > 0)"),
    Rule(("algo.adaptive_kl_horizon",), _fixed_beta, "leave it out, or set `algo.adaptive_kl_target`"),
    Rule(("algo.clip_eps", "algo.clip_eps_high", "algo.dual_clip"), _unclipped,
         "leave it out, or set `algo.policy_loss` to 'ppo'"),
    # Off-policy corrections (docs/algorithm.md §1.6) and the asynchronous producer (docs/async.md).
    Rule(("rollout.producer_threads", "rollout.stall_timeout_s", "rollout.weight_box_dir"), _synchronous,
         "leave it out, or set `rollout.max_staleness` ≥ 1"),
    Rule(("algo.is_cap", "algo.is_band_low", "algo.is_band_high", "algo.off_policy_mask", "algo.is_veto"),
         _no_correction, "leave it out, or set `algo.off_policy_correction`"),
    Rule(("algo.is_cap",), _uncapped,
         "leave it out, or set `algo.off_policy_correction` to 'tis', 'sequence-tis' or 'decoupled'"),
    Rule(("algo.is_band_low", "algo.is_band_high"), _no_band,
         "leave it out, or set `algo.off_policy_correction` to 'token-mask' or 'sequence-mask' (or "
         "`algo.off_policy_mask` to a band)"),
    Rule(("algo.off_policy_correction",), _correction_of_nothing,
         "leave it out, or leave out `rollout.logp_from_sampler`"),
    # An environment's rewards replace the reward; without one, its settings do nothing.
    Rule(("model.reward",), _env("is unused: `rollout.env`'s turn rewards replace it"),
         "leave it out with an environment", after_files=True, shared_by=RECIPE_ENV),
    Rule(("model.reward_weights",), _env("is unused: `rollout.env`'s turn rewards replace `model.reward`"),
         "leave it out with an environment", after_files=True),
    Rule(("model.gold_reward",), _env("is unused: with `rollout.env` no verifier scores the episodes (training "
                                      "and held-out episodes are scored by the environment's rewards)"),
         "leave it out with an environment", after_files=True),
    Rule(("data.prompt_column",), _env("is unused: an environment's reset (or an agent) receives each row whole"),
         "leave it out; the environment reads the columns it needs", after_files=True),
    Rule(("rollout.missing_eos_penalty",), _env("has no effect with `rollout.env`: an episode's rewards are its "
                                                "environment's alone (only single-turn responses are penalised)"),
         "leave it out (0) with an environment"),
    Rule(("rollout.max_turns", "rollout.env_timeout_s", "rollout.env_workers", "rollout.env_action",
          "rollout.env_observation", "rollout.env_sessions"), _no_env, "set `rollout.env`, or leave it out",
         after_files=True),
    Rule(("rollout.max_episode_tokens",), _not_episodic, "set `rollout.env` or `rollout.agent`, or leave it out",
         after_files=True),
    Rule(("rollout.agent_timeout_s",), _no_agent, "set `rollout.agent`, or leave it out"),
    # Held-out evaluation.
    Rule(("log.eval_every", "log.eval_samples", "log.eval_pass_score", "data.eval_split", "data.builtin_eval_prompts",
          "data.eval_max_prompts", "data.task_eval_size"), _no_eval, "set `data.eval_prompts`, or leave it out", after_files=True),
    Rule(("log.eval_pass_score",), _greedy_eval, "leave it out, or set `log.eval_samples` > 1"),
    Rule(("data.builtin_eval_prompts",), _not_builtin("data.eval_prompts", lambda c: c.data.eval_prompts, BUILTIN,
                                                     "the built-in task's prompts"), LEAVE,
         after_files=True),
    Rule(("data.eval_split",), _splitless("data.eval_prompts", lambda c: c.data.eval_prompts), LEAVE,
         after_files=True),
    # The prompts and the policy.
    Rule(("data.task_config",), _no_task, "set `data.prompts` to 'reasoning-gym:TASK', or leave it out"),
    Rule(("data.task_size",), _not_task("data.prompts", lambda c: c.data.prompts), LEAVE),
    Rule(("data.task_eval_size",), _not_task("data.eval_prompts", lambda c: c.data.eval_prompts), LEAVE),
    Rule(("data.task_answer",), _no_task_reward, "leave it out, or score with 'reasoning-gym'", after_files=True),
    Rule(("data.builtin_num_prompts",), _not_builtin("data.prompts", lambda c: c.data.prompts, BUILTIN,
                                                    "the built-in task's prompts"), LEAVE,
         after_files=True, shared_by="tests/trainer_helpers.py's tiny_config sizes the built-in task for every test"),
    Rule(("data.split",), _splitless("data.prompts", lambda c: c.data.prompts), LEAVE, after_files=True),
    Rule(("data.chat_template",), _plain_text, "leave it out, or give the prompts as chat messages",
         after_files=True),
    Rule(("model.builtin_hidden_size", "model.builtin_layers", "model.builtin_heads"),
         _not_builtin("model.policy", lambda c: c.model.policy, "builtin", "the built-in model"), LEAVE, after_files=True,
         shared_by="tests/trainer_helpers.py's tiny_config sizes the built-in model for every test, whatever its policy"),
    # (`model.lora_head` without `model.lora_r`: validate.py's _check_lora refuses it)
    Rule(("model.lora_alpha", "model.lora_dropout", "model.lora_target_modules"), _no_lora,
         "set `model.lora_r` (or `critic.lora_r`) > 0 for adapters, or leave it out"),
    Rule(("critic.lora_r",), _kind_ignores("critic.lora_r"), "leave it out, or set `critic.kind` to 'separate'"),
    # Processes and devices.
    Rule(("model.fsdp",), _single_process, "launch with torchrun --nproc-per-node N, or leave it out"),
    Rule(("model.fsdp_bf16",), _no_fsdp, "leave it out, or shard with `model.fsdp` under torchrun"),
    Rule(("model.cpu_lanes",), _lanes_unused(cuda=False), "leave it out under torchrun"),
    Rule(("model.cpu_lanes",), _lanes_unused(cuda=True), "leave it out on a GPU",
         shared_by="a speed setting that changes no result, in configs written for CPU that also run on GPUs"),
    # Logging.
    Rule(("log.num_samples",), _no_samples, "leave it out, or set `log.sample_every` > 0"),
    Rule(("log.run_name",), _unnamed_run, "leave it out, or add wandb, mlflow or trackio to `log.report_to`"),
    Rule(("log.print_every",), _no_progress, "leave it out, or set `log.progress` true"),
)
