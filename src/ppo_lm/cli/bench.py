"""``ppo-lm bench``: throughput of the real trainer on the benchmark workloads (docs/benchmarks.md).

The workloads W1, W2, W3 and W4 (models, prompts, settings, FLOP count) are defined in
:mod:`ppo_lm.cli.bench_workloads`; this module times them and accounts for the machine's other load.

Everything runs through :class:`ppo_lm.trainer.ppo.PPOTrainer` and its ``train_iteration`` — the
benchmark has no code path of its own. The models are saved to a temporary directory and loaded
from there by the trainer exactly as a user's checkpoints would be.

A figure is printed with the host's fp32 matmul peak (:mod:`ppo_lm.runtime.peak`), measured in the
same process after the timed iterations, and the share of it the update and the iteration reached:
hosts sold as the same CPU differ by more than 2× (docs/benchmarks.md "Hosts").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import torch

from ..config.critics import SELECTABLE
from ..runtime import peak
from .bench_workloads import (
    SEPARATE,
    TINY,
    W1_SHAPE,
    W3_SHAPE,
    CriticSetup,
    Shape,
    iteration_flops,
    make_config,
    random_prompts,
    save_models,
    save_w3_reward,
    shape_of,
    w3_prompts,
    w4_shape,
)


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
    """Tokens/s of ``transformers`` ``model.generate`` vs ppo-lm's ``rollout.sample.sampling.generate`` on the
    workload's policy and prompt batch (B × P prompts, exactly R sampled tokens, temperature 1)."""
    from ..rollout.sample.sampling import SamplingParams

    tok, lm = trainer.models.tokenizer, trainer.models.policy.lm
    R = shape.response_len  # W1's sampling on either workload: exactly R tokens, EOS masked
    params = SamplingParams(max_new_tokens=R, min_new_tokens=R, temperature=1.0, stop_token_ids=(tok.eos_token_id,))
    rows = trainer.plan.rows_for(1)
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
        trainer.sampler.engine.generate(ids, mask, params, generator=torch.Generator(device=device).manual_seed(0))

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


def _timed_iterations(trainer, shape, warmup: int, iterations: int, critic: CriticSetup):
    """Run ``warmup + iterations`` trainer iterations: per-iteration metrics, FLOPs and mean prompt
    lengths, and the host's load over the timed ones."""
    history, flops, prompt_means = [], [], []
    for it in range(1, warmup + iterations + 1):
        if it == warmup + 1:  # the machine's load over the timed iterations only
            cpu0, own0 = host_cpu(), own_cpu_s()
        done = trainer.train_iteration(it)
        history.append(done.metrics)
        b = done.batch
        lengths = b.response_mask.sum(1).tolist()
        prompt_lengths = b.attention_mask[:, :b.prompt_width].sum(1).tolist()
        flops.append(iteration_flops(shape, lengths, trainer.cfg.optim.epochs, prompt_lengths, critic))
        prompt_means.append(statistics.mean(prompt_lengths))
    return history, flops, prompt_means, host_load(cpu0, host_cpu(), own_cpu_s() - own0)


def host_peak_of(shape: Shape, cfg, prompt_len: float, response_len: float, threads: int) -> dict[str, float]:
    """The host's fp32 matmul peak (:mod:`ppo_lm.runtime.peak`) at the workload's update shapes — a
    minibatch's tokens through each linear layer — and at 2048³, and nothing on another device, whose
    peak this does not measure."""
    if cfg.model.device != "cpu":
        return {}
    episodes = cfg.rollout.num_prompts * cfg.rollout.samples_per_prompt
    rows = max(round(episodes / cfg.optim.num_minibatches * (prompt_len + response_len)), 1)
    kv_width = shape.hidden // shape.heads * shape.kv_heads
    return peak.host_peak(peak.decoder_shapes(rows, shape.hidden, shape.intermediate, kv_width),
                          threads or torch.get_num_threads())


