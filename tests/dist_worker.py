"""Run under torchrun by test_distributed.py (also importable for the single-process reference).

``python -m torch.distributed.run --nproc-per-node 2 tests/dist_worker.py OUT_DIR`` runs one PPO
learning step on this rank's half of a fixed rollout and saves the updated weights from rank 0.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from trainer_helpers import length_reward, tiny_config  # noqa: E402

from ppo_lm.runtime import distributed as dist  # noqa: E402
from ppo_lm.trainer.ppo import PPOTrainer  # noqa: E402


def build(out_dir: str, critic: str = "separate", fsdp: bool = False, reward: str | None = None) -> PPOTrainer:
    """``reward``: a reward-model checkpoint (scores from it; the critic starts from it), else the
    length verifier."""
    cfg = tiny_config(out_dir, rollout__num_prompts=8, rollout__max_new_tokens=6, optim__epochs=2,
                      optim__num_minibatches=1, optim__micro_batch_size=2, critic__kind=critic, model__fsdp=fsdp)
    if reward:
        cfg.model.reward = reward
    cfg.threads = 1
    cfg.rollout.stop_tokens = list("0123456789")  # ~12% stop chance per step: varied lengths
    return PPOTrainer(cfg, verifier=None if reward else length_reward)  # a given verifier replaces model.reward


def save_reward_model(path: str) -> str:
    """A tiny one-label reward model with the built-in policy's architecture and tokenizer."""
    from ppo_lm.stages import build_reward_model_from_policy_config
    from ppo_lm.tasks.equations import build_tiny_policy
    from ppo_lm.trainer import roles

    cfg = tiny_config(path)
    policy = build_tiny_policy(roles.build_tokenizer(cfg.model), seed=5, hidden_size=cfg.model.builtin_hidden_size)
    build_reward_model_from_policy_config(policy.config, policy, seed=5).save_pretrained(path)
    return path


def fixed_rollout(tr: PPOTrainer):
    """The same 8-episode rollout in every process (fixed seed, no dependence on rank)."""
    tr.training.sample_gen.manual_seed(1234)
    plan = tr.source.plan
    tr.source.plan = dataclasses.replace(plan, rank=0, world=1)  # every process samples the full global batch
    batch = tr.rollout(1)
    tr.source.plan = plan
    return batch


def weights(tr: PPOTrainer) -> dict[str, torch.Tensor]:
    """Full weights (a collective under FSDP: every rank calls it; rank 0 gets them)."""
    from ppo_lm.models import sharding

    def full(m):
        return sharding.full_state(m) if sharding.is_sharded(m) else m.state_dict()

    out = {f"policy.{k}": v.detach().clone() for k, v in full(tr.models.policy).items()}
    if tr.models.critic is not None:
        out.update({f"critic.{k}": v.detach().clone() for k, v in full(tr.models.critic).items()})
    return out


def main() -> None:
    out_dir, critic, fsdp = sys.argv[1], sys.argv[2], sys.argv[3] == "fsdp"
    reward = sys.argv[4] if len(sys.argv) > 4 else None
    tr = build(out_dir, critic, fsdp, reward)
    batch = fixed_rollout(tr)
    B = batch.size
    r, w = dist.rank(), dist.world_size()
    share = batch.select(torch.arange(r * B // w, (r + 1) * B // w), trim=False)
    metrics = tr.learn(share, 1).metrics
    final = weights(tr)
    if dist.is_main():
        os.makedirs(out_dir, exist_ok=True)
        from ppo_lm.models.sharding import is_sharded

        reward_model = next((term.model for term in tr.models.rewards if term.model is not None), None)
        sharded = {"policy": is_sharded(tr.models.policy), "critic": is_sharded(tr.models.critic), "ref": is_sharded(tr.models.ref),
                   "reward_model": is_sharded(reward_model)}
        torch.save({"weights": final, "metrics": metrics, "sharded": sharded}, os.path.join(out_dir, "result.pt"))
    del tr  # the process group outlives every model that holds it
    dist.destroy()


if __name__ == "__main__":
    main()
