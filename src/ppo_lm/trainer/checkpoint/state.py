"""What a checkpoint carries — an explicit bundle of the run's state — and its save and load."""

from __future__ import annotations

import errno
import os
import random
import re
import shutil
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ...algorithms import AdaptiveKLController, FixedKLController
from ...models import lora, sharding
from ...rollout.trajectory import Trajectory, TrajectoryBatch
from ...runtime import distributed as dist
from ...runtime.errors import ConfigError, UserError
from ..learner import Learner
from . import folders as ckpt
from . import model_files as files


@dataclass
class TrainState:
    """Where the run is: the last finished iteration (the data position follows from it) and the
    count of skipped non-finite minibatch steps."""

    iteration: int = 0
    nonfinite_in_row: int = 0
    nonfinite_total: int = 0


@dataclass
class RngStreams:
    """The random streams a bit-exact resume restores: this rank's sampling and minibatch-shuffling
    generators, and the global torch, Python and NumPy states."""

    sample: torch.Generator
    shuffle: torch.Generator

    def state(self) -> dict:
        return {
            "sample_gen": self.sample.get_state(), "shuffle_gen": self.shuffle.get_state(),
            "torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state(),
        }

    def load(self, s: dict) -> None:
        self.sample.set_state(s["sample_gen"])
        self.shuffle.set_state(s["shuffle_gen"])
        torch.set_rng_state(s["torch"])
        random.setstate(s["python"])
        np.random.set_state(s["numpy"])


@dataclass
class RunState:
    """Everything a checkpoint saves and restores: the trained models, their optimisers and
    schedules (``learner``), the tokenizer saved beside the models, the KL controller, the random
    streams and the run's position."""

    learner: Learner
    tokenizer: object
    kl_ctl: FixedKLController | AdaptiveKLController
    rngs: RngStreams
    progress: TrainState
    pending: Callable[[], list[TrajectoryBatch]] = list
    """The source's batches sampled ahead and not yet taken (an asynchronous source's; docs/async.md)."""
    restored: list[TrajectoryBatch] = field(default_factory=list)
    """This rank's pending batches as the loaded checkpoint kept them."""


def _prefixed(sd: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}


def save_checkpoint(run: RunState, output_dir: Path, iteration: int, keep_last: int) -> Path | None:
    """Rank 0 writes policy, critic and trainer state atomically, keeping the last ``keep_last``
    checkpoints; other ranks wait. A failed write (a full disk, say) leaves no partial directory and
    the previous checkpoint as it was, and raises :class:`CheckpointWriteError` on every rank.

    With FSDP the full (unsharded) weights and optimiser states are gathered first, so the
    checkpoint has the same layout either way and loads with plain transformers.
    """
    run.progress.iteration = iteration
    final = None
    u = run.learner
    policy, critic = u.policy, u.critic
    rng_per_rank = dist.all_gather_object(run.rngs.state())
    pending_per_rank = dist.all_gather_object([asdict(b) for b in run.pending()])
    fsdp = sharding.is_sharded(policy)
    if fsdp:  # collectives: every rank takes part
        policy_full = sharding.full_state(policy)
        critic_full = sharding.full_state(critic) if critic is not None else {}
        actor_opt = sharding.full_optim_state(policy, u.actor_opt)
        critic_root = critic if critic is not None else policy
        critic_opt = sharding.full_optim_state(critic_root, u.critic_opt) if u.critic_opt else None
    else:
        policy_full = {f"lm.{k}": v for k, v in policy.lm.state_dict().items()}
        if policy.value_head is not None:
            policy_full.update({f"value_head.{k}": v for k, v in policy.value_head.state_dict().items()})
        critic_full = {f"model.{k}": v for k, v in critic.model.state_dict().items()} if critic else {}
        actor_opt = u.actor_opt.state_dict()
        critic_opt = u.critic_opt.state_dict() if u.critic_opt else None
    failure = None
    if dist.is_main():
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # keep the trainer's own progress bar readable
        tmp = None
        try:
            tmp, final = ckpt.begin(output_dir, iteration)
            files.save_model(policy.lm, tmp / "policy", _prefixed(policy_full, "lm."))
            run.tokenizer.save_pretrained(tmp / "policy")
            ckpt.kill_point("policy", iteration)
            if critic is not None:
                files.save_model(critic.model, tmp / "critic", _prefixed(critic_full, "model."))
                run.tokenizer.save_pretrained(tmp / "critic")
                ckpt.kill_point("critic", iteration)
            if policy.value_head is not None:
                save_file({k: v.contiguous() for k, v in _prefixed(policy_full, "value_head.").items()},
                          str(tmp / "value_head.safetensors"))
            with open(tmp / "trainer_state.pt", "wb") as fh:  # a file object: a failed write keeps its OSError
                torch.save({
                    "state": asdict(run.progress),
                    "fsdp": fsdp,
                    "actor_opt": actor_opt,
                    "critic_opt": critic_opt,
                    "actor_sched": u.actor_sched.state_dict(),
                    "critic_sched": u.critic_sched.state_dict() if u.critic_sched else None,
                    "kl_ctl": run.kl_ctl.state_dict(),
                    "rng": rng_per_rank,
                    "pending": pending_per_rank,
                    "lora_base": files.frozen_bases({
                        "policy": (policy.lm, _prefixed(policy_full, "lm.")),
                        "critic": (critic.model if critic else None, _prefixed(critic_full, "model."))}),
                }, fh)
            ckpt.kill_point("trainer_state", iteration)
            ckpt.commit(tmp, final, keep_last)
        except Exception as e:
            if (cause := _write_failure(e)) is None:
                raise
            failure = _write_failure_message(output_dir, iteration, *cause)
        finally:
            if tmp is not None:  # gone once committed; after a failure, no half-written directory stays
                shutil.rmtree(tmp, ignore_errors=True)
    failures = dist.all_gather_object(failure)  # every rank stops when rank 0 could not write
    if failures[0] is not None:
        raise CheckpointWriteError(failures[0])
    return final


