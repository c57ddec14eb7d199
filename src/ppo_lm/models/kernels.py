"""The elementwise pieces of a Llama-family layer — RMSNorm, RoPE, SwiGLU — eager, or fused by
``torch.compile``.

In eager mode each is several full passes over its tensor (and as many again in the backward): memory
traffic that matters once the matmuls already run near the CPU's peak (docs/benchmarks.md).
Compiled, each becomes one loop forward and one backward. :func:`set_compiled` compiles them
(``dynamic=True``: one compile for all batch shapes, paid once at start-up and cached on disk by
inductor) and probes them on small inputs; if there is no working compiler it keeps the eager
versions and says why. Compiled RMSNorm sums in a different order (differences ≤ 2e-6 relative).
They serve the training forward and backward only (see :func:`_pick`); inputs smaller than
:data:`MIN_COMPILED_NUMEL` stay eager too, as the per-call overhead would exceed the work.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor

MIN_COMPILED_NUMEL = 1 << 16


def rms_norm_eager(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Qwen2RMSNorm / LlamaRMSNorm, same operation order (fp32 statistics). x (…, d), weight (d,)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rotate_eager(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE: x (B, L, heads, hd) · cos/sin (B, L, 1, hd) → x·cos + rotate_half(x)·sin."""
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin


def swiglu_eager(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) · up."""
    return F.silu(gate) * up


class _LeanSwiGLU(torch.autograd.Function):
    """silu(gate) · up saving gate and up only (eager autograd also keeps silu(gate), one more
    intermediate-wide activation per layer); the backward recomputes silu with the same kernels, so
    its gradients equal eager autograd's."""

    @staticmethod
    def forward(ctx, gate: Tensor, up: Tensor) -> Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, g: Tensor):
        gate, up = ctx.saved_tensors
        d_gate = torch.ops.aten.silu_backward(g * up, gate) if ctx.needs_input_grad[0] else None
        d_up = g * F.silu(gate) if ctx.needs_input_grad[1] else None
        return d_gate, d_up


def _swiglu_lean(gate: Tensor, up: Tensor) -> Tensor:
    return _LeanSwiGLU.apply(gate, up)


# The eager kernels under autograd: the same arithmetic with fewer saved activations. (An RMSNorm
# saving only its input was tried: it changes the order in which autograd sums the residual
# stream's gradients, so results moved by rounding — enough to tip a threshold test.)
_LEAN = {"swiglu": _swiglu_lean}

_compiled: dict[str, object] = {}


def _pick(name: str, x: Tensor):
    """The compiled kernel for training-size inputs under autograd, else None (eager). Forwards
    without autograd (scoring, decoding, the frozen models) stay eager: there the fused backward,
    most of the gain, does not exist, and each grad mode, inference mode, size-1 axis and stride
    pattern would be one more compiled variant (dynamo stops compiling a function after 8)."""
    if not _compiled or x.numel() < MIN_COMPILED_NUMEL or not (torch.is_grad_enabled() and x.requires_grad):
        return None
    return _compiled[name]


def _call(name: str, eager, x: Tensor, *args):
    """The compiled kernel when :func:`_pick` chooses it, else ``eager``. A compile that fails later
    (a new dtype or stride pattern needs one more) switches every kernel back to eager, with a warning,
    instead of stopping the run."""
    fn = _pick(name, x)
    if fn is None:
        if name in _LEAN and torch.is_grad_enabled() and (x.requires_grad or any(
                isinstance(a, Tensor) and a.requires_grad for a in args)):
            return _LEAN[name](x, *args)
        return eager(x, *args)
    try:
        return fn(x, *args)
    except Exception as e:  # noqa: BLE001 - compiler/toolchain failures: the eager kernel computes the same
        _compiled.clear()
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        warnings.warn(f"model.compile_kernels: compiling {name} failed ({first[:200]}); running the eager "
                      "kernels from here on", stacklevel=3)
        return eager(x, *args)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return _call("rms_norm", rms_norm_eager, x, weight, eps)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return _call("rotate", rotate_eager, x, cos, sin)


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    return _call("swiglu", swiglu_eager, gate, up)


def compiled() -> bool:
    return bool(_compiled)


def _probe(fns: dict[str, object], device: torch.device, dtype: torch.dtype) -> None:
    """Run every compiled kernel forward and backward on small inputs shaped like the lean forward's
    (3-d hidden states, a parameter as norm weight, 4-d heads) and compare with the eager kernels."""
    def randn(*shape):
        return torch.randn(*shape, device=device, dtype=dtype)

    h, gate, x = randn(2, 3, 8), randn(2, 3, 8), randn(2, 3, 4, 8)
    cos, sin, w = randn(2, 3, 1, 8), randn(2, 3, 1, 8), torch.nn.Parameter(randn(8))
    cases = [("rms_norm", rms_norm_eager, (h,), (w, 1e-6)), ("rotate", rotate_eager, (x,), (cos, sin)),
             ("swiglu", swiglu_eager, (gate, h), ())]
    for name, eager, diff_args, const_args in cases:
        args = [a.clone().requires_grad_() for a in diff_args]
        out = fns[name](*args, *const_args)
        out.sum().backward()
        # one compiled pass rounds once where eager rounds after each op: a few ulps of the dtype apart
        tol = max(1e-4, 4 * torch.finfo(dtype).eps)
        if not torch.allclose(out.detach(), eager(*diff_args, *const_args).detach(), atol=tol, rtol=tol):
            raise RuntimeError(f"the compiled {name} disagrees with its eager version")


def set_compiled(enabled: bool, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> bool:
    """Use ``torch.compile``-fused kernels (``enabled``) or the eager ones. Returns whether the
    compiled ones are in use: False when compiling fails (no C++ compiler / Triton), with a warning."""
    _compiled.clear()
    if not enabled:
        return False
    try:
        fns = {name: torch.compile(fn, dynamic=True)
               for name, fn in (("rms_norm", rms_norm_eager), ("rotate", rotate_eager), ("swiglu", swiglu_eager))}
        _probe(fns, torch.device(device), dtype)
    except Exception as e:  # noqa: BLE001 - any compiler/toolchain failure means: stay eager
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        warnings.warn(f"model.compile_kernels: torch.compile is not usable here ({first[:200]}); "
                      "running the eager kernels", stacklevel=2)
        return False
    _compiled.update(fns)
    return True
