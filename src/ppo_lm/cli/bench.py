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

import dataclasses
import json
import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from .bench_flags import check, critic_setup, parser
from .bench_host import host_cpu, host_load, host_peak_of, own_cpu_s, peak_fractions, peak_rss_mb
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


def _print_result(result: dict, json_out: bool) -> None:
    if json_out:
        print(json.dumps(result), flush=True)
    else:
        width = max(map(len, result))
        for k, v in result.items():
            print(f"{k:<{width}}  {v}")


@dataclass(frozen=True)
class BenchRun:
    """One ``ppo-lm bench`` measurement: the workload (``policy``: W3's model, a ``.gguf`` file or a
    save_pretrained directory; ``response_length``: W4's), how long it is timed, and what is changed in
    it — each field is the flag of the same name (``critic``: the critic to run instead of the
    workloads' separate one, or none)."""

    workload: str = "w1"
    iterations: int = 3
    warmup: int = 1
    threads: int = 2
    tiny: bool = False
    compare_hf_generate: bool = False
    compile_kernels: bool = False
    device: str = "cpu"
    logp_from_sampler: bool = False
    cpu_lanes: int | None = None
    policy: str | None = None
    lora_r: int = 0
    micro_batch_size: int | None = None
    response_length: int | None = None
    max_staleness: int = 0
    producer_threads: int | None = None
    critic: CriticSetup = SEPARATE


class Measured(NamedTuple):
    """What one measurement gave: each iteration's metrics, FLOPs and mean prompt length (the warm-up's
    first), the host's load over the timed ones and its peak, the trainer's build time, peak memory and
    sizes it resolved, and the optional generate comparison."""

    shape: Shape
    history: list[dict]
    flops: list[dict[str, float]]
    prompt_means: list[float]
    load: dict[str, float]
    host: dict[str, float]
    build_s: float
    rss_mb: float
    resolved: dict
    generate: dict[str, float]


def run_bench(run: BenchRun, json_out: bool = False) -> dict:
    """Build the workload, run ``warmup + iterations`` trainer iterations and report throughput.

    Per-phase seconds are medians over the timed iterations (the ``warmup`` first ones are dropped);
    ``episodes_per_s`` = batch / median ``iteration_s``, the learner's wall clock (``max_staleness`` ≥ 1:
    its waits for the batch and at publish included; the producer's ``producer_decode_s`` and
    ``producer_idle_s`` beside it). Prints a table, or one JSON line if ``json_out``.
    """
    if run.workload not in ("w1", "w2", "w3", "w4"):
        raise ValueError(f"unknown workload {run.workload!r}; choose w1, w2, w3 or w4")
    if (run.workload == "w3") != (run.policy is not None):
        raise ValueError("W3 needs a policy (a .gguf file or a model directory); W1, W2 and W4 build their own")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards" / "Loading weights" bars: noise here
    if run.threads:
        torch.set_num_threads(run.threads)
    result = _result(run, _measure(run))
    _print_result(result, json_out)
    return result


def _measure(run: BenchRun) -> Measured:
    """Save the workload's models, build the trainer on them as a user's run would, and time it."""
    from ..trainer.ppo import PPOTrainer

    shape = w4_shape(run.response_length, run.tiny) if run.workload == "w4" else TINY if run.tiny else W1_SHAPE
    with tempfile.TemporaryDirectory(prefix="ppo-lm-bench-") as tmp:
        root = Path(tmp)
        n_rows = (run.warmup + run.iterations) * (W3_SHAPE.batch if run.workload == "w3" else shape.batch)
        if run.workload == "w3":
            reward, config = save_w3_reward(run.policy, root)
            shape = shape_of(config, W3_SHAPE.batch, W3_SHAPE.response_len)
            paths, rows = (run.policy, reward, None), w3_prompts(n_rows)
        else:
            paths, rows = save_models(root, shape), random_prompts(n_rows, shape)
        cfg = make_config(run.workload, shape, paths, str(root / "run"), run.warmup + run.iterations, run.threads,
                          run.compile_kernels, run.device, run.logp_from_sampler, run.cpu_lanes, run.lora_r,
                          run.micro_batch_size, run.max_staleness, run.producer_threads, run.critic)
        t_build = time.perf_counter()
        trainer = PPOTrainer(cfg, prompt_rows=rows)
        build_s = time.perf_counter() - t_build
        try:
            history, flops, prompt_means, load = _timed_iterations(trainer, shape, run.warmup, run.iterations,
                                                                   run.critic)
        finally:
            trainer.source.close()  # an asynchronous producer's process
        rss_mb = peak_rss_mb()  # the trainer's peak, before the optional generate comparison
        generate = compare_generate(trainer, shape) if run.compare_hf_generate else {}
        timed = history[run.warmup:]
        response_mean = statistics.mean(m["response_length_mean"] for m in timed)
        host = host_peak_of(shape, trainer.cfg, statistics.mean(prompt_means[run.warmup:]), response_mean,
                            run.threads)
        resolved = {"cpu_lanes": trainer.training.learner.lanes.lanes,
                    "micro_batch_size": trainer.cfg.optim.micro_batch_size,
                    **({"producer_threads": trainer.source.producer_threads} if run.max_staleness else {})}
    return Measured(shape, history, flops, prompt_means, load, host, build_s, rss_mb, resolved, generate)