class CheckpointWriteError(UserError):
    """A checkpoint could not be written (a full disk, a quota, a failing device); the previous
    checkpoint is kept as it was, and the run stops."""


def _write_failure(e: BaseException) -> tuple[int | None, str] | None:
    """(errno, what went wrong) when ``e`` is a failed write: an ``OSError``, or an error that torch's
    or safetensors' writer raised over one (safetensors' says "... (os error 28)"). None otherwise:
    a bug keeps its traceback."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError):
            return e.errno, e.strerror or str(e)
        if m := re.search(r"\(os error (\d+)\)", str(e)):
            return int(m.group(1)), os.strerror(int(m.group(1)))
        e = e.__cause__ or e.__context__
    return None


def _write_failure_message(output_dir: Path, iteration: int, code: int | None, reason: str) -> str:
    where = str(ckpt.checkpoint_dir(output_dir))
    fix = "free space" if code in (errno.ENOSPC, errno.EDQUOT) else "fix that"
    for i, path in reversed(ckpt.list_checkpoints(output_dir)):
        if i < iteration and ckpt.verify(path) is None:
            return (f"could not write checkpoint {iteration} to {where!r}: {reason}; the previous checkpoint "
                    f"(iteration {i}) is intact; {fix} and resume with --resume")
    return (f"could not write checkpoint {iteration} to {where!r}: {reason}; there is no earlier intact "
            f"checkpoint; {fix} and start the run again in a new --output-dir")


class DamagedCheckpointError(UserError, ValueError):
    """A checkpoint's files are incomplete, corrupt, or hold more than tensors and plain values."""


