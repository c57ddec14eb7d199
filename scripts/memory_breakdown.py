"""Where a benchmark workload's memory goes: `python scripts/memory_breakdown.py --workload w3 --policy GGUF`.

Builds the workload exactly as ``ppo-lm bench`` does (``ppo_lm.cli.bench_workloads``: same models, config and
``PPOTrainer.train_iteration``) and reports, as one JSON line:

* ``counted_mb``: the tensors whose size is known exactly — each model's weights (storages shared
  between models counted once, so a duplicate shows as a larger sum), the optimisers' state, the
  gradients of the trained parameters (alive together at the optimiser step);
* ``rss_mb``: resident memory sampled every few milliseconds (``/proc/self/statm``) by a thread,
  as the peak per phase (sampling, scoring, update: policy forward/backward, critic
  forward/backward, optimiser step) and at the points that bound the counted parts: after the imports
  (the interpreter, torch, transformers: the process's baseline), after the trainer is built;
* ``vocab_wide_mb``: the largest single CPU allocations per phase that are as wide as the vocabulary
  (from ``torch.profiler``'s memory events, ``--profile``: one extra profiled iteration, slow);
* ``malloc_arenas``: glibc's view at the end (``mallinfo2``: bytes in use, held free in the arenas).

What is neither counted nor baseline at a phase's peak is activations, temporaries and the allocator's
retained free memory. Numbers are MiB (2^20 bytes). docs/benchmarks.md has the measured tables.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

MB = 2**20
_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE / MB


class Sampler(threading.Thread):
    """Peak RSS per phase label (``label`` is set by the hooks below)."""

    def __init__(self, every_s: float = 0.003):
        super().__init__(daemon=True)
        self.every_s, self.label, self.peaks, self.stop = every_s, "start", {}, False

    def run(self):
        while not self.stop:
            r = rss_mb()
            if r > self.peaks.get(self.label, 0.0):
                self.peaks[self.label] = r
            time.sleep(self.every_s)


def storages_mb(*modules) -> float:
    """Bytes of the distinct storages behind the modules' parameters and buffers."""
    seen: dict[int, int] = {}
    for m in modules:
        if m is None:
            continue
        for t in list(m.parameters()) + list(m.buffers()):
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values()) / MB


def mallinfo_mb() -> dict[str, float]:
    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                     "fordblks", "keepcost")]
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallInfo2
        mi = libc.mallinfo2()
    except (OSError, AttributeError):
        return {}
    return {"heap_in_use": round(mi.uordblks / MB, 1), "heap_free_held": round(mi.fordblks / MB, 1),
            "mmapped": round(mi.hblkhd / MB, 1)}


def hook_phases(trainer, sampler: Sampler) -> None:
    """Label the sampler's phases: sampling (the engine) and scoring, the update's policy and
    critic forward/backward (module pre-hooks) and the optimiser steps."""
    import ppo_lm.rollout.sample.engine as engine
    import ppo_lm.trainer.ppo as ppo

    def labelled(fn, label):
        def run(*a, **k):
            sampler.label = label
            try:
                return fn(*a, **k)
            finally:
                sampler.label = label + " (end)"
        return run

    gen = engine.generate
    engine.generate = lambda *a, **k: _then(labelled(gen, "sampling")(*a, **k), sampler, "scoring")
    ppo.ppo_update = labelled(ppo.ppo_update, "update")
    le = trainer.training.learner
    le.policy.register_forward_pre_hook(lambda *_: _set(sampler, "update: policy fwd/bwd"))
    if le.critic is not None:
        le.critic.register_forward_pre_hook(lambda *_: _set(sampler, "update: critic fwd/bwd"))
    for opt in (le.actor_opt, le.critic_opt):
        if opt is not None:
            opt.register_step_pre_hook(lambda *_: _set(sampler, "update: optimiser step"))


def _set(sampler: Sampler, label: str) -> None:
    if sampler.label.startswith("update"):  # (the scoring forwards call the same modules)
        sampler.label = label


def _then(value, sampler: Sampler, label: str):
    sampler.label = label
    return value


