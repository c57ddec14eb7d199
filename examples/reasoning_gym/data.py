"""A task nobody on this project wrote: a reasoning-gym generator (PyPI ``reasoning-gym``, procedural
tasks with their own scorers) written as ppo-lm chat prompts, split into disjoint train and held-out
JSONL files.

    python examples/reasoning_gym/data.py --output-dir runs/chain_sum/data      # the measured task
    python examples/reasoning_gym/data.py --task basic_arithmetic --task-config '{"max_terms": 2}' ...

Every row holds ``prompt`` (one user turn: the generator's question), ``answer`` and ``metadata`` (the
generator's, which names the task); ``rewards.py:score`` hands them back to the task's own
``score_answer``. The default is ``chain_sum`` with two terms of one or two digits ("State the final
answer to the following arithmetic problem: 47 - 12 ="), on which SmolLM2-135M-Instruct starts near
0.3 greedy held-out accuracy (README.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

CHAIN_SUM = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}


def rows(task: str, config: dict, n: int, seed: int) -> list[dict]:
    """Up to ``n`` distinct problems of ``task`` (the generator's own seeded order; repeats dropped)."""
    import reasoning_gym  # imported here so that --help works without it

    try:
        dataset = reasoning_gym.create_dataset(task, size=n, seed=seed, **config)
    except (ValueError, TypeError, AssertionError) as e:  # reasoning-gym's own checks of name and settings
        raise SystemExit(f"[data] --task {task} / --task-config: {e or type(e).__name__}") from None
    seen, out = set(), []
    for entry in dataset:
        if entry["question"] in seen:
            continue
        seen.add(entry["question"])
        out.append({"prompt": [{"role": "user", "content": entry["question"]}],
                    "answer": str(entry["answer"]), "metadata": entry["metadata"]})
    return out


def write_splits(data_dir: Path, *, task: str = "chain_sum", config: dict | None = None, train: int = 400,
                 heldout: int = 100, seed: int = 0) -> tuple[Path, Path, int, int]:
    """``heldout`` problems, then up to ``train`` others, as ``data_dir/heldout.jsonl`` and ``train.jsonl``."""
    config = CHAIN_SUM if config is None and task == "chain_sum" else (config or {})
    # twice the problems asked for, since a small space repeats questions
    problems = rows(task, config, 2 * (train + heldout), seed)
    if len(problems) <= heldout:
        raise SystemExit(f"[data] {task} gave {len(problems)} distinct problems; fewer than --heldout + 1")
    test, rest = problems[:heldout], problems[heldout:heldout + train]
    data_dir.mkdir(parents=True, exist_ok=True)
    paths = data_dir / "train.jsonl", data_dir / "heldout.jsonl"
    for path, part in zip(paths, (rest, test)):
        path.write_text("".join(json.dumps(r) + "\n" for r in part))
    return paths[0], paths[1], len(rest), len(test)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--output-dir", default="runs/chain_sum/data")
    ap.add_argument("--task", default="chain_sum", help="a reasoning-gym dataset name")
    ap.add_argument("--task-config", default=None,
                    help=f"the generator's settings as JSON (chain_sum's default: {json.dumps(CHAIN_SUM)})")
    ap.add_argument("--train", type=int, default=400, help="training problems (at most)")
    ap.add_argument("--heldout", type=int, default=100, help="held-out problems")
    ap.add_argument("--seed", type=int, default=0, help="the generator's seed")
    args = ap.parse_args(argv)
    try:
        config = json.loads(args.task_config) if args.task_config else None
    except json.JSONDecodeError as e:
        raise SystemExit(f"[data] --task-config is not JSON: {e}") from None
    if config is not None and not isinstance(config, dict):
        raise SystemExit("[data] --task-config must be a JSON object, e.g. '{\"max_terms\": 2}'")
    try:
        train, heldout, n_train, n_test = write_splits(Path(args.output_dir), task=args.task, config=config,
                                                       train=args.train, heldout=args.heldout, seed=args.seed)
    except ModuleNotFoundError as e:
        raise SystemExit(f"[data] {e.name} is not installed: pip install 'reasoning-gym==0.1.25'") from None
    print(f"[data] {args.task}: {n_train} train problems in {train}, {n_test} held-out in {heldout}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