def peak_fractions(host: dict[str, float], update_gflop_per_s: float, iteration_gflop_per_s: float) -> dict[str, float]:
    """How much of the host's best matmul speed (the faster backend of ``host``, from
    :func:`host_peak_of`) the update and the whole iteration reached, at the workload's shapes and at
    2048³: a figure that can be set beside another host's."""
    out = {}
    for suffix in ("", f"_{peak.REFERENCE}"):
        best = max((v for k, v in host.items() if k.endswith(f"_gflop_per_s{suffix}")), default=0.0)
        if best > 0:
            out[f"update_of_peak{suffix}"] = round(update_gflop_per_s / best, 3)
            out[f"iteration_of_peak{suffix}"] = round(iteration_gflop_per_s / best, 3)
    return out


def _print_result(result: dict, json_out: bool) -> None:
    if json_out:
        print(json.dumps(result), flush=True)
    else:
        width = max(map(len, result))
        for k, v in result.items():
            print(f"{k:<{width}}  {v}")


def run_bench(workload: str = "w1", iterations: int = 3, threads: int = 2, json_out: bool = False, *,
              warmup: int = 1, tiny: bool = False, compare_hf_generate: bool = False,
              compile_kernels: bool = False, device: str = "cpu", logp_from_sampler: bool = False,
              cpu_lanes: int | None = None, policy: str | None = None, lora_r: int = 0,
              micro_batch_size: int | None = None, response_length: int | None = None, max_staleness: int = 0,
              producer_threads: int | None = None, critic: CriticSetup = SEPARATE) -> dict:
    """Build the workload, run ``warmup + iterations`` trainer iterations and report throughput
    (``policy``: W3's model, a ``.gguf`` file or a save_pretrained directory; ``response_length``: W4's;
    ``critic``: the critic to run instead of the workload's separate one, or none).

    Per-phase seconds are medians over the timed iterations (the ``warmup`` first ones are dropped);
    ``episodes_per_s`` = batch / median ``iteration_s``, the learner's wall clock (``max_staleness`` ≥ 1:
    its waits for the batch and at publish included; the producer's ``producer_decode_s`` and
    ``producer_idle_s`` beside it). Prints a table, or one JSON line if ``json_out``.
    """
    from ..models import kernels
    from ..trainer.ppo import PPOTrainer

    if workload not in ("w1", "w2", "w3", "w4"):
        raise ValueError(f"unknown workload {workload!r}; choose w1, w2, w3 or w4")
    if (workload == "w3") != (policy is not None):
        raise ValueError("W3 needs a policy (a .gguf file or a model directory); W1, W2 and W4 build their own")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards" / "Loading weights" bars: noise here
    shape = w4_shape(response_length, tiny) if workload == "w4" else TINY if tiny else W1_SHAPE
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
                          device, logp_from_sampler, cpu_lanes, lora_r, micro_batch_size, max_staleness,
                          producer_threads, critic)
        t_build = time.perf_counter()
        trainer = PPOTrainer(cfg, prompt_rows=rows)
        build_s = time.perf_counter() - t_build
        try:
            history, flops, prompt_means, load = _timed_iterations(trainer, shape, warmup, iterations, critic)
        finally:
            trainer.source.close()  # an asynchronous producer's process
        rss_mb = peak_rss_mb()  # the trainer's peak, before the optional generate comparison
        extra = compare_generate(trainer, shape) if compare_hf_generate else {}
        response_mean = statistics.mean(m["response_length_mean"] for m in history[warmup:])
        host = host_peak_of(shape, trainer.cfg, statistics.mean(prompt_means[warmup:]), response_mean, threads)

    timed, timed_flops = history[warmup:], flops[warmup:]

    def med(key: str) -> float:
        return statistics.median(m[key] for m in timed)

    it_s = med("iteration_s")  # the learner's wall clock, an asynchronous one's waits at publish included
    result = {
        "system": "ppo-lm", "workload": workload.upper() + ("-tiny" if tiny else ""), "iterations": len(timed),
        "threads": torch.get_num_threads(), "s_per_iteration": round(it_s, 3),
        "iteration_s_each": [round(m["iteration_s"], 3) for m in timed],
        "episodes_per_s": round(shape.batch / it_s, 3),
        **{k: round(med(k), 3) for k in ("generate_s", "score_s", "advantage_s", "update_s")},
        "rollout_tokens_per_s": round(med("rollout_tokens_per_s"), 1),  # asynchronous: the producer's clock
        **({k: round(med(k), 3) for k in ("producer_decode_s", "producer_idle_s", "publish_s")} if max_staleness
           else {}),
        "update_tokens_per_s": round(med("update_tokens_per_s"), 1),
        "response_length_mean": round(statistics.mean(m["response_length_mean"] for m in timed), 2),
        "prompt_length_mean": round(statistics.mean(prompt_means[warmup:]), 2),
        "gflop_per_iteration": round(statistics.mean(f["total"] for f in timed_flops) / 1e9, 1),
        "achieved_gflop_per_s": round(statistics.median(f["total"] / m["iteration_s"] for f, m in
                                                        zip(timed_flops, timed)) / 1e9, 1),
        "update_gflop_per_s": round(statistics.median(f["update"] / m["update_s"] for f, m in
                                                      zip(timed_flops, timed)) / 1e9, 1),
        **{k: float(f"{v:.4g}") for k, v in host.items()},  # 4 digits: a busy host's can be < 0.1
        "warmup_s": round(sum(m["iteration_s"] for m in history[:warmup]), 3),
        "build_s": round(build_s, 3),
        "compile_kernels": kernels.compiled(), "logp_from_sampler": logp_from_sampler,
        "cpu_lanes": trainer.training.learner.lanes.lanes,
        "max_staleness": max_staleness,
        **({"producer_threads": trainer.source.producer_threads} if max_staleness else {}),
        "lora_r": lora_r, "critic": critic.label(), "micro_batch_size": trainer.cfg.optim.micro_batch_size,
        "peak_rss_mb": round(rss_mb), **load,
        **({"policy": str(policy)} if policy is not None else {}),
        "device": device, "torch": torch.__version__,
        **({"gpu_peak_mem_mb": round(torch.cuda.max_memory_allocated() / 2**20)} if device.startswith("cuda") else {}), "nproc": os.cpu_count(), "machine": platform.machine(),
    }
    result.update(peak_fractions(host, result["update_gflop_per_s"], result["achieved_gflop_per_s"]))
    result.update({k: round(v, 2) for k, v in extra.items()})
    _print_result(result, json_out)
    return result


