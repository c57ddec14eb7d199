"""Micro-benchmark of ppo_lm.algorithms.gae / whiten on a (B, T) float32 batch.

Usage: python scripts/bench_gae.py [B] [T] [threads]. Prints the median of 21 runs in ms.
"""

import statistics
import sys
import time

import torch

from ppo_lm.algorithms import gae, whiten

B = int(sys.argv[1]) if len(sys.argv) > 1 else 256
T = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 2)
g = torch.Generator().manual_seed(0)
rewards, values = torch.randn(B, T, generator=g), torch.randn(B, T, generator=g)
lengths = torch.randint(1, T + 1, (B,), generator=g)
mask = torch.arange(T) < lengths[:, None]
terminated = torch.rand(B, generator=g) < 0.5
boot = torch.randn(B, generator=g)


def timed(fn, n=21):
    fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


ms_gae = timed(lambda: gae(rewards, values, mask, gamma=1.0, lam=0.95, terminated=terminated, bootstrap_values=boot))
ms_whiten = timed(lambda: whiten(rewards, mask))
print(f"gae B={B} T={T} float32: {ms_gae:.2f} ms (median of 21); whiten: {ms_whiten:.2f} ms")
