"""RMSNorm / RoPE / SwiGLU: the torch.compile-fused kernels equal the eager ones (values and
gradients), the lean forward with them still equals transformers, and a broken compiler falls back."""

from __future__ import annotations

import pytest
import torch
from test_perf_equivalence import check_policy_matches_transformers

from ppo_lm.models import kernels


@pytest.fixture
def compiled(monkeypatch):
    """Compiled kernels for every input size, eager again afterwards."""
    monkeypatch.setattr(kernels, "MIN_COMPILED_NUMEL", 0)
    assert kernels.set_compiled(True)
    yield
    kernels.set_compiled(False)


def _inputs(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


@pytest.mark.parametrize("B,L", [(3, 5), (2, 17)])  # two shapes: one compile (dynamic) serves both
def test_compiled_kernels_match_eager(compiled, B, L):
    h, w = _inputs((B, L, 16), 0), _inputs((16,), 1)
    x, cos, sin = _inputs((B, L, 4, 8), 2), _inputs((B, L, 1, 8), 3), _inputs((B, L, 1, 8), 4)
    gate, up = _inputs((B, L, 16), 5), _inputs((B, L, 16), 6)
    cases = [
        (kernels.rms_norm, kernels.rms_norm_eager, (h, w), (1e-6,)),
        (kernels.rotate, kernels.rotate_eager, (x,), (cos, sin)),
        (kernels.swiglu, kernels.swiglu_eager, (gate, up), ()),
    ]
    for fused, eager, diff_args, const_args in cases:
        results = []
        for fn in (fused, eager):
            args = [a.clone().requires_grad_() for a in diff_args]
            out = fn(*args, *const_args)
            out.backward(torch.ones_like(out) + out.detach())  # a non-uniform upstream gradient
            results.append([out.detach()] + [a.grad for a in args])
        for a, b in zip(*results):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_lean_forward_with_compiled_kernels_matches_transformers(compiled):
    check_policy_matches_transformers()


def test_compiled_kernels_serve_autograd_forwards_only(compiled):
    x = torch.randn(2, 3, 16, requires_grad=True)
    assert kernels._pick("swiglu", x) is not None
    assert kernels._pick("swiglu", x.detach()) is None  # a frozen model's input
    with torch.no_grad():
        assert kernels._pick("swiglu", x) is None
    with torch.inference_mode():
        assert kernels._pick("swiglu", torch.randn(2, 3, 16)) is None


def test_unusable_compiler_falls_back_to_eager(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(torch, "compile", broken)
    with pytest.warns(UserWarning, match="model.compile_kernels.*no C\\+\\+ compiler"):
        assert kernels.set_compiled(True) is False
    assert not kernels.compiled()
    x = torch.randn(2, 3, 16)
    assert torch.equal(kernels.swiglu(x, x), kernels.swiglu_eager(x, x))


def test_trainer_option_turns_compiled_kernels_on_and_off(tmp_path):
    from trainer_helpers import length_reward, tiny_config

    from ppo_lm.trainer.ppo import PPOTrainer

    try:
        tr = PPOTrainer(tiny_config(tmp_path / "on", model__compile_kernels=True), verifier=length_reward)
        assert kernels.compiled()
        metrics = tr.train_iteration(1).metrics
        assert all(v == v for v in metrics.values())  # finite-or-inf, never NaN
        PPOTrainer(tiny_config(tmp_path / "off"), verifier=length_reward)
        assert not kernels.compiled()
    finally:
        kernels.set_compiled(False)


def test_bf16_probe_accepts_one_rounding_instead_of_several(monkeypatch):
    """A fused kernel rounds once where eager bf16 rounds after each op; the probe must accept that
    (it refused every bf16 compile, blaming the compiler)."""
    import torch

    from ppo_lm.models import kernels

    def fused_like(fn, dynamic=True):  # stand-in for torch.compile: compute in fp32, round once
        def run(*args):
            up = [a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args]
            return fn(*up).to(args[0].dtype)
        return run

    monkeypatch.setattr(torch, "compile", fused_like)
    try:
        assert kernels.set_compiled(True, "cpu", torch.bfloat16)
    finally:
        kernels.set_compiled(False)


def test_a_later_compile_failure_falls_back_to_eager():
    import pytest
    import torch

    from ppo_lm.models import kernels

    def broken(*args):
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

    kernels._compiled.update(rms_norm=broken, rotate=broken, swiglu=broken)
    try:
        gate = torch.randn(4, 128, 256, requires_grad=True)  # big enough for the compiled path
        up = torch.randn(4, 128, 256)
        with pytest.warns(UserWarning, match="compiling swiglu failed .*No working C"):
            out = kernels.swiglu(gate, up)
        torch.testing.assert_close(out, kernels.swiglu_eager(gate, up))
        assert not kernels.compiled()  # eager from here on
    finally:
        kernels.set_compiled(False)