def bench_command(argv: list[str]) -> dict:
    """Parse ``ppo-lm bench`` flags, check them before anything is built, and run."""
    from ..runtime.errors import ArgumentParser, UsageError

    ap = ArgumentParser(prog="ppo-lm bench", description="Throughput of the PPO trainer on the "
                        "benchmark workloads W1 (fixed 64-token responses), W2 (early stops), W3 (a real "
                        "model given by --policy, e.g. SmolLM2-135M-Instruct) and W4 (W1 with long responses).")
    ap.add_argument("--workload", choices=["w1", "w2", "w3", "w4"], default="w1")
    ap.add_argument("--policy", default=None, metavar="PATH",
                    help="W3 only: the policy, a .gguf file or a save_pretrained directory")
    ap.add_argument("--response-length", type=int, default=None, metavar="N",
                    help="W4 only: sampled tokens per response (default 1024); 4096 // N prompts keep W1's "
                         "4096 tokens per iteration (64 is W1)")
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
                    help="model.cpu_lanes (default: auto, two lanes, one when policy and critic train more than "
                         "64 M fp32 parameters): threads that each update/score a share of the rows")
    ap.add_argument("--lora-r", type=int, default=0,
                    help="model.lora_r: train LoRA adapters of this rank on every linear layer (0: every weight)")
    ap.add_argument("--micro-batch-size", type=int, default=None, metavar="N",
                    help="optim.micro_batch_size: sequences per forward/backward within a minibatch (0: the "
                         "whole minibatch; default: the library's auto, config/sizing.py)")
    ap.add_argument("--max-staleness", type=int, default=0, metavar="K",
                    help="rollout.max_staleness: a producer process samples up to K updates ahead, with the tis "
                         "correction (docs/async.md); 0: synchronous")
    ap.add_argument("--producer-threads", type=int, default=None, metavar="N",
                    help="rollout.producer_threads with --max-staleness (default: auto)")
    ap.add_argument("--estimator", choices=["gae", "reinforce++"], default="gae",
                    help="gae (the workloads' definition) or reinforce++: the same work without a critic")
    ap.add_argument("--critic", choices=list(SELECTABLE), default=SEPARATE.kind,
                    help="critic.kind: a separate critic (the workloads' definition, from the reward model), a "
                         "value head on the policy, or a value head on the reward model's frozen body")
    ap.add_argument("--critic-lora-r", type=int, default=None, metavar="N",
                    help="critic.lora_r: LoRA adapters of rank N on the separate critic's frozen body")
    ap.add_argument("--critic-epochs", type=int, default=None, metavar="N",
                    help="critic.epochs: the critic's passes over each rollout (default: the policy's 4)")
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
    if args.max_staleness < 0:
        raise UsageError(f"--max-staleness must be >= 0, got {args.max_staleness}")
    if args.producer_threads is not None and (args.producer_threads < 1 or not args.max_staleness):
        raise UsageError("--producer-threads takes a number >= 1, with --max-staleness >= 1")
    if args.micro_batch_size is not None and args.micro_batch_size < 0:
        raise UsageError(f"--micro-batch-size must be >= 0, got {args.micro_batch_size}")
    critic = critic_setup(args)
    if args.response_length is not None:
        if args.workload != "w4":
            raise UsageError(f"--response-length is for --workload w4; {args.workload} has its own")
        try:
            w4_shape(args.response_length, args.tiny)
        except ValueError as e:
            raise UsageError(f"--response-length {e}") from None
    if args.workload == "w3" and args.policy is None:
        raise UsageError("--workload w3 needs --policy PATH (a .gguf file, e.g. SmolLM2-135M-Instruct's, or a "
                         "save_pretrained model directory)")
    if args.workload != "w3" and args.policy is not None:
        raise UsageError(f"--policy is for --workload w3; {args.workload} builds its own models")
    if args.policy is not None:
        from ..models.loading import check_model_dir

        check_model_dir(args.policy, "--policy", "causal-lm")  # a bad path fails before anything loads
    from ..runtime.errors import ConfigError
    from ..trainer.roles import resolve_device

    try:
        resolve_device(args.device)  # before building anything
    except ConfigError as e:
        raise UsageError(str(e).replace("`model.device`", "--device")) from None
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return run_bench(args.workload, args.iterations, args.threads, args.json, warmup=args.warmup, tiny=args.tiny,
                     compare_hf_generate=args.compare_hf_generate, compile_kernels=args.compile_kernels,
                     device=args.device, logp_from_sampler=args.logp_from_sampler, cpu_lanes=args.cpu_lanes,
                     lora_r=args.lora_r, micro_batch_size=args.micro_batch_size,
                     policy=args.policy, response_length=args.response_length, max_staleness=args.max_staleness,
                     producer_threads=args.producer_threads, critic=critic)


