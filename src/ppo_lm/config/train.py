"""Typed configuration: the single source of defaults. YAML files and CLI flags only override these.

Each field carries its rules (:func:`~ppo_lm.runtime.settings.setting`): the range its value must lie
in, checked by :func:`~ppo_lm.config.validate.validate_config`, and ``resume=True`` where a resumed run
may set it differently from the run it continues (its length, logging, devices, and the speed
settings that do not change results; everything else defines the experiment). Rules that tie
several fields together stay in config/validate.py.

CLI flags follow the dataclass nesting: ``--algo.gae-lambda 0.9``, ``--rollout.max-new-tokens 16``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from ..algorithms.off_policy import CorrectionName, MaskName
from ..algorithms.registry import EstimatorName
from ..runtime.settings import setting
from ..tasks.equations import BUILTIN_HEADS
from .critics import CriticConfig


@dataclass
class ModelConfig:
    policy: str = "builtin"
    """Path to an AutoModelForCausalLM checkpoint (save_pretrained dir), or 'builtin' for the tiny
    Qwen2-architecture model of the built-in equation task."""
    tokenizer: str | None = None
    """Tokenizer path; defaults to the policy path (or the built-in character tokenizer)."""
    pad_token: str | None = None
    """Set the tokenizer's pad token to this existing token when it has none (or pad == eos)."""
    reward: str = "auto"
    """The reward: 'auto' (the task's own verifier: 'builtin:equations' with the built-in prompts,
    'reasoning-gym' with a reasoning-gym task's; prompts of your own name theirs), 'builtin:equations'
    (the equation verifier), 'reasoning-gym' (a reasoning-gym task's score_answer, docs/environments.md),
    'module:function' or
    'path/to/file.py:function' (a Python verifier `f(prompts, responses, **columns) -> scores`), or a
    path to a one-label AutoModelForSequenceClassification (e.g. the output of `ppo-lm rm`). Several,
    separated by commas: the score is their weighted sum, and each is logged as score/<name>."""
    reward_weights: list[float] = setting(default_factory=list, finite=True)
    """One weight per reward of `model.reward`, in order; empty = 1 for each."""
    gold_reward: str | None = None
    """Optional verifier ('module:function' or 'builtin:equations') scored next to the training reward
    and logged as `gold_score`: with a learned reward model it shows over-optimisation."""
    builtin_hidden_size: int = setting(64, ge=1)
    """Built-in model only (policy 'builtin'): hidden size; its MLP is 4× as wide. Must be a
    multiple of 2 × builtin_heads (RoPE halves each head)."""
    builtin_layers: int = setting(2, ge=1)
    """Built-in model only: number of transformer layers."""
    builtin_heads: int = setting(BUILTIN_HEADS, ge=1)
    """Built-in model only: attention heads (as many key/value heads)."""
    fsdp: bool = False
    """Under torchrun: shard policy and critic (parameters, gradients, optimiser state) and the frozen
    reference and reward model with FSDP2 `fully_shard` instead of replicating them (DDP). Ignored in
    a single process."""
    fsdp_bf16: bool = False
    """With fsdp: bf16 compute/all-gather (fp32 master weights and gradient reduction)."""
    gradient_checkpointing: bool = setting(False, resume=True)
    """Recompute each transformer layer's activations in the backward instead of keeping them, for the
    policy and the separate critic: the update's activation memory drops to about one layer's, for
    about one more forward of compute. The numbers trained on are the same. Updates then run on one
    CPU lane."""
    lora_r: int = setting(0, ge=0)
    """LoRA rank (0 = off: every weight trains). With r > 0, low-rank adapters (peft) are added to
    `lora_target_modules` of the policy and of a separate critic (whose value head trains in full; a
    shared critic's value head too) and only they train; the frozen reference is the policy with its
    adapters switched off, so no second copy of the weights is held. Checkpoints hold the adapters
    (peft's adapter_model.safetensors), `ppo-lm export` merges them (docs/lora.md)."""
    lora_alpha: float = setting(32.0, gt=0, finite=True)
    """LoRA scaling numerator: each adapter adds (lora_alpha / lora_r)·B·A·x to its layer's output."""
    lora_dropout: float = setting(0.0, ge=0, lt=1)
    """Dropout on the adapters' input while training. 0 keeps rollout and update numerics identical (the
    first epoch's ratio is exactly 1); > 0 makes the update's forward differ from the rollout's."""
    lora_target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Layers that get adapters: 'all-linear' (every linear layer of the transformer body; not the
    output head, see `lora_head`) or module names such as q_proj, v_proj (a name matches a module whose
    path ends in it; each name must match one)."""
    lora_head: bool = False
    """Also put adapters on the policy's output head (LM head), which otherwise stays frozen. Small
    models may need it to sharpen their output distribution (docs/lora.md); a head that shares its weight
    with the input embeddings (tie_word_embeddings) is refused, as merging would change both. A critic's
    value head trains in full either way."""
    compile_kernels: bool = setting(False, resume=True)
    """Fuse RMSNorm, RoPE and SwiGLU of Qwen2/Llama training forwards/backwards with torch.compile
    (each becomes one loop instead of several passes over its tensor). Costs a compile at start-up
    (shorter once inductor's disk cache is warm) and needs a C++ compiler (CPU) or Triton (GPU); the
    gain is largest with cpu_lanes = 1 (see docs/benchmarks.md). Falls back to eager kernels with a
    warning when no compiler is usable."""
    cpu_lanes: int = setting(0, ge=0, resume=True)
    """On CPU in a single process: share the rows of each update micro-batch and each scoring forward
    among this many threads that run at once, each with its share of torch's threads; their
    gradients are summed. Fills the gaps where one op's threads would wait between ops (Python, the
    autograd engine, ops too small to split); each extra lane adds a malloc arena and a copy of the
    trained models' gradients to peak memory (see docs/benchmarks.md). 0 = auto: two lanes, one when
    the trained gradients exceed 256 MiB (more than 64 M trained fp32 parameters, policy and critic
    together; LoRA trains only its adapters). N >= 1: N lanes (at most torch's thread count). Checkpointed models use one lane,
    as do forwards too small to share. Ignored on GPUs and under torchrun."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weight dtype of the policy (and its frozen reference), a reward-model checkpoint and the separate
    critic, as the trainer builds or loads them."""
    device: str = setting("auto", resume=True)
    """'auto' (cuda:LOCAL_RANK if available, else cpu), 'cpu', 'cuda', …"""



@dataclass
class DataConfig:
    prompts: str = "builtin:equations"
    """'builtin:equations', 'reasoning-gym:TASK' (a reasoning-gym task's problems, generated from `seed`:
    docs/environments.md, "reasoning-gym tasks"), or a local file or directory `datasets` reads
    (JSON/JSONL, CSV, Parquet, Arrow, a save_to_disk directory, a directory of per-split files) with a
    prompt column."""
    split: str = "train"
    """The split to read where the data has several (a `datasets` DatasetDict saved with save_to_disk, or
    a directory of files per split such as train.jsonl / test.jsonl)."""
    prompt_column: str = "prompt"
    """Column of `data.prompts` that holds the prompt text; the other columns reach a verifier as keyword
    arguments. Must be 'prompt' with the built-in prompts."""
    chat_template: str = "auto"
    """How a prompt column of chat messages (lists of {"role", "content"}) becomes text: 'auto' = the
    tokenizer's chat template, with the assistant turn opened (add_generation_prompt); a path = a
    Jinja template file used instead; 'none' = refuse messages. Plain-text prompts are used as they are."""
    builtin_num_prompts: int = setting(2000, ge=1)
    """Size of the built-in training prompt set."""
    eval_prompts: str | None = setting(None, resume=True)
    """Held-out prompts evaluated during training (see `log.eval_every`): 'builtin:equations' (the
    built-in task's held-out split), 'reasoning-gym:TASK' (its problems from another seed than the
    training ones, none of them among those) or a file like `data.prompts`, with the same columns; None =
    no evaluation."""
    eval_split: str = setting("test", resume=True)
    """The split of `data.eval_prompts` to read where it has several (as `data.split`)."""
    builtin_eval_prompts: int = setting(200, ge=1, resume=True)
    """Size of the built-in held-out prompt set (distinct prompts)."""
    task_config: dict[str, int | float | bool | str] = field(default_factory=dict)
    """A reasoning-gym task's settings (`data.prompts`/`data.eval_prompts` 'reasoning-gym:TASK'): fields of
    its config class, e.g. {min_terms: 2, max_terms: 2} (flags: `--data.task-config min_terms 2 max_terms
    2`); empty = the task's defaults."""
    task_size: int = setting(2000, ge=1)
    """Problems of a reasoning-gym task generated for training (the generator's seeded order from `seed`;
    repeats and held-out questions dropped)."""
    task_eval_size: int = setting(200, ge=1, resume=True)
    """Problems of a reasoning-gym task generated for `data.eval_prompts` (from a seed of their own)."""
    task_answer: str = "auto"
    """How the reward 'reasoning-gym' takes a response's answer for the task's scorer: 'auto' (the last
    <answer>…</answer>, the format reasoning-gym's own prompts ask for; else the last number; else the
    whole text), 'tag:NAME' (the last <NAME>…</NAME>), 'last-number', 'text' (the whole response)."""
    eval_max_prompts: int = setting(0, ge=0, resume=True)
    """Evaluate only the first this many prompts of `data.eval_prompts` (its file order); 0 = all. An
    evaluation generates one response per prompt, so a large held-out file costs time at each one."""
    shuffle: bool = True
    """Visit the prompts in a fresh permutation on each pass over the data (seeded by `seed` and the pass,
    so a resumed run sees the same prompts); False = dataset order."""


@dataclass
class RolloutConfig:
    num_prompts: int = setting(32, ge=1)
    """Prompts per iteration over all ranks; each is sampled `samples_per_prompt` times."""
    samples_per_prompt: int = setting(1, ge=1)
    """Responses sampled per prompt: the group of grpo, dr_grpo and rloo (which need >= 2). An iteration
    has num_prompts × samples_per_prompt episodes."""
    max_new_tokens: int | Literal["auto"] = setting("auto", ge=1)
    """Response length limit in tokens; a response cut there without a stop token is truncated: it
    bootstraps from V, or with `algo.bootstrap_truncated` false its score ends its return
    (docs/algorithm.md §1.3). Also the constant divisor of seq-mean-token-sum-norm.
    auto: by the policy's size (config/sizing.py) — 8 below 10 M parameters (the built-in task's),
    128 above (at most half the policy's context), logged in the banner."""
    min_new_tokens: int = setting(0, ge=0)
    """Stop tokens cannot be sampled before this many response tokens (= max_new_tokens gives
    fixed-length responses, e.g. for a benchmark with a fixed amount of work)."""
    temperature: float = setting(1.0, gt=0, finite=True)
    """Sampling temperature (> 0); logp_old, logp_ref and the trained log-probs are all taken under
    softmax(logits / temperature)."""
    top_k: int = setting(0, ge=0)
    """Sample only among the k most likely tokens; 0 = off. Filters sampling only: the trained
    log-probs are those of the unfiltered distribution."""
    top_p: float = setting(1.0, gt=0, le=1)
    """Nucleus sampling: only the smallest set of most likely tokens whose probability reaches top_p, in
    (0, 1]; 1 = off. Filters sampling only, like top_k."""
    stop_tokens: list[str] = field(default_factory=list)
    """Extra stop strings (single tokens) besides the tokenizer's EOS."""
    missing_eos_penalty: float = 0.0
    """Subtracted from the score of responses cut by the length limit (no stop token)."""
    forward_batch_size: int = setting(0, ge=0, resume=True)
    """Batch size of the scoring forwards (policy/ref/critic/reward); 0 = the whole rollout."""
    logp_from_sampler: bool = False
    """Take logp_old from the sampler's logits instead of a scoring forward of the policy (saves
    one policy forward per iteration). The two agree within 1e-5 but not exactly, so the first
    update's ratio is 1 only to ≈ 1e-6. An environment's episodes too: the sampler's log-probabilities
    of their action tokens. Ignored with a shared critic (its values need the forward)."""
    max_staleness: int = setting(0, ge=0)
    """Asynchronous PPO (docs/async.md): k ≥ 1 samples iteration j in a producer process with the weights
    of iteration j − 1 − k while the learner trains, at most k batches ahead (the producer waits; no
    batch is dropped). Needs `algo.off_policy_correction`. 0 = sample each iteration with the current
    weights (synchronous)."""
    producer_threads: int | Literal["auto"] = setting("auto", ge=1)
    """With `max_staleness` ≥ 1: torch's CPU threads in the producer's process (the learner keeps
    `threads`). auto: half the learner's, at least 1 (docs/async.md, "The thread split")."""
    stall_timeout_s: float = setting(1800.0, gt=0, finite=True)
    """With `max_staleness` ≥ 1: how long the learner or the producer waits on the other with no word from it
    before the run ends with one line naming what it waited for (docs/async.md, "Resume and failure"). Raise it
    for an environment whose single batch takes longer."""
    weight_box_dir: str | None = None
    """With `max_staleness` ≥ 1: a folder on disk for the box the learner hands its weights to the producer
    through (a file removed as soon as it is opened); None = anonymous shared memory (docs/async.md)."""
    env: str | None = None
    """A multi-turn environment, 'path/to/env.py:Class' or 'module:Class' (docs/environments.md): each
    episode is an instance, reset with a prompt row and a seed, stepped with each turn's text; its turn
    rewards replace `model.reward`. An OpenEnv environment (a subclass of openenv's Environment) runs the
    same way (docs/environments.md, "OpenEnv environments"). None = single-turn, scored by `model.reward`."""
    env_action: str | None = None
    """An OpenEnv environment's Action from the policy's text: the name of the Action's text field that
    the text fills, or a function 'file.py:parse_action' (text -> Action); None = its only text field."""
    env_sessions: int = setting(0, ge=0)
    """With `env`: episodes in play at once, at least `samples_per_prompt` (whole groups): a batch beyond it
    is played in waves, each sampled as one batch. For an environment whose sessions are limited (an
    OpenEnv server's `max_concurrent_envs`, which allows 1 unless its server is told otherwise); 0 = the
    whole batch at once."""
    env_observation: str | None = None
    """An OpenEnv environment's Observation as the next user turn: the name of its text field, or a
    function 'file.py:render' (Observation -> str); None = its only text field besides done, reward and
    metadata."""
    max_turns: int = setting(4, ge=1)
    """With `env`: turns per episode at most; an episode still running after them is truncated: it
    bootstraps from V of its last context, or with `algo.bootstrap_truncated` false its return ends there
    (docs/algorithm.md §1.3)."""
    max_episode_tokens: int = setting(0, ge=0)
    """With `env`: tokens of an episode at most, prompt, turns and observations together; an observation
    that does not fit ends the episode (truncated, counted in `truncated_by_context_frac`). 0 = the
    policy's context."""
    env_timeout_s: float = setting(30.0, gt=0, finite=True)
    """With `env`: seconds each call of the environment (constructor, reset, step) may take; the
    environment runs in worker processes, and one past its limit is killed and the run stops."""
    env_workers: int | Literal["auto"] = setting("auto", ge=1)
    """With `env`: worker processes the environments run in (the episodes of a batch are spread over
    them and step in parallel). auto: the process's share of the host's cores, at most 4; an environment
    that waits on a service gains from more (docs/benchmarks.md)."""
    agent: str | None = None
    """An agent written against the OpenAI client, 'path/to/agent.py:run' (docs/agents.md): each episode
    calls run(client, row) — sync, or async with the async client — with an openai client whose base_url
    serves the policy on 127.0.0.1, every call recorded token-exact; what it returns is the episode's
    reward (a number, or one per call), which replaces `model.reward` as an environment's does."""
    agent_timeout_s: float = setting(300.0, gt=0, finite=True)
    """With `agent`: seconds an episode's agent may run; one past it is cut (its next call refused, its
    episode truncated and scored 0)."""

    @property
    def episodic(self) -> bool:
        """Episodes whose turn rewards are the reward (`env` or `agent`), not single-turn responses."""
        return self.env is not None or self.agent is not None


@dataclass
class AlgoConfig:
    estimator: EstimatorName = "gae"
    """Advantage estimator: 'gae' (critic; Schulman et al. 2015), or critic-free (docs/algorithm.md §3): 'grpo' (Shao
    et al. 2024), 'dr_grpo' (Liu et al. 2025), 'rloo' (Ahmadian et al. 2024), 'reinforce++' (Hu 2025)."""
    policy_loss: Literal["ppo", "pg"] = "ppo"
    """Policy loss: 'ppo' = the clipped surrogate (Schulman et al. 2017); 'pg' = the unclipped
    importance-weighted −ρ·Â (clip_eps, clip_eps_high and dual_clip are ignored)."""
    gamma: float = setting(1.0, ge=0, le=1)
    """Discount γ in [0, 1] of the TD residuals/GAE (Schulman et al. 2015) and of REINFORCE++'s returns;
    1 = undiscounted. Unused by grpo, dr_grpo and rloo."""
    gae_lambda: float = setting(0.95, ge=0, le=1)
    """GAE's λ in [0, 1] (Schulman et al. 2015) of the advantages and the critic target, unless
    adaptive_lambda_alpha / `critic.gae_lambda` replace it; 0 = one-step TD, 1 = the sampled return. gae only."""
    adaptive_lambda_alpha: float | None = setting(None, gt=0, finite=True)
    """VAPO length-adaptive actor λ = 1 − 1/(α·l); None = off."""
    bootstrap_truncated: bool | Literal["auto"] = "auto"
    """Whether a response cut by `rollout.max_new_tokens` (an episode cut by `rollout.max_turns` or the
    context) bootstraps its last TD residual from V_old(x_{l+1}) (docs/algorithm.md §1.3): partial-episode
    bootstrapping (Pardo et al. 2018), right where the reward of a cut response leaves out what would
    follow. False: the cut response's score, which the reward gave the text as it stands, ends its
    return (V = 0 after it), as in verl, OpenRLHF and TRL. Where most responses are cut and the reward
    scores them as they stand, True makes the critic's target r + V feed on its own value, and V climbs
    past every return (docs/critic.md, "Truncated responses"). auto: by the policy's size
    (config/sizing.py) — true below 10 M parameters (the built-in task, where it measured better),
    false from 10 M (pretrained models). gae only."""
    whiten_advantages: bool = True
    """Whiten GAE advantages over the global batch (critic-free estimators normalise themselves)."""
    kl_coef: float = setting(0.05, ge=0, finite=True)
    """β of the reference KL (docs/algorithm.md §1.2), in the reward or as a loss term (see kl_in); the starting value
    when adaptive (then > 0); 0 = no KL penalty."""
    kl_estimator: Literal["auto", "k1", "k2", "k3"] = "auto"
    """KL(π ‖ π_ref) per token (docs/algorithm.md §1.2). auto: k1 in the reward; k3 as a loss term (unbiased and
    ≥ 0, as in GRPO; k1 as a loss has zero expected gradient on-policy)."""
    kl_clamp: float | None = setting(10.0, gt=0)
    """A KL loss term's per-token estimate is clipped to [−kl_clamp, kl_clamp] (as verl and OpenRLHF
    do: k3 explodes where π_θ has moved far from π_ref); clipped tokens pass no gradient, and their
    share is logged as kl_clamp_frac. None = no clamp. Not used for a KL in the reward."""
    kl_in: Literal["auto", "reward", "loss"] = "auto"
    """Where the reference KL goes: into the shaped reward, or as a loss term β·KL. auto: the reward
    for estimators that learn from it (gae, reinforce++), the loss for those built from the scores alone
    (grpo, dr_grpo, rloo; docs/algorithm.md §3), where a KL in the reward would have no effect."""
    adaptive_kl_target: float | None = setting(None, gt=0, finite=True)
    """Target per-response KL for the adaptive β of Ziegler et al. 2019; None = fixed β."""
    adaptive_kl_horizon: float = setting(10000.0, gt=0, finite=True)
    """Horizon of the adaptive β (Ziegler et al. 2019), in episodes: β ← β·(1 + e·n/horizon), n = episodes
    per iteration; must be >= n. Used only with adaptive_kl_target."""
    clip_eps: float = setting(0.2, gt=0, finite=True)
    """PPO's ε (Schulman et al. 2017): the probability ratio is clipped to [1 − ε, 1 + ε] (upper bound
    1 + clip_eps_high when set). Must be > 0."""
    clip_eps_high: float | None = setting(None, gt=0, finite=True)
    """Clip-higher: upper ratio bound 1 + clip_eps_high; None = symmetric."""
    dual_clip: float | None = setting(None, gt=1)
    """Dual-clip constant c > 1 for negative advantages; None = off."""
    off_policy_correction: CorrectionName | None = None
    """How the policy loss corrects for tokens the clipping policy π_prox (logp_old, the learner's scoring
    forward) did not sample itself — the sampler π_behav's log-probabilities differ, w = π_prox/π_behav
    (docs/algorithm.md §1.6): None (not chosen: no correction, and `rollout.max_staleness` ≥ 1 refuses to
    start); 'none' (chosen: weights 1, the statistics still logged); 'decoupled' (weight w, tokens with
    w > `algo.is_cap` dropped: AReaL); 'tis' (weight min(w, `algo.is_cap`)); 'token-mask' (weight w inside
    [`algo.is_band_low`, `algo.is_band_high`], 0 outside: IcePop); 'sequence-tis' (the response's Π w,
    truncated at `algo.is_cap`, on each of its tokens); 'sequence-mask' (responses whose geometric-mean w
    leaves the band dropped)."""
    off_policy_mask: MaskName | None = None
    """The correction's mask part replaced (docs/algorithm.md §1.6): 'token-band' (IcePop's band),
    'sequence-band' (the geometric mean's band), 'token-cap' (w ≤ `algo.is_cap`), 'none' (no mask); None =
    the correction's own. E.g. 'tis' weights with IcePop's band: `off_policy_correction: tis`,
    `off_policy_mask: token-band`."""
    is_veto: float | None = setting(None, gt=0, lt=1)
    """A response holding any token with w below this floor carries no gradient at all (verl's
    `rollout_token_veto_threshold`; e.g. 1e-4); None = no veto."""
    is_cap: float = setting(2.0, gt=1, finite=True)
    """C of the truncated weights ('tis', 'sequence-tis') and of the cap mask ('decoupled', 'token-cap')."""
    is_band_low: float = setting(0.5, gt=0, le=1)
    """Lower end of the band of importance ratios ('token-mask', 'sequence-mask', the '*-band' masks)."""
    is_band_high: float = setting(2.0, ge=1, finite=True)
    """Upper end of the band of importance ratios ('token-mask', 'sequence-mask', the '*-band' masks)."""
    entropy_coef: float = setting(0.0, ge=0, finite=True)
    """c₂: weight of the entropy bonus −c₂·H[π_θ] in the policy loss (docs/algorithm.md §1.4); 0 = no bonus (the
    entropy is still logged, from the first epoch)."""
    loss_agg: Literal["auto", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "auto"
    """How per-token losses become one. auto: token-mean, or the estimator's own where the aggregation is
    part of it (dr_grpo: seq-mean-token-sum-norm); GRPO's paper averages per response first
    (seq-mean-token-mean), which auto does not pick (docs/algorithm.md §3)."""


@dataclass
class OptimConfig:
    epochs: int = setting(4, ge=1)
    """PPO epochs K: passes over each rollout, reshuffled into minibatches every pass (docs/algorithm.md §1.4)."""
    num_minibatches: int = setting(2, ge=1)
    """Minibatches per epoch, one optimiser step each; must divide the episodes per process
    (num_prompts / processes × samples_per_prompt)."""
    micro_batch_size: int | Literal["auto"] = setting("auto", ge=0, resume=True)
    """Sequences per forward/backward within a minibatch (gradient accumulation); 0 = whole minibatch.
    auto (config/sizing.py): the whole minibatch, except with LoRA adapters on a policy of ≥ 10 M
    parameters (whose small training state leaves the activations to set the peak): there the largest
    divisor of the minibatch whose estimated activations stay within a third of the memory the models
    and their training state take; logged in the banner."""
    actor_lr: float | Literal["auto"] = setting("auto", gt=0, finite=True)
    """AdamW learning rate of the policy's parameters (the schedule's peak). With a shared critic the
    trunk's value-loss gradient is also stepped at this rate. auto: by the policy's size
    (config/sizing.py) — 3e-4 below 10 M parameters (the built-in task's; 1e-3 with LoRA), 1e-6 above
    (a pretrained model; 1e-5 with LoRA), logged in the banner."""
    weight_decay: float = setting(0.0, ge=0, finite=True)
    """AdamW's decoupled weight decay of the weight matrices, for both optimisers (biases and norm weights
    exempt, ppo_lm.runtime.optim); 0 = none."""
    adam_betas: tuple[float, float] = setting((0.9, 0.999), ge=0, lt=1)
    """AdamW's (β₁, β₂), for both optimisers; each in [0, 1)."""
    adam_eps: float = setting(1e-8, gt=0, finite=True)
    """AdamW's ε, for both optimisers."""
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    """Learning-rate schedule after the warm-up: constant, or cosine/linear decay to 0 at the run's last
    optimiser step (the actor's count leaves out `critic.warmup_iterations`)."""
    warmup_steps: int = setting(0, ge=0)
    """Linear learning-rate warm-up, in optimiser steps (minibatch updates), for each optimiser: step k
    uses (k+1)/warmup_steps of the rate (ppo_lm.runtime.optim); 0 = none."""
    max_grad_norm: float = setting(1.0, gt=0)
    """Clip the global gradient norm to this, separately for the policy's and the critic's parameters
    (docs/algorithm.md §1.4)."""
    max_nonfinite_in_row: int = setting(3, ge=1)
    """Stop after this many consecutive minibatch updates with a non-finite loss or gradient norm (each one
    is skipped: no optimiser step, no statistics)."""


@dataclass
class LogConfig:
    save_every: int = setting(10, ge=0)
    """Write a checkpoint every this many iterations, and always after the last; 0 = only after the
    last."""
    keep_last: int = setting(2, ge=1)
    """Checkpoints kept under OUTPUT_DIR/checkpoints; older ones are deleted (>= 1)."""
    sample_every: int = 5
    """Every this many iterations, append num_samples (prompt, response, score) rows of the rollout to
    samples.jsonl; 0 = never."""
    num_samples: int = 4
    """Rows each sample_every writes: the first ones of the main process's share of the rollout."""
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Experiment trackers that mirror metrics.jsonl (which stays the record): any of 'tensorboard'
    (OUTPUT_DIR/tensorboard; skipped with a notice when not installed), 'wandb', 'mlflow', 'trackio'
    (each configured by its own environment variables, e.g. WANDB_MODE=offline, MLFLOW_TRACKING_URI);
    [] = none."""
    run_name: str | None = None
    """The run's name in the trackers; None = the output directory's name."""
    tensorboard: bool = True
    """False = leave 'tensorboard' out of report_to (the older switch, kept for existing configs)."""
    eval_every: int = setting(0, ge=0)
    """With `data.eval_prompts`: evaluate the policy before training, every this many iterations and
    after the last; 0 = before and after only. Logged as eval_score (mean score of the verifier: the
    `model.gold_reward` if set, else `model.reward`) and, with eval_samples > 1, eval_pass_at_k."""
    eval_samples: int = setting(1, ge=1)
    """Responses per held-out prompt: 1 = greedy; k > 1 = k sampled at the rollout's temperature,
    top_k and top_p (eval_score is their mean, eval_pass_at_k the share of prompts with one passing)."""
    eval_pass_score: float = 1.0
    """A sampled response passes (for eval_pass_at_k) when its score is at least this."""
    progress: bool = True
    """Show the run's progress: on a terminal, a bar with score, ref_kl and value loss redrawn once per
    iteration; otherwise (a batch job's log file) a plain line every print_every iterations."""
    print_every: int = setting(1, ge=0)
    """When stdout is not a terminal: print (and flush) one line of the main metrics every this many
    iterations, and after the last; 0 = none."""


RENAMED = {
    "model.critic": "critic.kind",
    "model.critic_init": "critic.init",
    "model.critic_lora_r": "critic.lora_r",
    "model.value_grad_scale": "critic.value_grad_scale",
    "optim.critic_lr": "critic.lr",
    "optim.critic_epochs": "critic.epochs",
    "optim.critic_warmup_iterations": "critic.warmup_iterations",
    "algo.vf_coef": "critic.vf_coef",
    "algo.value_clip_eps": "critic.value_clip_eps",
    "algo.critic_lambda": "critic.gae_lambda",
    "algo.critic_target": "critic.target",
}
"""Settings that moved, old dotted name → new: files, flags and the config.yaml of a run written
before still work, read under the new name with a one-line notice (config/io.py)."""


@dataclass
class TrainConfig:
    output_dir: str = setting("runs/train", resume=True)
    """Directory of the run: config.yaml, metrics.jsonl, samples.jsonl, tensorboard/ and
    checkpoints/; without --resume it must not hold a run already."""
    iterations: int = setting(20, ge=1, resume=True)
    """Total iterations; with --resume, training continues up to this number."""
    seed: int = setting(0, ge=-(2**52), le=2**52)
    """Seeds the built-in model and prompts, the prompt order, torch's RNG, and the sampling and
    minibatch-shuffling generators (offset per process; trainer/seeds.py). |seed| ≤ 2⁵², so every
    seed derived from it fits torch's generators."""
    resume: bool = setting(False, resume=True)
    """Continue from the newest intact checkpoint in output_dir, with the run's own settings (read from
    its config.yaml when no --config is given; differing ones are an error). An output_dir without a
    checkpoint is an error."""
    auto_resume: bool = setting(False, resume=True)
    """Resume when output_dir holds a checkpoint, else start the run: one command for a job that may be
    preempted and restarted."""
    threads: int = setting(0, ge=0, resume=True)
    """torch CPU threads; 0 = leave torch's default."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Policy, reference and reward models (docs/algorithm.md §2)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Training prompts."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Sampling of responses and their scoring (docs/algorithm.md §1.1)."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """Reward shaping, advantages and losses (docs/algorithm.md §1.2–1.4, §3)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Epochs, minibatches, optimisers and learning rates of the update."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """The critic of the estimators that have one: its kind, its model, its loss and its training
    (config/critics.py, docs/critic.md)."""
    log: LogConfig = setting(default_factory=LogConfig, resume=True)
    """Checkpoints, metrics, samples and progress display."""

    RENAMED: ClassVar[dict[str, str]] = RENAMED
    """The settings that moved (the module's :data:`RENAMED`), which config/io.py reads under their new names."""
