"""Typed configuration: the single source of defaults. YAML files and CLI flags only override these.

CLI flags follow the dataclass nesting: ``--algo.gae-lambda 0.9``, ``--rollout.max-new-tokens 16``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class ModelConfig:
    policy: str = "builtin"
    """Path to an AutoModelForCausalLM checkpoint (save_pretrained dir), or 'builtin' for the tiny
    Qwen2-architecture model of the built-in equation task."""
    tokenizer: str | None = None
    """Tokenizer path; defaults to the policy path (or the built-in character tokenizer)."""
    pad_token: str | None = None
    """Set the tokenizer's pad token to this existing token when it has none (or pad == eos)."""
    reward: str = "builtin:equations"
    """'builtin:equations' (the equation verifier), 'module:function' (a Python verifier
    ``f(prompts, responses, **columns) -> scores``), or a path to a one-label
    AutoModelForSequenceClassification (e.g. the output of ``ppo-lm rm``)."""
    gold_reward: str | None = None
    """Optional verifier ('module:function' or 'builtin:equations') scored next to the training reward
    and logged as `gold_score`: with a learned reward model it shows over-optimisation."""
    critic: Literal["separate", "shared"] = "separate"
    """'separate': own transformer body + scalar head; 'shared': a value head on the policy trunk."""
    critic_init: str = "auto"
    """Separate critic's body: 'auto' (reward model if there is one, else policy), 'policy',
    'reward', or a path to a checkpoint."""
    value_grad_scale: float = 1.0
    """Shared critic only: scale of the value-loss gradient that reaches the trunk (0 = head only)."""
    builtin_hidden_size: int = 64
    builtin_layers: int = 2
    builtin_heads: int = 4
    fsdp: bool = False
    """Under torchrun: shard policy and critic (parameters, gradients, optimiser state) and the frozen
    reference and reward model with FSDP2 `fully_shard` instead of replicating them (DDP). Ignored in
    a single process."""
    fsdp_bf16: bool = False
    """With fsdp: bf16 compute/all-gather (fp32 master weights and gradient reduction)."""
    compile_kernels: bool = False
    """Fuse RMSNorm, RoPE and SwiGLU of Qwen2/Llama training forwards/backwards with torch.compile
    (W1 update on 2 CPU cores: ≈ 4 % faster with one lane, ≈ 1 % with two; ≈ 15 s of compiling at
    start, ≈ 4 s once inductor's disk cache is warm). Falls back to eager kernels with a warning when
    no compiler is usable."""
    cpu_lanes: int = 2
    """On CPU in a single process: share the rows of each update micro-batch and each scoring forward
    among this many threads that run at once, each with its share of torch's threads; their
    gradients are summed (W1 on 2 cores: ≈ 8 % faster per iteration, peak RSS +130 MB for the second
    thread's malloc arena). 1 = one thread. Ignored on GPUs and under torchrun."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "auto"
    """'auto' (cuda:LOCAL_RANK if available, else cpu), 'cpu', 'cuda', …"""


@dataclass
class DataConfig:
    prompts: str = "builtin:equations"
    """'builtin:equations', or a JSONL/Parquet file or saved `datasets` directory with a prompt column."""
    prompt_column: str = "prompt"
    builtin_num_prompts: int = 2000
    """Size of the built-in training prompt set."""
    shuffle: bool = True


@dataclass
class RolloutConfig:
    num_prompts: int = 32
    """Prompts per iteration over all ranks; each is sampled ``samples_per_prompt`` times."""
    samples_per_prompt: int = 1
    max_new_tokens: int = 8
    min_new_tokens: int = 0
    """Stop tokens cannot be sampled before this many response tokens (= max_new_tokens gives
    fixed-length responses, as in the W1 benchmark)."""
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    stop_tokens: list[str] = field(default_factory=list)
    """Extra stop strings (single tokens) besides the tokenizer's EOS."""
    missing_eos_penalty: float = 0.0
    """Subtracted from the score of responses cut by the length limit (no stop token)."""
    forward_batch_size: int = 0
    """Batch size of the scoring forwards (policy/ref/critic/reward); 0 = the whole rollout."""
    logp_from_sampler: bool = False
    """Take logp_old from the sampler's logits instead of a scoring forward of the policy (saves
    that forward, ≈ 4 % of a W1 iteration). The two agree within 1e-5 but not exactly, so the first
    update's ratio is 1 only to ≈ 1e-6. Ignored with a shared critic (its values need the forward)."""


