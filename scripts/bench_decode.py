"""The sampler alone on W1's/W4's random-init policy (docs/benchmarks.md, W4): prefill plus N decode
steps of B rows, with the decode weights packed for oneDNN (the default) and without (each call then
repacks them), alternated in one process.

Usage: python scripts/bench_decode.py [B] [N] [rounds] [threads]   (default 4 × 1024, 3 rounds, 2 threads)
Prints seconds per call of each variant per round, the ratio of medians and whether the tokens agree.
"""

import dataclasses
import statistics
import sys
import time

import torch
from transformers import Qwen2ForCausalLM

from ppo_lm.cli.bench_workloads import W1_SHAPE, qwen2_config
from ppo_lm.models import onednn
from ppo_lm.rollout.sample.sampling import SamplingParams, generate

B = int(sys.argv[1]) if len(sys.argv) > 1 else 4
N = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
torch.set_num_threads(int(sys.argv[4]) if len(sys.argv) > 4 else 2)

torch.manual_seed(0)
lm = Qwen2ForCausalLM(qwen2_config(dataclasses.replace(W1_SHAPE, response_len=N))).eval()
ids = torch.randint(4, 512, (B, 32))
mask = torch.ones_like(ids)
params = SamplingParams(max_new_tokens=N, min_new_tokens=N, temperature=1.0, stop_token_ids=(3,))
REORDER = onednn._REORDER  # None = what `pack` does where oneDNN cannot reorder: the unpacked weights


def run(packed: bool):
    onednn._REORDER = REORDER if packed else None
    t = time.perf_counter()
    out = generate(lm, ids, mask, params, pad_token_id=0, generator=torch.Generator().manual_seed(0))
    return time.perf_counter() - t, out.responses


run(False)
run(True)  # warm-up of both
times, same = {False: [], True: []}, True
for _ in range(ROUNDS):
    (t0, r0), (t1, r1) = run(False), run(True)
    times[False].append(t0)
    times[True].append(t1)
    same &= bool(torch.equal(r0, r1))
onednn._REORDER = REORDER
fmt = " ".join
print(f"B={B} N={N}: unpacked {fmt(f'{x:.3f}' for x in times[False])} s | packed "
      f"{fmt(f'{x:.3f}' for x in times[True])} s | ratio of medians "
      f"{statistics.median(times[True]) / statistics.median(times[False]):.2f} | same tokens {same}")
