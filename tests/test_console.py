"""What a run shows: the start-up banner, a flushed line per iteration in a log file, the learning
signal of the scores (their spread, groups without one), and notices that are printed once."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from trainer_helpers import count_sevens, tiny_config

from ppo_lm.records import metrics_log
from ppo_lm.records.metrics_log import MetricsLogger
from ppo_lm.trainer.ppo import PPOTrainer


def _rows(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_banner_names_device_models_and_estimator(tmp_path, capsys):
    PPOTrainer(tiny_config(tmp_path / "run"), verifier=count_sevens)
    out = capsys.readouterr().out
    assert "ppo-lm 0.1.0 · new run in" in out
    assert "device cpu · float32" in out
    assert "policy    Qwen2ForCausalLM from builtin:" in out and "parameters, trained" in out
    assert "reference frozen copy of the policy:" in out and "parameters, frozen" in out
    assert "critic    Qwen2ForTokenClassification" in out
    assert "estimator gae · KL k1 in the reward, β 0.05 · 8 prompts × 1 sample × ≤4 tokens" in out


def test_plain_lines_in_a_log_file_every_print_every(tmp_path, capsys):
    """Not a terminal (pytest captures stdout): one flushed line per print_every iterations and after
    the last, with the numbers of metrics.jsonl."""
    run = tmp_path / "run"
    PPOTrainer(tiny_config(run, iterations=3, log__progress=True, log__print_every=2), verifier=count_sevens).train()
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("iteration ")]
    assert [x.split()[1] for x in lines] == ["2/3", "3/3"]
    row = _rows(run)[1]
    assert f"score {row['score']:.3f} ±{row['score_std']:.3f}" in lines[0]
    assert f"ref_kl {row['ref_kl']:.3f}" in lines[0] and f"vf {row['value_loss']:.3f}" in lines[0]


def test_no_lines_without_progress_and_a_bar_only_on_a_terminal(tmp_path, capsys):
    quiet = MetricsLogger(tmp_path, tensorboard=False, progress=False, total=2)
    quiet.log(1, {"score": 1.0})
    on_terminal = MetricsLogger(tmp_path, tensorboard=False, progress=True, total=2, terminal=True)
    assert on_terminal.progress is not None and on_terminal.print_every == 0
    on_terminal.close()
    assert "iteration" not in capsys.readouterr().out


def test_tensorboard_missing_is_said_once(tmp_path, capsys, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_tensorboard(name, *a, **k):
        if name.startswith("torch.utils.tensorboard"):
            raise ImportError("no tensorboard")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    monkeypatch.setattr(metrics_log, "_TENSORBOARD_NOTICE_SHOWN", False)
    for _ in range(2):
        MetricsLogger(tmp_path, tensorboard=True, progress=False).close()
    err = capsys.readouterr().err
    assert err.count("TensorBoard is not installed") == 1 and "--log.no-tensorboard" in err


def _scores_of_iteration(trainer, iteration):
    batch = trainer.rollout(iteration)
    return batch, batch.scores.double()


@pytest.mark.parametrize("samples", [1, 4])
def test_score_spread_and_equal_groups_are_logged(tmp_path, samples):
    """score_std/min/max over the iteration's responses, and for groups the share whose scores are all
    equal, against a direct computation on the same rollout."""
    extra = {"algo__estimator": "grpo", "rollout__num_prompts": 4} if samples > 1 else {}
    cfg = tiny_config(tmp_path / "run", rollout__samples_per_prompt=samples, **extra)
    tr = PPOTrainer(cfg, verifier=lambda p, r, **c: [float(len(x) % 3) for x in r])
    torch.manual_seed(0)
    batch = tr.rollout(1)
    m = tr.learn(batch, 1).metrics
    s = batch.scores.double()
    assert m["score_min"] == pytest.approx(float(s.min())) and m["score_max"] == pytest.approx(float(s.max()))
    assert m["score_std"] == pytest.approx(float(s.std(unbiased=False)), abs=1e-9)
    if samples > 1:
        g = s.view(-1, samples)
        expected = float((g == g[:, :1]).all(1).double().mean())
        assert m["equal_score_groups_frac"] == pytest.approx(expected)
    else:
        assert "equal_score_groups_frac" not in m


def test_score_and_advantage_spreads_keep_their_precision_far_from_zero():
    """score_std and advantage_std are population stds computed in two passes: scores near 1e4 with a
    spread of 0.01 (fp32, as a rollout holds them) get their spread, where E[x²] − mean² cancels to
    noise (or to 0 by the clamp)."""
    from ppo_lm.rollout.score.batch import RolloutBatch
    from ppo_lm.trainer.diagnostics import rollout_metrics

    g = torch.Generator().manual_seed(0)
    B, T = 64, 5
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[::3, 3:] = False  # some shorter responses
    scores = 1e4 + 0.01 * torch.randn(B, generator=g)
    advantages = (1e4 + 0.01 * torch.randn(B, T, generator=g)).where(mask, 0)
    zeros = torch.zeros(B, T)
    batch = RolloutBatch(input_ids=torch.zeros(B, 2 + T, dtype=torch.long), attention_mask=torch.ones(B, 2 + T),
                         prompt_width=2, response_mask=mask, terminated=torch.ones(B, dtype=torch.bool),
                         logp_old=zeros, logp_ref=zeros, scores=scores)
    m = rollout_metrics(batch, zeros, advantages, None, beta=0.0, kl_estimator="k1", samples_per_prompt=1)
    assert m["score_std"] == pytest.approx(float(scores.double().std(unbiased=False)), rel=1e-3)
    assert m["advantage_std"] == pytest.approx(float(advantages.double()[mask].std(unbiased=False)), rel=1e-3)


def test_identical_scores_warn_once(tmp_path):
    tr = PPOTrainer(tiny_config(tmp_path / "run", iterations=2), verifier=lambda p, r, **c: [0.5] * len(r))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tr.train()
    said = [w for w in caught if "no learning signal" in str(w.message)]
    assert len(said) == 1 and "scored 0.5" in str(said[0].message)
    assert all(r["score_std"] == 0 and r["score_min"] == r["score_max"] == 0.5 for r in _rows(tmp_path / "run"))


def test_varied_scores_do_not_warn(tmp_path):
    tr = PPOTrainer(tiny_config(tmp_path / "run", iterations=1), verifier=lambda p, r, **c: list(range(len(r))))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tr.train()
    assert not [w for w in caught if "no learning signal" in str(w.message)]


def test_cli_prints_its_own_warnings_as_one_line(tmp_path, capsys):
    """ppo-lm's warnings read as one line, others keep Python's file:line form; and a run whose every
    score is equal still prints its line per iteration."""
    import warnings as w

    from ppo_lm.cli import main as cli
    from ppo_lm.trainer import ppo

    assert cli._format_warning("every response scored 1", UserWarning, ppo.__file__, 7) == \
        "ppo-lm: warning: every response scored 1\n"
    assert "other.py:3: UserWarning: x" in cli._format_warning("x", UserWarning, str(tmp_path / "other.py"), 3)
    (tmp_path / "flat_reward_abc.py").write_text("def score(p, r, **c):\n    return [1.0] * len(r)\n")
    rc = cli.main(["train", "--threads", "1", "--iterations", "1", "--rollout.num-prompts", "8",
                   "--log.no-tensorboard", "--model.builtin-hidden-size", "32", "--rollout.max-new-tokens", "2",
                   "--model.reward", f"{tmp_path / 'flat_reward_abc.py'}:score", "--output-dir", str(tmp_path / "run")])
    assert rc == 0 and w.formatwarning is cli._format_warning
    assert "iteration 1/1  score 1.000 ±0.000" in capsys.readouterr().out
    w.formatwarning = cli._python_format_warning


@pytest.mark.parametrize("command", ["train", "demo"])
def test_train_and_demo_help_is_complete_and_plain(capsys, command):
    """Every setting of train (and of the demo, which embeds train's under --ppo.*) has help text, with
    no Sphinx markup."""
    from test_stage_errors import _documented_fields, plain_help

    from ppo_lm.cli.demo import DemoConfig
    from ppo_lm.config import train as c
    from ppo_lm.config.critics import CriticConfig

    plain_help(capsys, command)
    classes = [c.TrainConfig, c.ModelConfig, c.DataConfig, c.RolloutConfig, c.AlgoConfig, c.OptimConfig, c.LogConfig, CriticConfig]
    for cls in classes + ([DemoConfig] if command == "demo" else []):
        undocumented = [name for name, has_doc in _documented_fields(cls).items() if not has_doc]
        assert not undocumented, (cls.__name__, undocumented)