def critic_setup(args) -> CriticSetup:
    """The --estimator/--critic/--critic-lora-r/--critic-epochs flags as a :class:`CriticSetup`, or a
    UsageError naming the flag that does not fit."""
    from ..runtime.errors import UsageError

    for flag, value in (("--critic-lora-r", args.critic_lora_r), ("--critic-epochs", args.critic_epochs)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    setup = CriticSetup(args.estimator, args.critic, args.critic_lora_r, args.critic_epochs)
    if not setup.has_critic and (args.critic != SEPARATE.kind or args.critic_lora_r or args.critic_epochs):
        raise UsageError(f"--estimator {args.estimator} has no critic; leave out --critic, --critic-lora-r and "
                         "--critic-epochs")
    if args.critic_lora_r and "critic.lora_r" not in setup.critic_kind.settings:
        raise UsageError(f"--critic-lora-r puts adapters on a separate critic; --critic is {args.critic}")
    return setup


def cmd_bench(argv: list[str]) -> int:
    """``ppo-lm bench --workload w1|w2|w3|w4 [--policy PATH] [--response-length N] --iterations N [--threads 2] [--json]
    [--compare-hf-generate]``: a bad
    flag or value is one line and status 2, before anything is built."""
    from .main import _run

    return _run(lambda: bench_command(argv))
