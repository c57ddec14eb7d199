"""``ppo-lm bench``'s flags (each the :class:`~ppo_lm.cli.bench.BenchRun` field of its name) and their
checks: a value the run cannot take is one line naming the flag, before anything is built."""

from __future__ import annotations

import argparse

from ..config.critics import SELECTABLE
from .bench_workloads import SEPARATE, CriticSetup, w4_shape


def parser():
    """The flags of ``ppo-lm bench`` (each the :class:`BenchRun` field of its name)."""
    from ..runtime.errors import ArgumentParser

    ap = ArgumentParser(prog="ppo-lm bench", description="Throughput of the PPO trainer on the "
                        "benchmark workloads W1 (fixed 64-token responses), W2 (early stops), W3 (a real "
                        "model given by --policy, e.g. SmolLM2-135M-Instruct) and W4 (W1 with long responses).")
    ap.add_argument("--workload", choices=["w1", "w2", "w3", "w4"], default="w1")
    ap.add_argument("--policy", default=None, metavar="PATH",
                    help="W3 only: the policy, a .gguf file or a save_pretrained directory")
    ap.add_argument("--response-length", type=int, default=None, metavar="N",
                    help="W4 only: sampled tokens per response (default 1024); 4096 // N prompts keep W1's "
                         "4096 tokens per iteration (64 is W1)")
    ap.add_argument("--iterations", type=int, default=3, help="timed iterations (after --warmup)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed iterations first")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--json", action="store_true", help="print one JSON line")
    ap.add_argument("--compare-hf-generate", action="store_true",
                    help="also time transformers' model.generate against ppo-lm's sampler on the same batch")
    ap.add_argument("--compile-kernels", action="store_true",
                    help="model.compile_kernels: fuse RMSNorm/RoPE/SwiGLU with torch.compile (compile time is in "
                         "build_s and warmup_s)")
    ap.add_argument("--logp-from-sampler", action="store_true",
                    help="rollout.logp_from_sampler: logp_old from the decode logits (no policy scoring forward)")
    ap.add_argument("--cpu-lanes", type=int, default=None,
                    help="model.cpu_lanes (default: auto, two lanes, one when policy and critic train more than "
                         "64 M fp32 parameters): threads that each update/score a share of the rows")
    ap.add_argument("--lora-r", type=int, default=0,
                    help="model.lora_r: train LoRA adapters of this rank on every linear layer (0: every weight)")
    ap.add_argument("--micro-batch-size", type=int, default=None, metavar="N",
                    help="optim.micro_batch_size: sequences per forward/backward within a minibatch (0: the "
                         "whole minibatch; default: the library's auto, config/sizing.py)")
    ap.add_argument("--max-staleness", type=int, default=0, metavar="K",
                    help="rollout.max_staleness: a producer process samples up to K updates ahead, with the tis "
                         "correction (docs/async.md); 0: synchronous")
    ap.add_argument("--producer-threads", type=int, default=None, metavar="N",
                    help="rollout.producer_threads with --max-staleness (default: auto)")
    ap.add_argument("--estimator", choices=["gae", "reinforce++"], default="gae",
                    help="gae (the workloads' definition) or reinforce++: the same work without a critic")
    ap.add_argument("--critic", choices=list(SELECTABLE), default=SEPARATE.kind,
                    help="critic.kind: a separate critic (the workloads' definition, from the reward model), a "
                         "value head on the policy, or a value head on the reward model's frozen body")
    ap.add_argument("--critic-lora-r", type=int, default=None, metavar="N",
                    help="critic.lora_r: LoRA adapters of rank N on the separate critic's frozen body")
    ap.add_argument("--critic-epochs", type=int, default=None, metavar="N",
                    help="critic.epochs: the critic's passes over each rollout (default: the policy's 4)")
    ap.add_argument("--device", default="cpu", help="cpu (W1's definition) or cuda / cuda:N")
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # smoke tests only
    return ap


def check(args) -> None:
    """A flag's value the run cannot take, as a UsageError naming it, before anything is built."""
    from ..runtime.errors import ConfigError, UsageError
    from ..trainer.roles import resolve_device

    for flag, value, low in (("--iterations", args.iterations, 1), ("--warmup", args.warmup, 0),
                             ("--threads", args.threads, 0)):
        if value < low:
            raise UsageError(f"{flag} must be >= {low}, got {value}")
    if args.cpu_lanes is not None and args.cpu_lanes < 1:
        raise UsageError(f"--cpu-lanes must be >= 1, got {args.cpu_lanes}")
    if args.lora_r < 0:
        raise UsageError(f"--lora-r must be >= 0, got {args.lora_r}")
    if args.max_staleness < 0:
        raise UsageError(f"--max-staleness must be >= 0, got {args.max_staleness}")
    if args.producer_threads is not None and (args.producer_threads < 1 or not args.max_staleness):
        raise UsageError("--producer-threads takes a number >= 1, with --max-staleness >= 1")
    if args.micro_batch_size is not None and args.micro_batch_size < 0:
        raise UsageError(f"--micro-batch-size must be >= 0, got {args.micro_batch_size}")
    if args.response_length is not None:
        if args.workload != "w4":
            raise UsageError(f"--response-length is for --workload w4; {args.workload} has its own")
        try:
            w4_shape(args.response_length, args.tiny)
        except ValueError as e:
            raise UsageError(f"--response-length {e}") from None
    if args.workload == "w3" and args.policy is None:
        raise UsageError("--workload w3 needs --policy PATH (a .gguf file, e.g. SmolLM2-135M-Instruct's, or a "
                         "save_pretrained model directory)")
    if args.workload != "w3" and args.policy is not None:
        raise UsageError(f"--policy is for --workload w3; {args.workload} builds its own models")
    if args.policy is not None:
        from ..models.loading import check_model_dir

        check_model_dir(args.policy, "--policy", "causal-lm")  # a bad path fails before anything loads
    try:
        resolve_device(args.device)  # before building anything
    except ConfigError as e:
        raise UsageError(str(e).replace("`model.device`", "--device")) from None


def critic_setup(args) -> CriticSetup:
    """The --estimator/--critic/--critic-lora-r/--critic-epochs flags as a :class:`CriticSetup`, or a
    UsageError naming the flag that does not fit."""
    from ..runtime.errors import UsageError

    for flag, value in (("--critic-lora-r", args.critic_lora_r), ("--critic-epochs", args.critic_epochs)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    setup = CriticSetup(args.estimator, args.critic, args.critic_lora_r, args.critic_epochs)
    if not setup.has_critic and (args.critic != SEPARATE.kind or args.critic_lora_r or args.critic_epochs):
        raise UsageError(f"--estimator {args.estimator} has no critic; leave out --critic, --critic-lora-r and "
                         "--critic-epochs")
    if args.critic_lora_r and "critic.lora_r" not in setup.critic_kind.settings:
        raise UsageError(f"--critic-lora-r puts adapters on a separate critic; --critic is {args.critic}")
    return setup
