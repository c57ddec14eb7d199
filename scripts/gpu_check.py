"""GPU figures for docs/distributed.md and docs/benchmarks.md, in one short run on a CUDA machine.

    PYTHONPATH=src python3 scripts/gpu_check.py [--out OUT_DIR] [--device cuda]

Uses the Python API, not the CLI (so tyro need not be installed; torch, transformers, tokenizers,
pyyaml and rich are): the W1 benchmark on the device (fp32, as W1 is defined, then with compiled
kernels), then a 20-iteration training smoke run of the built-in task (bf16 on a GPU, fp32 on CPU).
Prints one JSON line per part and writes them to OUT_DIR/gpu_check.jsonl. ``--device cpu`` is a
dry run of the script itself.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def main() -> int:
    import torch

    from ppo_lm.cli.bench import BenchRun, run_bench
    from ppo_lm.config.train import TrainConfig
    from ppo_lm.trainer.ppo import PPOTrainer

    ap = argparse.ArgumentParser(description="GPU figures: W1 benchmark and a training smoke run")
    ap.add_argument("--out", default=".", help="folder for gpu_check.jsonl")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    gpu = args.device.startswith("cuda")
    if gpu and not torch.cuda.is_available():
        raise SystemExit("no CUDA device (use --device cpu for a dry run)")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = [{"device": torch.cuda.get_device_name() if gpu else "cpu", "torch": torch.__version__}]
    for compile_kernels in (False, True):
        r = run_bench(BenchRun("w1", iterations=3, threads=0, device=args.device, compile_kernels=compile_kernels))
        lines.append({"part": "w1", **r})
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(output_dir=tmp, iterations=20, seed=0)
        cfg.model.device, cfg.model.dtype = args.device, "bfloat16" if gpu else "float32"
        cfg.log.progress = cfg.log.tensorboard = False
        t = time.perf_counter()
        history = PPOTrainer(cfg).train()
        lines.append({"part": "train_smoke", "dtype": cfg.model.dtype, "iterations": len(history),
                      "seconds": round(time.perf_counter() - t, 1),
                      "score_first": history[0]["score"], "score_last": history[-1]["score"],
                      **({"gpu_peak_mem_mb": round(torch.cuda.max_memory_allocated() / 2**20)} if gpu else {})})
    with open(out_dir / "gpu_check.jsonl", "w") as f:
        for line in lines:
            print(json.dumps(line), flush=True)
            f.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