def _result(run: BenchRun, m: Measured) -> dict:
    """The figures of a measurement, as ``ppo-lm bench`` prints them (docs/benchmarks.md)."""
    from ..models import kernels

    timed, timed_flops = m.history[run.warmup:], m.flops[run.warmup:]

    def med(key: str) -> float:
        return statistics.median(x[key] for x in timed)

    def gflop_per_s(part: str, seconds: str) -> float:
        return round(statistics.median(f[part] / x[seconds] for f, x in zip(timed_flops, timed)) / 1e9, 1)

    it_s = med("iteration_s")  # the learner's wall clock, an asynchronous one's waits at publish included
    result = {
        "system": "ppo-lm", "workload": run.workload.upper() + ("-tiny" if run.tiny else ""),
        "iterations": len(timed), "threads": torch.get_num_threads(), "s_per_iteration": round(it_s, 3),
        "iteration_s_each": [round(x["iteration_s"], 3) for x in timed],
        "episodes_per_s": round(m.shape.batch / it_s, 3),
        **{k: round(med(k), 3) for k in ("generate_s", "score_s", "advantage_s", "update_s")},
        "rollout_tokens_per_s": round(med("rollout_tokens_per_s"), 1),  # asynchronous: the producer's clock
        **({k: round(med(k), 3) for k in ("producer_decode_s", "producer_idle_s", "publish_s")}
           if run.max_staleness else {}),
        "update_tokens_per_s": round(med("update_tokens_per_s"), 1),
        "response_length_mean": round(statistics.mean(x["response_length_mean"] for x in timed), 2),
        "prompt_length_mean": round(statistics.mean(m.prompt_means[run.warmup:]), 2),
        "gflop_per_iteration": round(statistics.mean(f["total"] for f in timed_flops) / 1e9, 1),
        "achieved_gflop_per_s": gflop_per_s("total", "iteration_s"),
        "update_gflop_per_s": gflop_per_s("update", "update_s"),
        **{k: float(f"{v:.4g}") for k, v in m.host.items()},  # 4 digits: a busy host's can be < 0.1
        "warmup_s": round(sum(x["iteration_s"] for x in m.history[:run.warmup]), 3),
        "build_s": round(m.build_s, 3),
        "compile_kernels": kernels.compiled(), "logp_from_sampler": run.logp_from_sampler,
        "cpu_lanes": m.resolved["cpu_lanes"], "max_staleness": run.max_staleness,
        **({"producer_threads": m.resolved["producer_threads"]} if run.max_staleness else {}),
        "lora_r": run.lora_r, "critic": run.critic.label(), "micro_batch_size": m.resolved["micro_batch_size"],
        "peak_rss_mb": round(m.rss_mb), **m.load,
        **({"policy": str(run.policy)} if run.policy is not None else {}),
        "device": run.device, "torch": torch.__version__,
        **({"gpu_peak_mem_mb": round(torch.cuda.max_memory_allocated() / 2**20)}
           if run.device.startswith("cuda") else {}),
        "nproc": os.cpu_count(), "machine": platform.machine(),
    }
    result.update(peak_fractions(m.host, result["update_gflop_per_s"], result["achieved_gflop_per_s"]))
    result.update({k: round(v, 2) for k, v in m.generate.items()})
    return result


def bench_command(argv: list[str]) -> dict:
    """Parse ``ppo-lm bench`` flags, check them before anything is built, and run."""
    args = parser().parse_args(argv)
    check(args)
    critic = critic_setup(args)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    options = {f.name: getattr(args, f.name) for f in dataclasses.fields(BenchRun) if f.name != "critic"}
    return run_bench(BenchRun(**options, critic=critic), args.json)


def cmd_bench(argv: list[str]) -> int:
    """``ppo-lm bench --workload w1|w2|w3|w4 [--policy PATH] [--response-length N] --iterations N [--threads 2] [--json]
    [--compare-hf-generate]``: a bad
    flag or value is one line and status 2, before anything is built."""
    from .main import _run

    return _run(lambda: bench_command(argv))
