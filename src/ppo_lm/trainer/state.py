"""Trainer state that a checkpoint carries, and the save/load of a whole trainer."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file

from .. import distributed as dist
from . import checkpoint as ckpt
from .config_io import ConfigError

if TYPE_CHECKING:
    from .ppo import PPOTrainer


@dataclass
class TrainState:
    iteration: int = 0
    nonfinite_in_row: int = 0
    nonfinite_total: int = 0


def save_checkpoint(tr: PPOTrainer, output_dir: Path, iteration: int) -> Path | None:
    """Rank 0 writes policy, critic and trainer state atomically; other ranks wait."""
    tr.state.iteration = iteration
    final = None
    rng_per_rank = dist.all_gather_object(tr.rng_state())
    if dist.is_main():
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # keep the trainer's own progress bar readable
        tmp, final = ckpt.begin(output_dir, iteration)
        tr.policy.lm.save_pretrained(tmp / "policy", safe_serialization=True)
        tr.tokenizer.save_pretrained(tmp / "policy")
        if tr.critic is not None:
            tr.critic.model.save_pretrained(tmp / "critic", safe_serialization=True)
            tr.tokenizer.save_pretrained(tmp / "critic")
        if tr.policy.value_head is not None:
            save_file({k: v.contiguous() for k, v in tr.policy.value_head.state_dict().items()},
                      str(tmp / "value_head.safetensors"))
        u = tr.update_ctx
        torch.save({
            "state": asdict(tr.state),
            "actor_opt": u.actor_opt.state_dict(),
            "critic_opt": u.critic_opt.state_dict() if u.critic_opt else None,
            "actor_sched": u.actor_sched.state_dict(),
            "critic_sched": u.critic_sched.state_dict() if u.critic_sched else None,
            "kl_ctl": tr.kl_ctl.state_dict(),
            "rng": rng_per_rank,
        }, tmp / "trainer_state.pt")
        ckpt.commit(tmp, final, tr.cfg.log.keep_last)
    dist.barrier()
    return final


def load_checkpoint(tr: PPOTrainer, output_dir: Path) -> int:
    """Restore the latest checkpoint under ``output_dir``; returns its iteration (0 if none)."""
    found = ckpt.latest_checkpoint(output_dir)
    if found is None:
        return 0
    iteration, path = found
    st = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)
    policy_sd = load_file(str(path / "policy" / "model.safetensors"))
    _load_weights(tr.policy.lm, policy_sd, "policy")
    if tr.critic is not None:
        if not (path / "critic").is_dir():
            raise ConfigError(f"checkpoint {path} has no critic but this run uses a separate critic")
        _load_weights(tr.critic.model, load_file(str(path / "critic" / "model.safetensors")), "critic")
    if tr.policy.value_head is not None:
        tr.policy.value_head.load_state_dict(load_file(str(path / "value_head.safetensors")))
    u = tr.update_ctx
    u.actor_opt.load_state_dict(st["actor_opt"])
    u.actor_sched.load_state_dict(st["actor_sched"])
    if u.critic_opt is not None and st["critic_opt"] is not None:
        u.critic_opt.load_state_dict(st["critic_opt"])
        u.critic_sched.load_state_dict(st["critic_sched"])
    tr.kl_ctl.load_state_dict(st["kl_ctl"])
    if len(st["rng"]) != dist.world_size():
        raise ConfigError(
            f"checkpoint {path} was written by {len(st['rng'])} processes; resume with the same world size "
            f"(now {dist.world_size()})"
        )
    tr.set_rng_state(st["rng"][dist.rank()])
    tr.state.__dict__.update(st["state"])
    return iteration


def _load_weights(model: torch.nn.Module, sd: dict, name: str) -> None:
    own = model.state_dict()
    # save_pretrained drops tied duplicates; strict loading would then miss them.
    missing = [k for k in own if k not in sd]
    tied = {k for k in missing if "lm_head" in k or "embed" in k}
    if set(missing) - tied:
        raise ConfigError(f"checkpoint {name} weights do not match the model: missing {sorted(set(missing) - tied)[:5]}")
    model.load_state_dict(sd, strict=False)
