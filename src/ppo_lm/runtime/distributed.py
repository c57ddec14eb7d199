"""The one small helper through which ranks talk; a no-op in a single process.

Everything the trainer reduces across data-parallel ranks (whitening statistics, token counts for
loss normalisation, logged metrics, KL-controller input) goes through :func:`all_reduce_sum`.
"""

from __future__ import annotations

import gc
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from .lifetime import die_with_parent, launched_by_torchrun


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if is_initialized() else 0


def is_main() -> bool:
    return rank() == 0


def init_from_env(timeout_s: float = 600.0) -> bool:
    """Join the process group when launched by ``torchrun`` (WORLD_SIZE > 1); gloo on CPU, nccl on GPU.

    Returns True when running distributed.
    """
    if is_initialized():
        return True
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if launched_by_torchrun():
        # torchrun starts its ranks in sessions of their own: without this a killed launcher leaves them
        # training on, writing the folder a resumed run writes too
        die_with_parent()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    return True


def _all_reduce(t: torch.Tensor, op) -> torch.Tensor:
    if not is_initialized():
        return t
    out = t.detach().clone()  # a new tensor: the input is left untouched
    if out.device.type == "cpu" and dist.get_backend() == "nccl":
        # Counts and flags are built on the CPU; NCCL reduces only CUDA tensors.
        on_gpu = out.to(torch.device("cuda", torch.cuda.current_device()))
        dist.all_reduce(on_gpu, op=op)
        return on_gpu.cpu()
    dist.all_reduce(out, op=op)
    return out


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum ``t`` over ranks."""
    return _all_reduce(t, dist.ReduceOp.SUM)


def all_reduce_max(t: torch.Tensor) -> torch.Tensor:
    """Elementwise maximum of ``t`` over ranks."""
    return _all_reduce(t, dist.ReduceOp.MAX)


def barrier() -> None:
    if is_initialized():
        dist.barrier()


def destroy() -> None:
    """Leave the process group once every rank is done with it.

    The barrier: a rank that tears down its gloo pairs while a peer still has traffic in flight (rank
    0 gathering a full state dict, say) can abort the peer with ``terminate called``. The collection:
    models that are gone but sit in reference cycles (FSDP state) still hold the group; freed during
    interpreter shutdown instead, its worker threads can abort the process.
    """
    if is_initialized():
        dist.barrier()
        gc.collect()
        dist.destroy_process_group()


def all_gather_object(obj) -> list:
    """Every rank's ``obj``, in rank order, on every rank."""
    if not is_initialized():
        return [obj]
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out
