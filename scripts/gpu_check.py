"""GPU figures for docs/distributed.md and docs/benchmarks.md, in one short run on a CUDA machine.

    PYTHONPATH=src python3 scripts/gpu_check.py [OUT_DIR]

Uses the Python API only (no CLI dependencies beyond torch and transformers): the W1 benchmark on
``cuda`` (fp32, as W1 is defined, and with compiled kernels), then a 20-iteration training smoke run
of the built-in task on ``cuda`` in bf16. Prints one JSON line per part and writes them to
OUT_DIR/gpu_check.jsonl.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    import torch

    from ppo_lm.bench import run_bench
    from ppo_lm.trainer.config import TrainConfig
    from ppo_lm.trainer.ppo import PPOTrainer

    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 1
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = [{"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}]
    for compile_kernels in (False, True):
        r = run_bench("w1", iterations=3, threads=0, json_out=False, device="cuda", compile_kernels=compile_kernels)
        lines.append({"part": "w1", **r})
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(output_dir=tmp, iterations=20, seed=0)
        cfg.model.device, cfg.model.dtype = "cuda", "bfloat16"
        cfg.log.progress = cfg.log.tensorboard = False
        t = time.perf_counter()
        history = PPOTrainer(cfg).train()
        lines.append({"part": "train_smoke_bf16", "iterations": len(history), "seconds": round(time.perf_counter() - t, 1),
                      "score_first": history[0]["score"], "score_last": history[-1]["score"],
                      "gpu_peak_mem_mb": round(torch.cuda.max_memory_allocated() / 2**20)})
    with open(out_dir / "gpu_check.jsonl", "w") as f:
        for line in lines:
            print(json.dumps(line), flush=True)
            f.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
