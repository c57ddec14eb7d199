"""`ppo-lm train [--config FILE.yaml] [--section.field VALUE ...]`: PPO (or a critic-free estimator) on a
policy, a reward and prompts, as :class:`~ppo_lm.config.train.TrainConfig` declares them."""

from __future__ import annotations

from .main import _parse, _run


def cmd_train(argv: list[str]) -> int:
    from ..config.train import TrainConfig

    cfg = _parse(TrainConfig, argv, "ppo-lm train", "Train a policy with PPO (or GRPO/RLOO/REINFORCE++).",
                 resumable=True)

    def go():
        from ..trainer.ppo import PPOTrainer

        PPOTrainer(cfg).train()
        from ..runtime import distributed as dist

        if dist.is_main():
            print(f"done: {cfg.output_dir}")
        dist.destroy()

    return _run(go)
