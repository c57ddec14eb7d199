"""The host's fp32 matmul peak: what a speed figure has to be read against.

The same code runs at very different speeds on CPUs that report the same model name (two 2-core "AMD
EPYC" hosts differed by over 2× in oneDNN's fp32 kernels; docs/benchmarks.md "Hosts"), so a
throughput or a ratio to another library only means something beside the matmul speed of the host it
was measured on. This measures it two ways, because the package's matmuls take both: through oneDNN
(``torch.ops.mkldnn._linear_pointwise``, the path of ``models/onednn.py``) and through the BLAS behind
``F.linear`` (MKL in torch's x86 wheels).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

import torch
import torch.nn.functional as F

REFERENCE = 2048  # the square size of the figures in docs/benchmarks.md, comparable across hosts


class MatmulShape(NamedTuple):
    """y (rows, out) = x (rows, inner) · Wᵀ, W (out, inner): a linear layer over ``rows`` tokens."""

    rows: int
    inner: int
    out: int

    @property
    def flops(self) -> int:
        return 2 * self.rows * self.inner * self.out  # one multiply and one add per term


def gflop_per_s(flops: float, seconds: float) -> float:
    return flops / seconds / 1e9


def _onednn() -> Callable | None:
    """oneDNN's fp32 linear where this torch build has it (not through models/, a layer above)."""
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        op = torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):
        return None
    return lambda x, w: op(x, w, None, "none", [], "")


def backends() -> dict[str, Callable]:
    """The matmul paths to time, by name: ``onednn`` (where available) and ``blas``."""
    out = {"blas": F.linear}
    onednn = _onednn()
    if onednn is not None:
        out = {"onednn": onednn, **out}
    return out


def best_seconds(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """The fastest of ``repeats`` calls after ``warmup``: the host's speed, not its neighbours' noise."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def measure(shapes: Iterable[MatmulShape], threads: int, repeats: int = 3) -> dict[str, float]:
    """GFLOP/s of each backend over ``shapes`` on ``threads`` intra-op threads: the shapes' FLOPs over
    the sum of their best times (a FLOP-weighted mean, so the large shapes count most, as in training).
    Restores the thread count it found."""
    shapes = list(shapes)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        data = [(torch.randn(s.rows, s.inner, generator=gen), torch.randn(s.out, s.inner, generator=gen))
                for s in shapes]
        out = {}
        with torch.inference_mode():
            for name, fn in backends().items():
                seconds = sum(best_seconds(lambda x=x, w=w, fn=fn: fn(x, w), repeats) for x, w in data)
                out[name] = gflop_per_s(sum(s.flops for s in shapes), seconds)
        return out
    finally:
        torch.set_num_threads(before)


def decoder_shapes(rows: int, hidden: int, intermediate: int, kv_width: int) -> list[MatmulShape]:
    """A decoder layer's matmuls over ``rows`` tokens: q and o (hidden wide), k and v (``kv_width``),
    the MLP's gate and up (hidden → intermediate) and down (intermediate → hidden)."""
    return [MatmulShape(rows, hidden, hidden), MatmulShape(rows, hidden, kv_width),
            MatmulShape(rows, hidden, kv_width), MatmulShape(rows, hidden, hidden),
            MatmulShape(rows, hidden, intermediate), MatmulShape(rows, hidden, intermediate),
            MatmulShape(rows, intermediate, hidden)]


def host_peak(shapes: Iterable[MatmulShape], threads: int, repeats: int = 3) -> dict[str, float]:
    """The host's fp32 peak, flat for a results table: ``peak_<backend>_gflop_per_s`` at the workload's
    ``shapes`` and ``peak_<backend>_gflop_per_s_2048`` at the reference square product. Unrounded: on a
    busy host a tiny workload's figure can be a small fraction of a GFLOP/s."""
    square = MatmulShape(REFERENCE, REFERENCE, REFERENCE)
    at_shapes = measure(shapes, threads, repeats)
    at_square = measure([square], threads, repeats)
    return {**{f"peak_{k}_gflop_per_s": v for k, v in at_shapes.items()},
            **{f"peak_{k}_gflop_per_s_{REFERENCE}": v for k, v in at_square.items()}}
