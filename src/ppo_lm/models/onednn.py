"""fp32 CPU matmuls through oneDNN: on some x86 CPUs (AVX-512 AMD EPYC, for one) oneDNN runs the
mid-sized shapes of the lean forward faster than the MKL sgemm behind ``F.linear`` (docs/benchmarks.md).
Same fp32 arithmetic, different summation blocking. ``PPO_LM_ONEDNN=0`` turns it off.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import Tensor


def _mkldnn_op(name: str):
    """``torch.ops.mkldnn.<name>`` when this torch build has it and oneDNN is on, else None:
    ``_linear_pointwise`` is the fp32 matmul, ``_reorder_linear_weight`` a weight into oneDNN's
    blocked layout."""
    if os.environ.get("PPO_LM_ONEDNN", "1") == "0" or not torch.backends.mkldnn.is_available():
        return None
    try:
        return getattr(torch.ops.mkldnn, name)
    except (AttributeError, RuntimeError):
        return None


_ONEDNN = _mkldnn_op("_linear_pointwise")
# oneDNN keeps a primitive per distinct shape: callers keep the number of shapes small (trimmed
# widths in steps of 16, decode batches in steps of 8 rows). Below 32 rows MKL is as fast or faster.
_ONEDNN_MIN_ROWS = 32


# The weight gradient gᵀ x through oneDNN where both widths lie in [MIN, MAX]: faster than MKL's sgemm
# at the lean forward's shapes, slower at the built-in model's 64 wide (docs/benchmarks.md has the
# figures and their hosts), whose runs keep the default BLAS and with it their numbers. Above MAX (a
# vocabulary-wide head) the transposed copy of the gradient oneDNN needs would add to peak memory.
_ONEDNN_MIN_GRAD_WIDTH = 128
_ONEDNN_MAX_GRAD_WIDTH = 16384


class _OneDNNLinear(torch.autograd.Function):
    """y = x Wᵀ + b with oneDNN for the forward, the input gradient, and the weight gradient of
    layers :data:`_ONEDNN_MIN_GRAD_WIDTH` to :data:`_ONEDNN_MAX_GRAD_WIDTH` wide in and out (others:
    the default BLAS)."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return _ONEDNN(x, w, b, "none", [], "")

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, w = ctx.saved_tensors
        gx = _ONEDNN(grad, w.t(), None, "none", [], "") if ctx.needs_input_grad[0] else None
        g2, x2 = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])
        gw = None
        if ctx.needs_input_grad[1]:
            narrow, wide = sorted((g2.shape[1], x2.shape[1]))
            wide = narrow >= _ONEDNN_MIN_GRAD_WIDTH and wide <= _ONEDNN_MAX_GRAD_WIDTH
            gw = _ONEDNN(g2.t().contiguous(), x2.t(), None, "none", [], "") if wide else g2.t() @ x2
        gb = g2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb


_REORDER = _mkldnn_op("_reorder_linear_weight") if _ONEDNN is not None else None


def pack(w: Tensor, rows: int) -> Tensor:
    """``w`` (out, in) reordered once into oneDNN's blocked layout for inputs of about ``rows`` rows,
    for many no-grad calls of :func:`linear` while the weight stays as it is (decoding): an unpacked
    weight is reordered inside every call, which at a few rows costs more than the product (see
    docs/benchmarks.md). Returns ``w`` itself where :func:`linear` would not use oneDNN (GPU, other
    dtypes, ``PPO_LM_ONEDNN=0``)."""
    if _REORDER is None or w.device.type != "cpu" or w.dtype != torch.float32:
        return w
    return _REORDER(w.detach().contiguous(), max(int(rows), 1))


def linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """``F.linear`` (x (…, in), w (out, in), b (out,) → (…, out)). For fp32 on CPU it runs through
    oneDNN, which on some x86 CPUs (AVX-512 AMD EPYC, for one) runs these mid-sized shapes faster
    than the MKL sgemm behind ``F.linear`` (docs/benchmarks.md has measurements); same fp32
    arithmetic, different summation blocking.
    ``PPO_LM_ONEDNN=0`` turns this off. A weight from :func:`pack` (no grad) always runs through oneDNN."""
    if w.is_mkldnn:
        return _ONEDNN(x, w, b, "none", [], "")
    if (_ONEDNN is None or x.device.type != "cpu" or x.dtype != torch.float32 or w.dtype != torch.float32
            or x.numel() < _ONEDNN_MIN_ROWS * x.shape[-1]):
        return F.linear(x, w, b)
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)):
        return _OneDNNLinear.apply(x, w, b)
    return _ONEDNN(x, w, b, "none", [], "")
