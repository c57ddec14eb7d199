"""Data parallelism for the trained and frozen models: DDP or FSDP2 (``fully_shard``) wrapping,
gradient synchronisation and norms as the update loop needs them, and full-state-dict checkpoint
I/O for the trainable models.

Layout: every decoder layer of a model's body is its own FSDP unit, and the wrapper module the loop
calls (``PolicyModel`` / ``CriticModel``) is the root unit holding embeddings, final norm and heads.
Training and scoring forwards go through the root's ``forward``, so FSDP's hooks gather and free
parameters layer by layer. Generation calls the language model directly many times per rollout, so
:func:`gathered` unshards every unit once for the whole decode and reshards afterwards.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from .hf_compat import trunk


def _fsdp():
    try:
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
    except ImportError as e:  # torch < 2.6
        raise RuntimeError("model.fsdp needs torch >= 2.6 (torch.distributed.fsdp.fully_shard)") from e
    return FSDPModule, MixedPrecisionPolicy, fully_shard


def shard(root: nn.Module, hf_model: nn.Module, *, bf16: bool = False) -> None:
    """Apply ``fully_shard`` to each decoder layer of ``hf_model``'s body, then to ``root``."""
    _, MixedPrecisionPolicy, fully_shard = _fsdp()
    kw = {}
    if bf16:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    layers = getattr(trunk(hf_model), "layers", None)
    if layers is None:
        raise RuntimeError(f"model.fsdp: {type(hf_model).__name__} has no `layers` list to shard")
    for layer in layers:
        fully_shard(layer, **kw)
    fully_shard(root, **kw)


def is_sharded(module: nn.Module | None) -> bool:
    if module is None:
        return False
    FSDPModule = _fsdp()[0]
    return isinstance(module, FSDPModule)


@contextlib.contextmanager
def gathered(root: nn.Module):
    """All parameters of a sharded model unsharded for the duration (generation); no-op otherwise."""
    if not is_sharded(root):
        yield
        return
    FSDPModule = _fsdp()[0]
    # FSDP2 must see the root's forward before any layer's; a decode through transformers' forward
    # (models the lean path does not run, LoRA ones among them) calls the layers directly, so the
    # root's lazy initialisation is run first (idempotent)
    root._get_fsdp_state()._lazy_init()
    units = [m for m in root.modules() if isinstance(m, FSDPModule)]
    for m in units:
        m.unshard()
        m.set_reshard_after_forward(False, recurse=False)  # stay gathered across decode steps
    try:
        yield
    finally:
        for m in units:
            m.set_reshard_after_forward(True, recurse=False)
            m.reshard()


def frozen_mode(module: nn.Module | None):
    """Grad mode for a frozen model's forward: ``inference_mode``, or ``no_grad`` when it is sharded
    (FSDP writes the gathered parameters into its own buffers, which inference mode forbids)."""
    return torch.no_grad() if is_sharded(module) else torch.inference_mode()


def prepare_for_training(policy: nn.Module, critic: nn.Module | None, *, fsdp: bool, bf16: bool = False,
                         device: torch.device | None = None) -> tuple[nn.Module, nn.Module | None]:
    """Under torch.distributed, make the trained models data-parallel; returns the modules whose
    forward the update calls (the models themselves, or their DDP wrappers).

    ``fsdp``: shard policy and critic in place (call before their optimisers are built: sharding
    replaces the parameters). Otherwise DDP, which averages gradients over ranks in backward. A
    no-op in a single process.
    """
    import torch.distributed as tdist

    if not (tdist.is_available() and tdist.is_initialized()):
        return policy, critic
    if fsdp:
        shard(policy, policy.lm, bf16=bf16)
        if critic is not None:
            shard(critic, critic.model, bf16=bf16)
        return policy, critic
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [device.index] if device is not None and device.type == "cuda" else None
    # a shared critic's value head is unused on policy-only forwards (critic warm-up, no values)
    policy_fwd = DDP(policy, device_ids=ids, find_unused_parameters=getattr(policy, "value_head", None) is not None)
    return policy_fwd, (DDP(critic, device_ids=ids) if critic is not None else None)


def no_sync(*modules: nn.Module | None):
    """DDP's ``no_sync`` for every wrapped module (gradient accumulation: gradients are all-reduced
    once, on a minibatch's last micro-batch); a no-op for modules DDP does not wrap."""
    stack = contextlib.ExitStack()
    for m in modules:
        if m is not None and hasattr(m, "no_sync"):
            stack.enter_context(m.no_sync())
    return stack


def clip_grad_norm(params: list[nn.Parameter], max_norm: float) -> float:
    """Clip the gradients of ``params`` to a global norm of ``max_norm``; returns the norm before
    clipping (of the whole model under FSDP, whose norm is a DTensor), 0 without parameters."""
    if not params:
        return 0.0
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def _options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True, **kw)


def full_state(root: nn.Module) -> dict[str, torch.Tensor]:
    """Full (unsharded) state dict of a sharded ``root`` on rank 0 (empty elsewhere). A collective:
    every rank must call it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(root, options=_options())


def load_full_state(root: nn.Module, state: dict[str, torch.Tensor], *, strict: bool = True) -> None:
    """Load a full state dict (the same on every rank) into a sharded ``root``; ``strict=False`` for a
    part of its tensors (LoRA adapters)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(root, state, options=StateDictOptions(full_state_dict=True, strict=strict))


def full_optim_state(root: nn.Module, opt: torch.optim.Optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(root, opt, options=_options())


def load_full_optim_state(root: nn.Module, opt: torch.optim.Optimizer, state: dict) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(root, opt, optim_state_dict=state, options=StateDictOptions(full_state_dict=True))
