"""Several rewards: the score is their weighted sum, each is logged as score/<name>; verifiers and
reward models mix."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from dist_worker import save_reward_model
from trainer_helpers import count_sevens, length_reward, tiny_config

from ppo_lm.cli.main import main
from ppo_lm.trainer.ppo import PPOTrainer


@pytest.fixture
def reward_file(tmp_path):
    f = tmp_path / "two_rewards_abc.py"
    f.write_text(textwrap.dedent("""
        def sevens(prompts, responses, **columns):
            return [r.count("7") for r in responses]

        def length(prompts, responses, **columns):
            return [len(r) for r in responses]
    """))
    return f


def test_weighted_sum_of_verifiers_from_a_spec(tmp_path, reward_file):
    cfg = tiny_config(tmp_path / "run", model__reward=f"{reward_file}:sevens, {reward_file}:length",
                      model__reward_weights=[1.0, -0.25], rollout__max_new_tokens=8)
    tr = PPOTrainer(cfg)
    batch = tr.rollout(1)
    sevens = torch.tensor([float(r.count("7")) for r in batch.responses])
    length = torch.tensor([float(len(r)) for r in batch.responses])
    assert torch.equal(batch.score_terms["sevens"], sevens) and torch.equal(batch.score_terms["length"], length)
    assert torch.allclose(batch.scores, sevens - 0.25 * length)
    m = tr.learn(batch, 1).metrics
    assert m["score/sevens"] == pytest.approx(float(sevens.mean()))
    assert m["score/length"] == pytest.approx(float(length.mean()))
    assert m["score"] == pytest.approx(float((sevens - 0.25 * length).mean()), abs=1e-6)


def test_verifiers_from_python_and_their_names(tmp_path):
    tr = PPOTrainer(tiny_config(tmp_path / "run", model__reward_weights=[2.0, 1.0, 1.0]),
                    verifier=[count_sevens, length_reward, length_reward])
    assert [(t.name, t.weight) for t in tr.models.rewards] == [("count_sevens", 2.0), ("length_reward_2", 1.0),
                                                        ("length_reward_3", 1.0)]
    b = tr.rollout(1)
    assert torch.allclose(b.scores, 2 * b.score_terms["count_sevens"] + 2 * b.score_terms["length_reward_2"])


def test_one_reward_logs_no_terms(tmp_path):
    tr = PPOTrainer(tiny_config(tmp_path / "run"), verifier=count_sevens)
    b = tr.rollout(1)
    assert b.score_terms is None and not any(k.startswith("score/") for k in tr.learn(b, 1).metrics)


def test_a_reward_model_and_a_verifier(tmp_path):
    rm = save_reward_model(str(tmp_path / "rm"))
    alone = PPOTrainer(tiny_config(tmp_path / "a", model__reward=rm)).rollout(1)
    cfg = tiny_config(tmp_path / "b", model__reward=f"{rm},builtin:equations", model__reward_weights=[0.5, 1.0])
    tr = PPOTrainer(cfg)
    both = tr.rollout(1)
    assert torch.equal(alone.input_ids, both.input_ids)  # rewards do not change the samples
    assert torch.allclose(both.score_terms["rm"], alone.scores, atol=1e-6)
    assert torch.allclose(both.scores, 0.5 * both.score_terms["rm"] + both.score_terms["equations"], atol=1e-6)
    assert any(term.model is not None for term in tr.models.rewards)  # a separate critic can start from it


def test_reward_list_errors_come_before_any_model(tmp_path, capsys, reward_file):
    out = ["--output-dir", str(tmp_path / "run")]
    base = ["train", "--iterations", "1", "--log.no-tensorboard"]
    assert main([*base, "--model.reward", f"{reward_file}:sevens,{reward_file}:length",
                 "--model.reward-weights", "1", *out]) == 2
    assert "`model.reward_weights` has 1 weights for 2 rewards" in capsys.readouterr().err
    assert main([*base, "--model.reward", f"{reward_file}:sevens,,x:y", *out]) == 2
    assert "has an empty entry" in capsys.readouterr().err
    two = tmp_path / "two_labels"
    save_reward_model(str(two))
    cfg = json.loads((two / "config.json").read_text())
    cfg["id2label"], cfg["label2id"] = {"0": "a", "1": "b"}, {"a": 0, "b": 1}
    (two / "config.json").write_text(json.dumps(cfg))
    assert main([*base, "--model.reward", str(two), *out]) == 2
    assert "has 2 labels; a reward model has one" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_non_finite_reward_weights_are_refused_before_any_model(tmp_path, capsys, monkeypatch, reward_file, bad):
    """A NaN or infinite weight would make every score non-finite; the run would only stop much later,
    on non-finite losses, with advice about learning rates."""
    from ppo_lm.runtime.errors import ConfigError
    from ppo_lm.trainer import roles

    monkeypatch.setattr(roles, "build_policy", lambda *a, **k: pytest.fail("a model was built"))
    rc = main(["train", "--iterations", "1", "--log.no-tensorboard", "--output-dir", str(tmp_path / "run"),
               "--model.reward", f"{reward_file}:sevens,{reward_file}:length", "--model.reward-weights", "1", bad])
    err = capsys.readouterr().err
    assert rc == 2 and "`model.reward_weights[1]` must be a finite number, got" in err
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(ConfigError, match=r"`model.reward_weights\[0\]` must be a finite number"):  # from Python
        PPOTrainer(tiny_config(tmp_path / "py", model__reward_weights=[float(bad), 1.0]),
                   verifier=[count_sevens, length_reward])
