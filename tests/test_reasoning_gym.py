"""reasoning-gym's tasks as a run's prompts and reward: `data.prompts: reasoning-gym:TASK` generates the
task's problems (held-out ones from another seed, never trained on), `model.reward: auto` scores them
with the task's own `score_answer`, and a bad name or setting is one line before any model loads."""

from __future__ import annotations

import sys

import pytest
import reasoning_gym
from trainer_helpers import tiny_config

from ppo_lm.cli.main import main
from ppo_lm.config.specs import reward_specs
from ppo_lm.runtime.errors import ConfigError
from ppo_lm.tasks import reasoning_gym as rg
from ppo_lm.trainer import inputs
from ppo_lm.trainer.ppo import PPOTrainer

CHAIN = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}


def _task_config(tmp_path, task="chain_sum", config=CHAIN, **overrides):
    settings = dict(data__prompts=f"reasoning-gym:{task}", data__eval_prompts=f"reasoning-gym:{task}",
                    data__task_config=dict(config), data__task_size=40, data__task_eval_size=24,
                    data__chat_template="none")
    return tiny_config(tmp_path, **{**settings, **overrides})


def test_training_and_held_out_problems_are_the_generators_own_and_never_shared(tmp_path):
    cfg = _task_config(tmp_path).data
    train = inputs.read_prompt_rows(cfg, seed=3)
    held = inputs.read_prompt_rows(cfg, seed=3, held_out=True)
    assert (len(train), len(held)) == (40, 24)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    assert len({r["prompt"] for r in train}) == 40
    # the generator's own problems, in its seeded order (a held-out question dropped where it recurs)
    direct = reasoning_gym.create_dataset("chain_sum", size=200, seed=3, **CHAIN)
    order = [e["question"] for e in direct]
    positions = [order.index(r["prompt"]) for r in train]
    assert positions == sorted(positions)
    assert all(direct[i]["answer"] == r["answer"] and direct[i]["metadata"] == r["metadata"]
               for i, r in zip(positions, train))
    assert inputs.read_prompt_rows(cfg, seed=3) == train  # the same seed, the same problems
    assert inputs.read_prompt_rows(cfg, seed=4) != train
    chat = inputs.read_prompt_rows(_task_config(tmp_path, data__chat_template="auto").data, seed=3)
    assert [r["prompt"] for r in chat] == [[{"role": "user", "content": r["prompt"]}] for r in train]


@pytest.mark.parametrize("task, config", [("chain_sum", CHAIN), ("basic_arithmetic", {"max_terms": 3})])
def test_the_reward_is_the_tasks_own_scorer_of_the_extracted_answer(task, config):
    """Against reasoning-gym's own ``score_answer`` on the answer written out by hand, on two tasks."""
    rows = rg.make_rows(task, config, 6, seed=1)
    dataset = reasoning_gym.create_dataset(task, size=1, seed=0, **config)
    responses = [f"So the result is {rows[0]['answer']}.", f"<answer>{rows[1]['answer']}</answer> and 7",
                 "I do not know", f"{rows[3]['answer']} or maybe 12345", "<answer>wrong</answer>",
                 f"{rows[5]['answer']}"]
    answers = [rows[0]["answer"], rows[1]["answer"], "I do not know", "12345", "wrong", rows[5]["answer"]]
    expected = [dataset.score_answer(a, {"answer": r["answer"], "metadata": r["metadata"]})
                for a, r in zip(answers, rows)]
    got = rg.reward("auto", task, config)([""] * 6, responses, answer=[r["answer"] for r in rows],
                                           metadata=[r["metadata"] for r in rows])
    assert got == pytest.approx(expected)
    assert got[0] == got[1] == got[5] == 1.0 and got[3] < 1.0


@pytest.mark.parametrize("text, mode, answer", [
    ("x <answer> 42 </answer> then 7", "auto", "42"), ("47 - 12 = 35.", "auto", "35"), ("none at all", "auto", "none at all"),
    ("<answer>1</answer> <answer>2</answer>", "auto", "2"), ("a 1 b", "tag:answer", None),
    ("<final>yes</final>", "tag:final", "yes"), ("total 1,234 or 5", "last-number", "5"),
    ("total 1,234", "last-number", "1234"), ("no number", "last-number", None), ("  as is \n", "text", "as is"),
])
def test_the_answer_is_taken_as_documented(text, mode, answer):
    assert rg.extract(text, mode) == answer