def _numpy_array_types() -> list:
    """What a pickled NumPy array (the NumPy RNG state) is rebuilt from: data, no code."""
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
    return [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def read_trainer_state(path: Path) -> dict:
    """``trainer_state.pt`` unpickled with ``weights_only``: tensors, plain Python values and NumPy
    arrays only, so a checkpoint from elsewhere cannot run code on resume."""
    import pickle

    try:
        with torch.serialization.safe_globals(_numpy_array_types()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise DamagedCheckpointError(
            f"{path.name} holds objects other than tensors and plain values, which ppo-lm does not unpickle "
            f"({str(e).splitlines()[-1][:200]})") from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise DamagedCheckpointError(f"{path.name} is unreadable ({str(e).splitlines()[0][:200]})") from None


def _read(path: Path, run: RunState) -> tuple[dict, dict, dict]:
    """Every file of the checkpoint at ``path``, read and checked before anything is restored:
    (trainer state, policy state dict, critic state dict). Raises :class:`DamagedCheckpointError`
    for damage, ``ConfigError`` for a checkpoint of another kind of run."""
    # (a checkpoint written before manifests has none: its files are checked by reading them)
    if (path / ckpt.MANIFEST).exists() and (problem := ckpt.verify(path)) is not None:
        raise DamagedCheckpointError(problem)
    policy, critic = run.learner.policy, run.learner.critic
    try:
        st = read_trainer_state(path / "trainer_state.pt")
        full = {f"lm.{k}": v for k, v in files.load_model(path / "policy", policy.lm).items()}
        if policy.value_head is not None:
            full.update({f"value_head.{k}": v for k, v in load_file(str(path / "value_head.safetensors")).items()})
        critic_full = {}
        if critic is not None and (path / "critic").is_dir():
            critic_full = {f"model.{k}": v for k, v in files.load_model(path / "critic", critic.model).items()}
    except DamagedCheckpointError:
        raise
    except (OSError, ValueError, RuntimeError) as e:  # safetensors' errors included
        raise DamagedCheckpointError(f"a weights file is unreadable ({str(e).splitlines()[0][:200]})") from None
    if len(st["rng"]) != dist.world_size():
        raise ConfigError(
            f"checkpoint {path} was written by {len(st['rng'])} processes; resume with the same world size "
            f"(now {dist.world_size()})"
        )
    if st.get("fsdp", False) != sharding.is_sharded(policy):
        raise ConfigError(f"checkpoint {path} was written with model.fsdp={st.get('fsdp')}; resume with the same")
    files.check_keys(policy.lm, _prefixed(full, "lm."), "policy")
    if critic is not None:
        if not critic_full:
            raise ConfigError(f"checkpoint {path} has no critic but this run uses a separate critic")
        files.check_keys(critic.model, _prefixed(critic_full, "model."), "critic")
    files.check_frozen_bases(path, st.get("lora_base") or {},
                             {"policy": policy.lm, "critic": critic.model if critic else None})
    return st, full, critic_full


def load_checkpoint(run: RunState, output_dir: Path) -> int:
    """Restore the newest intact checkpoint under ``output_dir`` into ``run``; returns its iteration
    (0 if there is none). A damaged newer checkpoint is skipped with a warning naming it; when every
    checkpoint is damaged, :class:`DamagedCheckpointError` says why."""
    found = ckpt.list_checkpoints(output_dir)
    damaged = []
    for iteration, path in reversed(found):
        try:
            st, full, critic_full = _read(path, run)
        except DamagedCheckpointError as e:
            damaged.append(f"{path}: {e}")
            warnings.warn(f"checkpoint {path} is damaged ({e}); trying an older one", stacklevel=2)
            continue
        _apply(run, st, full, critic_full)
        return iteration
    if damaged:
        raise DamagedCheckpointError("no intact checkpoint to resume from: " + "; ".join(damaged))
    return 0


def _apply(run: RunState, st: dict, full: dict, critic_full: dict) -> None:
    u = run.learner
    policy, critic = u.policy, u.critic
    if sharding.is_sharded(policy):
        sharding.load_full_state(policy, full, strict=not lora.has_adapters(policy.lm))
        if critic is not None:
            sharding.load_full_state(critic, critic_full, strict=not files.partial(critic.model))
        sharding.load_full_optim_state(policy, u.actor_opt, st["actor_opt"])
        if u.critic_opt is not None and st["critic_opt"] is not None:
            sharding.load_full_optim_state(critic if critic is not None else policy, u.critic_opt,
                                           st["critic_opt"])
    else:
        policy.load_state_dict(full, strict=False)
        if critic is not None:
            critic.load_state_dict(critic_full, strict=False)
        u.actor_opt.load_state_dict(st["actor_opt"])
        if u.critic_opt is not None and st["critic_opt"] is not None:
            u.critic_opt.load_state_dict(st["critic_opt"])
    u.actor_sched.load_state_dict(st["actor_sched"])
    if u.critic_sched is not None and st["critic_sched"] is not None:
        u.critic_sched.load_state_dict(st["critic_sched"])
    run.kl_ctl.load_state_dict(st["kl_ctl"])
    run.rngs.load(st["rng"][dist.rank()])
    run.restored = [_batch(b) for b in st.get("pending", [[]] * dist.world_size())[dist.rank()]]
    run.progress.__dict__.update(st["state"])


def _batch(d: dict) -> TrajectoryBatch:
    return TrajectoryBatch(**{**d, "trajectories": [Trajectory(**t) for t in d["trajectories"]]})