@dataclass
class AlgoConfig:
    estimator: Literal["gae", "grpo", "dr_grpo", "rloo", "reinforce++"] = "gae"
    policy_loss: Literal["ppo", "pg"] = "ppo"
    gamma: float = 1.0
    gae_lambda: float = 0.95
    critic_lambda: float | None = None
    """Decoupled GAE (VC-PPO): λ for the critic target; None = gae_lambda."""
    adaptive_lambda_alpha: float | None = None
    """VAPO length-adaptive actor λ = 1 − 1/(α·l); None = off."""
    whiten_advantages: bool = True
    """Whiten GAE advantages over the global batch (critic-free estimators normalise themselves)."""
    kl_coef: float = 0.05
    kl_estimator: Literal["auto", "k1", "k2", "k3"] = "auto"
    """KL(π ‖ π_ref) per token (SPEC §1.2). auto: k1 in the reward; k3 as a loss term (unbiased and
    ≥ 0, as in GRPO; k1 as a loss has zero expected gradient on-policy)."""
    kl_in: Literal["auto", "reward", "loss"] = "auto"
    """Where the reference KL goes: into the shaped reward, or as a loss term β·KL. auto: the reward
    for estimators that learn from it (gae, reinforce++), the loss for those built from the scores alone
    (grpo, dr_grpo, rloo; SPEC §3), where a KL in the reward would have no effect."""
    adaptive_kl_target: float | None = None
    """Target per-response KL for the adaptive β of Ziegler et al. 2019; None = fixed β."""
    adaptive_kl_horizon: float = 10000.0
    critic_target: Literal["shaped", "score"] = "shaped"
    """'score' trains the critic on score-only rewards (KL part excluded from its target)."""
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    """Clip-higher: upper ratio bound 1 + clip_eps_high; None = symmetric."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 for negative advantages; None = off."""
    value_clip_eps: float | None = 0.2
    vf_coef: float = 0.1
    entropy_coef: float = 0.0
    loss_agg: Literal["auto", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "auto"
    """How per-token losses become one. auto: token-mean, or the estimator's own (dr_grpo:
    seq-mean-token-sum-norm, SPEC §3)."""


@dataclass
class OptimConfig:
    epochs: int = 4
    num_minibatches: int = 2
    micro_batch_size: int = 0
    """Sequences per forward/backward within a minibatch (gradient accumulation); 0 = whole minibatch."""
    actor_lr: float = 3e-4
    critic_lr: float = 1e-3
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    warmup_steps: int = 0
    max_grad_norm: float = 1.0
    critic_warmup_iterations: int = 0
    """The first N iterations train only the critic (policy frozen)."""
    max_nonfinite_in_row: int = 3
    """Stop after this many consecutive minibatch updates with a non-finite loss or gradient norm (each one
    is skipped: no optimiser step, no statistics)."""


@dataclass
class LogConfig:
    save_every: int = 10
    keep_last: int = 2
    sample_every: int = 5
    num_samples: int = 4
    tensorboard: bool = True
    progress: bool = True


@dataclass
class TrainConfig:
    output_dir: str = "runs/train"
    iterations: int = 20
    """Total iterations; with --resume, training continues up to this number."""
    seed: int = 0
    resume: bool = False
    threads: int = 0
    """torch CPU threads; 0 = leave torch's default."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    log: LogConfig = field(default_factory=LogConfig)
