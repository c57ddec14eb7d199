"""Command line: ``ppo-lm COMMAND ...``; :data:`COMMANDS` below lists them (train, sft, rm, demo, compare,
plot, report, export, bench) with where each lives, imported only when run.

The training commands read ``[--config FILE.yaml] [--section.field VALUE ...]``. Precedence: dataclass
defaults < YAML file given by ``--config`` < flags. Flags mirror the config nesting with dashes:
``--algo.gae-lambda 0.9``, ``--rollout.max-new-tokens 16``, ``--resume``.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
_python_format_warning = warnings.formatwarning


def _parse(cls: type, argv: list[str], prog: str, description: str, *, resumable: bool = False):
    """``cls`` from defaults < ``--config`` < flags. ``resumable``: with ``--resume`` and no ``--config``,
    the run's own ``OUTPUT_DIR/config.yaml`` takes the place of the defaults, so ``--resume
    --iterations N`` continues the same experiment without repeating its flags."""
    import tyro

    from ..config.io import load_yaml, renamed_flags, yaml_bool_flags
    from ..runtime.errors import ConfigError

    argv = yaml_bool_flags(cls, renamed_flags(cls, argv))  # before the --resume pre-parse: `--resume yes` decides alike
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=None)
    known, rest = pre.parse_known_args(argv)
    source = known.config
    if resumable and not source:
        run = argparse.ArgumentParser(add_help=False)
        run.add_argument("--resume", action="store_true")
        run.add_argument("--auto-resume", "--auto_resume", action="store_true")
        run.add_argument("--output-dir", "--output_dir", default=cls().output_dir)
        known_run, _ = run.parse_known_args(rest)
        if (known_run.resume or known_run.auto_resume) and (Path(known_run.output_dir) / "config.yaml").is_file():
            source = str(Path(known_run.output_dir) / "config.yaml")
    try:
        default = load_yaml(source, cls) if source else cls()
    except ConfigError as e:
        print(f"ppo-lm: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None  # like every other usage or config error
    return tyro.cli(cls, args=rest, default=default, prog=prog, description=description + "\n\n--config FILE.yaml  "
                    "YAML file whose values override the defaults (flags override the file)")


def _run(fn: Callable[[], object]) -> int:
    """Run a command's body: a :class:`~ppo_lm.runtime.errors.UserError` (or a non-finite float the user's
    settings caused) is one line on stderr and status 2; Ctrl-C is status 130."""
    from ..runtime.errors import UserError

    try:
        fn()
    except (UserError, FloatingPointError) as e:
        print(f"ppo-lm: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ppo-lm: interrupted; the last checkpoint in the output directory is intact (resume with --resume)",
              file=sys.stderr)
        return 130
    return 0


COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("ppo_lm.cli.train:cmd_train", "PPO / critic-free RL training"),
    "sft": ("ppo_lm.cli.stages:cmd_sft", "supervised fine-tuning (prompt, response)"),
    "rm": ("ppo_lm.cli.stages:cmd_rm", "Bradley–Terry reward model (prompt, chosen, rejected)"),
    "demo": ("ppo_lm.cli.demo:cmd_demo", "SFT → PPO (or → RM → PPO with --rlhf) on the built-in task"),
    "compare": ("ppo_lm.cli.compare:cmd_compare", "advantage estimators side by side: same start, budget, seeds"),
    "plot": ("ppo_lm.cli.plot:cmd_plot", "PNG of a run's diagnostics"),
    "report": ("ppo_lm.cli.report:cmd_report", "HTML page of a run's per-token credit (Â, δ, V, KL, ratio)"),
    "export": ("ppo_lm.cli.export:cmd_export", "a run's policy as a standalone model directory"),
    "bench": ("ppo_lm.cli.bench:cmd_bench", "throughput and memory on the benchmark workloads (docs/benchmarks.md)"),
}


def _format_warning(message, category, filename, lineno, line=None) -> str:
    """ppo-lm's own warnings as one line a user reads (``ppo-lm: warning: …``); others as Python
    prints them, with their file and line."""
    if Path(filename).resolve().is_relative_to(Path(__file__).resolve().parents[1]):  # the package
        return f"ppo-lm: warning: {message}\n"
    return _python_format_warning(message, category, filename, lineno, line)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    warnings.formatwarning = _format_warning
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: ppo-lm [--version] COMMAND [--config FILE.yaml] [--section.field VALUE ...]\n\ncommands:")
        for name, (_, help_) in COMMANDS.items():
            print(f"  {name:8s} {help_}")
        print("\nRun `ppo-lm COMMAND --help` for the options of a command.")
        return 0 if argv else 2
    if argv[0] == "--version":
        from importlib.metadata import version

        print(f"ppo-lm {version('ppo-lm')}")
        return 0
    name, rest = argv[0], argv[1:]
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-file load/save bars would bury ppo-lm's own output
    if name not in COMMANDS:
        print(f"ppo-lm: error: unknown command {name!r}; choose one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    import importlib

    mod, fn = COMMANDS[name][0].split(":")
    return getattr(importlib.import_module(mod), fn)(rest)