@pytest.mark.parametrize("overrides, message", [
    ({"data__prompts": "reasoning-gym:chain_su"}, r"`data.prompts`: reasoning-gym has no task 'chain_su'; close: chain_sum"),
    ({"data__task_config": {"min_term": 2}}, r"`data.task_config`: chain_sum has no setting 'min_term'; close: min_terms"),
    ({"data__task_config": {"min_terms": 5, "max_terms": 2}}, r"chain_sum refuses it: max_terms must be >= min_terms"),
    ({"data__task_answer": "first-number"}, r"`data.task_answer`='first-number': choose auto, last-number, text or tag"),
    ({"data__prompts": "builtin:equations"}, r"`data.task_size`=40 is unused: `data.prompts` is 'builtin:equations', "
                                             r"not a reasoning-gym task"),
    ({"data__prompts": "builtin:equations", "data__eval_prompts": None}, r"`data.task_config`=\{'min_terms': 2.*is "
                                                                          r"unused: neither"),
])
def test_a_bad_task_or_setting_is_one_line_before_any_model(tmp_path, no_model_loads, overrides, message):
    with pytest.raises(ConfigError, match=message):
        PPOTrainer(_task_config(tmp_path, **overrides))


def test_without_the_package_the_error_names_the_extra(tmp_path, monkeypatch, no_model_loads):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    monkeypatch.setitem(sys.modules, "reasoning_gym.factory", None)
    with pytest.raises(ConfigError, match=r"reasoning-gym is not installed: pip install 'ppo-lm\[reasoning-gym\]'"):
        PPOTrainer(_task_config(tmp_path))


def test_auto_names_the_tasks_reward_and_prompts_of_your_own_name_theirs(tmp_path):
    assert reward_specs(_task_config(tmp_path)) == [("reasoning-gym", 1.0)]
    assert reward_specs(tiny_config(tmp_path)) == [("builtin:equations", 1.0)]
    assert reward_specs(_task_config(tmp_path, model__reward="reasoning-gym,m.py:f")) == [
        ("reasoning-gym", 1.0), ("m.py:f", 1.0)]
    with pytest.raises(ConfigError, match=r"`model.reward` is 'auto', .*`data.prompts` is 'p.jsonl': name its reward"):
        reward_specs(tiny_config(tmp_path, data__prompts="p.jsonl"))


def test_a_run_on_a_task_trains_on_its_scores_and_evaluates_held_out(tmp_path, capsys):
    tr = PPOTrainer(_task_config(tmp_path, rollout__num_prompts=8, iterations=1, log__eval_every=1))
    out = capsys.readouterr().out
    assert "prompts   reasoning-gym chain_sum (min_terms=2 max_terms=2 min_digits=1 max_digits=2): 40 problems " \
           "(seed 0), 24 held out" in out and "reward    reasoning-gym (verifier)" in out
    batch = tr.rollout(1)
    texts = [p for p in batch.prompts]
    rows = {r["prompt"]: r for r in tr.sampler.prompts.rows}
    expected = rg.reward("auto", "chain_sum", CHAIN)(texts, batch.responses, answer=[rows[p]["answer"] for p in texts],
                                                      metadata=[rows[p]["metadata"] for p in texts])
    assert batch.scores.tolist() == pytest.approx(expected)
    assert "eval_score" in tr.evaluate(1)


def test_compare_runs_a_task_with_its_own_reward_and_held_out_problems(tmp_path):
    from ppo_lm.cli import compare

    c = compare.parse_args(["--prompts", "reasoning-gym:chain_sum", "--policy", "builtin", "--smoke",
                            "--estimators", "gae,grpo", "--output-dir", str(tmp_path / "c")])
    compare.check_compare(c)
    run = compare.run_config(c, "grpo", 0)
    assert (run.data.eval_prompts, run.model.reward) == ("reasoning-gym:chain_sum", "auto")
    assert (run.data.task_size, run.data.task_eval_size) == (32, 8)


def test_the_tasks_settings_on_the_command_line(tmp_path, no_model_loads, capsys):
    """`--data.task-config KEY VALUE ...`: each value read as a number or a word; a bad key is one line."""
    assert main(["train", "--data.prompts", "reasoning-gym:chain_sum", "--data.task-config", "min_terms", "2",
                 "max_term", "2", "--output-dir", str(tmp_path / "r")]) == 2
    assert "chain_sum has no setting 'max_term'; close: max_terms" in capsys.readouterr().err
