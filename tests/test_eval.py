"""Held-out evaluation during training (data.eval_prompts, log.eval_every): greedy eval_score,
pass@k from k samples, before training as iteration 0, and no effect on the training itself."""

from __future__ import annotations

import json

import pytest
from dist_worker import save_reward_model
from trainer_helpers import count_sevens, tiny_config

from ppo_lm.records.metrics_log import is_timing_key
from ppo_lm.rollout.evaluate import greedy_eval
from ppo_lm.runtime.errors import ConfigError
from ppo_lm.tasks.equations import make_prompts, verify
from ppo_lm.trainer.ppo import PPOTrainer


def _rows(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _eval_cfg(run, **kw):
    return tiny_config(run, data__eval_prompts="builtin:equations", data__builtin_eval_prompts=8, **kw)


def test_eval_before_every_n_and_after_the_last(tmp_path):
    run = tmp_path / "run"
    tr = PPOTrainer(_eval_cfg(run, iterations=3, log__eval_every=2))
    # the untrained policy, evaluated independently (same seed: the same initial weights)
    fresh = PPOTrainer(_eval_cfg(tmp_path / "fresh"))
    held = make_prompts(8, seed=10_000, split="heldout", unique=True)
    before, _ = greedy_eval(fresh.sampler.producer, held, verify, max_new_tokens=4)
    tr.train()
    rows = _rows(run)
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3]
    assert rows[0]["eval_score"] == pytest.approx(before) and set(rows[0]) == {"iteration", "eval_score", "eval_s"}
    assert "eval_score" not in rows[1] and "eval_score" in rows[2] and "eval_score" in rows[3]
    assert "eval_pass_at_k" not in rows[3]


def test_pass_at_k_counts_a_prompt_once_any_sample_passes(tmp_path):
    calls = []

    def first_of_each_group(prompts, responses, **columns):
        # evaluation asks k = 4 samples per prompt, in order: the first of each group passes
        start = len(calls)
        calls.extend(prompts)
        return [1.0 if (start + i) % 4 == 0 else 0.0 for i in range(len(prompts))]

    tr = PPOTrainer(_eval_cfg(tmp_path / "run", log__eval_samples=4, model__gold_reward=None),
                    verifier=first_of_each_group)
    m = tr.evaluate(1)
    assert len(calls) == 32 and all(calls[i] == calls[i - i % 4] for i in range(32))  # groups of one prompt
    assert m["eval_pass_at_k"] == 1.0 and m["eval_score"] == pytest.approx(0.25)

    def only_first_prompt(prompts, responses, **columns):
        return [1.0 if p == prompts[0] else 0.0 for p in prompts]

    tr2 = PPOTrainer(_eval_cfg(tmp_path / "run2", log__eval_samples=4, log__eval_pass_score=0.5),
                     verifier=only_first_prompt)
    assert tr2.evaluate(1)["eval_pass_at_k"] == pytest.approx(1 / 8)


def test_evaluation_does_not_change_the_training(tmp_path):
    """Sampled evaluation uses its own generator: a run with it logs the training metrics of a run
    without it, and a resumed run equals an uninterrupted one."""
    plain, with_eval = tmp_path / "plain", tmp_path / "eval"
    PPOTrainer(tiny_config(plain, iterations=2), verifier=count_sevens).train()
    PPOTrainer(_eval_cfg(with_eval, iterations=2, log__eval_every=1, log__eval_samples=2),
               verifier=count_sevens).train()
    a, b = _rows(plain), _rows(with_eval)[1:]
    for x, y in zip(a, b):
        assert {k: v for k, v in x.items() if not is_timing_key(k)} == \
               {k: v for k, v in y.items() if not is_timing_key(k) and not k.startswith("eval_")}

    part = tmp_path / "part"
    PPOTrainer(_eval_cfg(part, iterations=1, log__eval_every=1, log__eval_samples=2, log__save_every=1),
               verifier=count_sevens).train()
    PPOTrainer(_eval_cfg(part, iterations=2, log__eval_every=1, log__eval_samples=2, resume=True),
               verifier=count_sevens).train()
    whole, resumed = _rows(with_eval), _rows(part)
    assert [{k: v for k, v in r.items() if not is_timing_key(k)} for r in whole] == \
           [{k: v for k, v in r.items() if not is_timing_key(k)} for r in resumed]


def test_eval_settings_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="log.eval_samples"):
        PPOTrainer(_eval_cfg(tmp_path / "a", log__eval_samples=0))
    rm = save_reward_model(str(tmp_path / "rm"))
    with pytest.raises(ConfigError, match="set `model.gold_reward`"):
        PPOTrainer(_eval_cfg(tmp_path / "b", model__reward=rm))
    with pytest.raises(ConfigError, match="data.eval_prompts.*no such file"):
        PPOTrainer(tiny_config(tmp_path / "c", data__eval_prompts=str(tmp_path / "none.jsonl")))


def test_training_and_held_out_prompts_from_the_splits_of_one_dataset(tmp_path):
    """data.prompts and data.eval_prompts may name one DatasetDict: data.split trains, data.eval_split
    evaluates."""
    import datasets

    train = [{"prompt": f"Solve x+{i}=9\n", "answer": str(9 - i)} for i in range(8)]
    test = [{"prompt": f"Solve x+{i}=19\n", "answer": str(19 - i)} for i in range(4)]
    d = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(train),
                          "test": datasets.Dataset.from_list(test)}).save_to_disk(str(d))
    tr = PPOTrainer(tiny_config(tmp_path / "run", data__prompts=str(d), data__eval_prompts=str(d)),
                    verifier=count_sevens)
    assert tr.sampler.prompts.rows == train and tr.sampler.prompts.eval_rows == test
    with pytest.raises(ConfigError, match=r"has no split 'validation'; its splits: \['test', 'train'\]"):
        PPOTrainer(tiny_config(tmp_path / "run2", data__prompts=str(d), data__split="validation"), verifier=count_sevens)


def test_eval_max_prompts_evaluates_the_first_prompts_of_the_file(tmp_path):
    rows = [{"prompt": f"Solve x+{i}=9\n", "answer": str(9 - i)} for i in range(6)]
    (tmp_path / "held.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = dict(data__eval_prompts=str(tmp_path / "held.jsonl"))
    assert PPOTrainer(tiny_config(tmp_path / "all", **cfg), verifier=count_sevens).sampler.prompts.eval_rows == rows
    tr = PPOTrainer(tiny_config(tmp_path / "few", data__eval_max_prompts=4, **cfg), verifier=count_sevens)
    assert tr.sampler.prompts.eval_rows == rows[:4]


def test_evaluations_are_plotted(tmp_path):
    from ppo_lm.reporting.plots import panels_of, plot_run

    run = tmp_path / "run"
    PPOTrainer(_eval_cfg(run, iterations=2, log__eval_samples=2), verifier=count_sevens).train()
    rows = _rows(run)
    assert ("score", ["score", "eval_score", "eval_pass_at_k"]) in panels_of(rows)
    assert plot_run(run / "metrics.jsonl", tmp_path / "d.png").stat().st_size > 0
