"""The eager SwiGLU under autograd (``ppo_lm.models.kernels``) keeps fewer activations for the backward
than autograd over the eager ops, with the same outputs and gradients; the allocator release."""

from __future__ import annotations

import platform
import sys

import pytest
import torch

from ppo_lm.models import kernels
from ppo_lm.runtime import memory
from ppo_lm.runtime.memory import release_free_memory


def _saved_bytes(fn, *args) -> tuple[torch.Tensor, int]:
    """fn(*args) and the bytes of the distinct tensors autograd saved for its backward."""
    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return out, sum(seen.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lean_swiglu_equals_eager_autograd_and_saves_less(dtype):
    g = torch.Generator().manual_seed(1)
    gate, up, upstream = (torch.randn(3, 5, 96, generator=g).to(dtype) for _ in range(3))
    results = []
    for fn in (kernels.swiglu, kernels.swiglu_eager):
        a, b = gate.clone().requires_grad_(), up.clone().requires_grad_()
        out, saved = _saved_bytes(fn, a, b)
        out.backward(upstream)
        results.append((out.detach(), a.grad, b.grad, saved))
    (o1, ga1, gb1, lean_saved), (o2, ga2, gb2, eager_saved) = results
    assert torch.equal(o1, o2) and torch.equal(ga1, ga2) and torch.equal(gb1, gb2)
    assert lean_saved < eager_saved  # silu(gate) is recomputed, not kept


def test_one_side_frozen_and_no_grad():
    """Only one input needing a gradient works, and without autograd the eager kernel runs."""
    gate, up = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    for i in (0, 1):
        args = [gate.clone(), up.clone()]
        args[i].requires_grad_()
        kernels.swiglu(*args).sum().backward()
        ref = [gate.clone(), up.clone()]
        ref[i].requires_grad_()
        kernels.swiglu_eager(*ref).sum().backward()
        assert torch.equal(args[i].grad, ref[i].grad)
    with torch.no_grad():
        assert torch.equal(kernels.swiglu(gate, up), kernels.swiglu_eager(gate, up))


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="malloc_trim is glibc's")
def test_release_free_memory_finds_malloc_trim_on_glibc():
    assert memory._TRIM is not None and release_free_memory() is True


def test_release_free_memory_is_false_without_malloc_trim(monkeypatch):
    monkeypatch.setattr(memory, "_TRIM", None)  # not glibc (macOS, musl)
    assert release_free_memory() is False


def test_release_free_memory_trims_every_arena(monkeypatch):
    """malloc_trim(0): pad 0 leaves only the minimum at the top of the heap (glibc trims every arena)."""
    calls = []
    monkeypatch.setattr(memory, "_TRIM", lambda pad: calls.append(pad) or 1)
    assert release_free_memory() is True and calls == [0]


def test_release_pays_by_model_size(monkeypatch):
    """Freed memory goes back before each update only for models above RELEASE_MIN_BYTES of parameters
    (trained or frozen, shared ones once): small models would re-fault the pages every update."""
    small = torch.nn.Linear(64, 64)
    frozen = torch.nn.Linear(64, 64).requires_grad_(False)
    size = sum(p.numel() * p.element_size() for p in small.parameters())
    assert not memory.release_pays(small, None)
    monkeypatch.setattr(memory, "RELEASE_MIN_BYTES", size)
    assert not memory.release_pays(small, small)  # a shared module counts once
    assert memory.release_pays(small, frozen)  # frozen parameters count too (a LoRA policy's base)


def test_the_update_trims_only_when_it_pays(tmp_path, monkeypatch):
    """A tiny built-in run does not call malloc_trim before its updates; with the threshold at 0 it does."""
    from trainer_helpers import tiny_config

    from ppo_lm.trainer.ppo import PPOTrainer

    calls = []
    monkeypatch.setattr(memory, "_TRIM", lambda pad: calls.append(pad) or 1)
    for threshold, expected in ((memory.RELEASE_MIN_BYTES, 0), (0, 1)):
        monkeypatch.setattr(memory, "RELEASE_MIN_BYTES", threshold)
        calls.clear()
        trainer = PPOTrainer(tiny_config(tmp_path / f"t{threshold}", iterations=1))
        assert trainer.training.learner.release_memory is bool(expected)
        trainer.train_iteration(1)
        assert len(calls) == expected