def vocab_allocations(trainer, iteration: int, vocab: int) -> dict[str, float]:
    """One profiled iteration: per op, the largest output (net allocation of one call) of at least
    ``vocab`` × 4 × 16 bytes (a vocabulary-wide fp32 tensor of ≥ 16 positions), in MiB."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        trainer.train_iteration(iteration)
    out: dict[str, float] = {}
    for e in prof.events():  # per op call: the memory its own code left allocated (its outputs)
        b = getattr(e, "self_cpu_memory_usage", 0)
        if b >= vocab * 4 * 16:
            out[e.name] = max(out.get(e.name, 0.0), round(b / MB, 1))
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:20])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", choices=["w1", "w3"], default="w3")
    ap.add_argument("--policy", default=None)
    ap.add_argument("--iterations", type=int, default=2, help="iterations after the first (warm-up) one")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cpu-lanes", type=int, default=None)
    ap.add_argument("--lora-r", type=int, default=0, help="model.lora_r, as ppo-lm bench's --lora-r")
    ap.add_argument("--micro-batch-size", type=int, default=None, help="optim.micro_batch_size")
    ap.add_argument("--profile", action="store_true", help="also one torch.profiler iteration (slow)")
    ap.add_argument("--no-release", action="store_true", help="without ppo_lm.runtime.memory.release_free_memory (A/B)")
    args = ap.parse_args(argv)

    import torch
    import transformers  # noqa: F401  (in the baseline, as the trainer imports it)

    import ppo_lm.cli.bench_workloads as workloads
    from ppo_lm.trainer.ppo import PPOTrainer

    torch.set_num_threads(args.threads)
    if args.no_release:
        import ppo_lm.runtime.memory

        ppo_lm.runtime.memory._TRIM = None
    sampler = Sampler()
    sampler.start()
    report: dict = {"workload": args.workload, "lora_r": args.lora_r, "release_free_memory": not args.no_release, "rss_mb": {"after imports": round(rss_mb())}}
    with tempfile.TemporaryDirectory(prefix="ppo-lm-mem-") as tmp:
        root = Path(tmp)
        n = 1 + args.iterations + args.profile
        if args.workload == "w3":
            reward, config = workloads.save_w3_reward(args.policy, root)
            shape = workloads.shape_of(config, workloads.W3_SHAPE.batch, workloads.W3_SHAPE.response_len)
            paths, rows = (args.policy, reward, None), workloads.w3_prompts(n * shape.batch)
        else:
            shape = workloads.W1_SHAPE
            paths, rows = workloads.save_models(root, shape), workloads.random_prompts(n * shape.batch, shape)
        cfg = workloads.make_config(args.workload, shape, paths, str(root / "run"), n, args.threads,
                                    cpu_lanes=args.cpu_lanes, lora_r=args.lora_r,
                                    micro_batch_size=args.micro_batch_size)
        report["rss_mb"]["before build"] = round(rss_mb())
        sampler.label = "build"
        trainer = PPOTrainer(cfg, prompt_rows=rows)
        report["rss_mb"]["after build"] = round(rss_mb())
        le = trainer.training.learner
        models = {"policy": trainer.models.policy, "reference": trainer.models.ref, "critic": le.critic,
                  "reward": getattr(trainer.models.rewards[0], "model", None) if trainer.models.rewards else None}
        counted = {f"weights {k}": round(storages_mb(m), 1) for k, m in models.items() if m is not None}
        counted["weights, all models (distinct storages)"] = round(storages_mb(*models.values()), 1)
        emb = trainer.models.policy.lm.get_input_embeddings().weight
        out_emb = trainer.models.policy.lm.get_output_embeddings().weight
        report["policy_embeddings_tied"] = emb.data_ptr() == out_emb.data_ptr()
        hook_phases(trainer, sampler)
        report["cpu_lanes"] = le.lanes.lanes
        for it in range(1, 2 + args.iterations):  # (iteration 1 already reaches the peak)
            sampler.label = "iteration"
            t = time.perf_counter()
            trainer.train_iteration(it)
            report.setdefault("iteration_s", []).append(round(time.perf_counter() - t, 2))
        opt_state = sum(v.numel() * v.element_size() for opt in (le.actor_opt, le.critic_opt) if opt is not None
                        for st in opt.state.values() for v in st.values() if torch.is_tensor(v))
        counted["optimiser state"] = round(opt_state / MB, 1)
        counted["gradients (policy + critic)"] = round(
            sum(p.numel() * p.element_size() for p in le.actor_params + le.critic_params) / MB, 1)
        report["counted_mb"] = counted
        if args.profile:
            report["vocab_wide_mb"] = vocab_allocations(trainer, n, shape.vocab)
        sampler.stop = True
        sampler.join()
    report["rss_mb"].update({k: round(v) for k, v in sampler.peaks.items()})
    report["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    report["malloc_arenas"] = mallinfo_mb()
    floor = counted["weights, all models (distinct storages)"] + counted["optimiser state"] + \
        counted["gradients (policy + critic)"]
    report["floor_mb"] = round(floor)
    report["baseline_plus_floor_mb"] = round(floor + report["rss_mb"]["after imports"])
    print(json.dumps(report), flush=True)
    return report


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
