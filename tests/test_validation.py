"""Bad input fails at start-up with a message naming the field (config load and data load)."""

from __future__ import annotations

import json
import math

import pytest
from trainer_helpers import count_sevens, length_reward, tiny_config

from ppo_lm.algorithms import POLICY_LOSSES
from ppo_lm.cli.main import main
from ppo_lm.config.io import from_dict, load_yaml
from ppo_lm.config.train import TrainConfig
from ppo_lm.config.validate import validate_config
from ppo_lm.rollout.score.reward import RewardError
from ppo_lm.runtime.errors import ConfigError
from ppo_lm.trainer.ppo import PPOTrainer
from ppo_lm.trainer.update import NonFiniteLossError


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"optim__num_minibatches": 3}, "num_minibatches"),
        ({"optim__micro_batch_size": 3}, "micro_batch_size"),
        ({"rollout__top_p": 1.5}, "top_p"),
        ({"rollout__top_p": 0.0}, "top_p"),
        ({"algo__gamma": -0.1}, "gamma"),
        ({"algo__gae_lambda": 1.2}, "gae_lambda"),
        ({"critic__gae_lambda": 2.0}, "critic.gae_lambda"),
        ({"algo__clip_eps": 0.0}, "clip_eps"),
        ({"algo__dual_clip": 1.0}, "dual_clip"),
        ({"algo__estimator": "ppo2"}, "estimator"),
        ({"algo__estimator": "grpo"}, "samples_per_prompt"),
        ({"rollout__temperature": -1.0}, "temperature"),
        ({"iterations": 0}, "iterations"),
        ({"seed": 2**63}, "seed"),
        ({"model__cpu_lanes": -1}, "model.cpu_lanes"),
        ({"critic__value_grad_scale": 2.0}, "value_grad_scale"),
        ({"log__report_to": ["neptune"]}, "log.report_to"),
    ],
)
def test_config_errors_name_the_field(tmp_path, overrides, field):
    with pytest.raises(ConfigError, match=field):
        validate_config(tiny_config(tmp_path, **overrides))


def test_bad_device_names_the_field(tmp_path):
    import torch

    bad = ["tpu", "cuda:99"] + ([] if torch.cuda.is_available() else ["cuda"])
    for device in bad:
        with pytest.raises(ConfigError, match="model.device"):
            PPOTrainer(tiny_config(tmp_path, model__device=device), verifier=count_sevens)


def test_world_size_must_divide_prompts(tmp_path):
    with pytest.raises(ConfigError, match="num_prompts"):
        validate_config(tiny_config(tmp_path, rollout__num_prompts=9), world_size=2)


def test_yaml_unknown_field_suggests_the_closest(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("algo:\n  gae_lamda: 0.9\n")
    with pytest.raises(ConfigError, match="algo.gae_lamda.*gae_lambda"):
        load_yaml(p, TrainConfig)
    with pytest.raises(ConfigError, match="algo.kl_estimator"):
        from_dict(TrainConfig, {"algo": {"kl_estimator": "k9"}})
    with pytest.raises(ConfigError, match="rollout.max_new_tokens"):
        from_dict(TrainConfig, {"rollout": {"max_new_tokens": "many"}})
    with pytest.raises(ConfigError, match="not found"):
        load_yaml(tmp_path / "missing.yaml", TrainConfig)


def test_cli_yaml_then_flags_override(tmp_path, capsys):
    p = tmp_path / "c.yaml"
    p.write_text(
        "iterations: 1\nmodel:\n  builtin_hidden_size: 32\nrollout:\n  num_prompts: 4\n  max_new_tokens: 3\n"
        "algo:\n  gae_lambda: 0.5\noptim:\n  epochs: 1\nlog:\n  progress: false\n  tensorboard: false\n"
    )
    out = tmp_path / "run"
    rc = main(["train", "--config", str(p), "--output-dir", str(out), "--algo.gae-lambda", "0.8", "--seed", "3"])
    assert rc == 0
    saved = (out / "config.yaml").read_text()
    assert "gae_lambda: 0.8" in saved and "seed: 3" in saved and "num_prompts: 4" in saved
    rows = (out / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 1
    # an existing run is not overwritten without --resume
    assert main(["train", "--config", str(p), "--output-dir", str(out)]) == 2
    assert "--resume" in capsys.readouterr().err


def test_cli_bad_value_exits_with_message(tmp_path, capsys):
    assert main(["train", "--output-dir", str(tmp_path / "r"), "--algo.gae-lambda", "1.5"]) == 2
    assert "algo.gae_lambda" in capsys.readouterr().err


def test_missing_prompt_file_and_column(tmp_path):
    with pytest.raises(ConfigError, match="nope.jsonl"):
        PPOTrainer(tiny_config(tmp_path, data__prompts=str(tmp_path / "nope.jsonl")), verifier=count_sevens)
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"question": "Solve x+1=2\n"}) + "\n")
    with pytest.raises(ConfigError, match="prompt"):
        PPOTrainer(tiny_config(tmp_path, data__prompts=str(f)), verifier=count_sevens)
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    with pytest.raises(ConfigError, match="empty"):
        PPOTrainer(tiny_config(tmp_path, data__prompts=str(empty)), verifier=count_sevens)


def test_prompt_longer_than_context(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "Solve " + "1" * 300 + "x=2\n"}) + "\n")
    with pytest.raises(ConfigError, match="tokens"):
        PPOTrainer(tiny_config(tmp_path, data__prompts=str(f)), verifier=count_sevens)


def test_jsonl_prompts_extra_columns_reach_verifier(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"Solve x+{i}=9\n", "tag": f"t{i}"}) + "\n" for i in range(8)))
    seen = {}

    def verifier(prompts, responses, tag, **kw):
        seen["tag"] = list(tag)
        seen["prompts"] = list(prompts)
        return [0.0] * len(prompts)

    tr = PPOTrainer(tiny_config(tmp_path, data__prompts=str(f)), verifier=verifier)
    tr.train_iteration(1)
    assert len(seen["tag"]) == 8
    assert all(p == f"Solve x+{t[1:]}=9\n" for p, t in zip(seen["prompts"], seen["tag"]))


def test_a_missing_or_stop_token_pad_is_replaced_by_a_free_special_token(tmp_path, capsys):
    """Most instruct models pad with EOS; the tokenizer the checkpoints save must not pad with a stop
    token (ppo-lm masks padding by length, tools that read the saved tokenizer by id), so a free special
    token is taken (logged), and with none left the error names `model.pad_token` and says why."""
    from ppo_lm.tasks.equations import build_tokenizer

    tok = build_tokenizer()
    tok.pad_token = tok.eos_token
    tr = PPOTrainer(tiny_config(tmp_path / "a"), tokenizer=tok, verifier=count_sevens)
    assert tr.models.tokenizer.pad_token == "<pad>"
    assert "pad token '<eos>', a stop token; padding with the free special token '<pad>'" in capsys.readouterr().out
    tok2 = build_tokenizer()
    tok2.pad_token = None
    PPOTrainer(tiny_config(tmp_path / "b"), tokenizer=tok2, verifier=count_sevens)
    assert tok2.pad_token == "<pad>"
    tok3 = build_tokenizer()  # "<pad>" a stop token too: the unk token is the one left
    tok3.pad_token = tok3.eos_token
    PPOTrainer(tiny_config(tmp_path / "c", rollout__stop_tokens=["<pad>"]), tokenizer=tok3, verifier=count_sevens)
    assert tok3.pad_token == "<unk>"

    from ppo_lm.trainer.roles import ensure_pad_token

    class OnlyEos:
        eos_token_id, pad_token_id, bos_token_id, unk_token, pad_token = 1, 1, None, None, "<eos>"
        all_special_tokens, added_tokens_decoder, chat_template = ["<eos>"], {}, None

        def convert_tokens_to_ids(self, s):
            return 1

    with pytest.raises(ConfigError, match="no free special token.*`model.pad_token` to a token of its vocabulary "
                                          "that is not a stop token .*find padding by id"):
        ensure_pad_token(OnlyEos())


@pytest.mark.parametrize(
    "verifier,match",
    [
        (lambda p, r, **k: 1 / 0, "(?s)ZeroDivisionError.*Solve"),
        (lambda p, r, **k: [math.nan] * len(p), "nan for prompt 'Solve"),
        (lambda p, r, **k: [1.0], "returned 1 scores for 8"),
        (lambda p, r, **k: None, "list of numbers"),
        (lambda p, r, **k: ["0.5"] * len(p), r"entry 0 is of type str \('0.5'\); give a number"),
        (lambda p, r, **k: [{"score": "1e3"}] * len(p), "Reward.score of type str"),
    ],
)
def test_bad_reward_function_stops_with_prompt(tmp_path, verifier, match):
    tr = PPOTrainer(tiny_config(tmp_path), verifier=verifier)
    with pytest.raises(RewardError, match=match):
        tr.train_iteration(1)


def test_unknown_reward_spec(tmp_path):
    with pytest.raises(ConfigError, match="model.reward"):
        PPOTrainer(tiny_config(tmp_path, model__reward="no_such_module_xyz:fn"))


def test_nonfinite_gradient_of_a_finite_loss_is_skipped(tmp_path, monkeypatch):
    """A finite loss whose gradient is NaN (here sqrt'(0) · 0) must not reach the weights: the minibatch
    is skipped like a non-finite loss, and it leaves no statistics behind."""
    import torch

    tr = PPOTrainer(tiny_config(tmp_path, iterations=1, optim__epochs=2, optim__num_minibatches=2,
                                optim__max_nonfinite_in_row=100), verifier=count_sevens)
    real = POLICY_LOSSES["ppo"]

    def nan_gradient(logp, *a, **k):
        loss, stats = real(logp, *a, **k)
        return loss + (logp.sum() * 0).abs().sqrt(), stats

    monkeypatch.setitem(POLICY_LOSSES, "ppo", nan_gradient)
    before = [p.detach().clone() for p in tr.models.policy.lm.parameters()]
    metrics = tr.learn(tr.rollout(1), 1).metrics
    assert metrics["nonfinite_skipped_total"] == 4  # 2 epochs × 2 minibatches
    after = list(tr.models.policy.lm.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert "policy_loss" not in metrics and "grad_norm_actor" not in metrics


def test_statistics_leave_out_a_skipped_minibatch(tmp_path, monkeypatch):
    """A minibatch whose second micro-batch has a NaN loss is skipped whole: its first micro-batch's
    statistics are not in the update's. The first minibatch changed nothing, so the second runs at
    ratio 1 where the clipped loss is −A: reference = −(token mean of the kept calls' advantages)."""
    tr = PPOTrainer(tiny_config(tmp_path, iterations=1, optim__epochs=1, optim__num_minibatches=2,
                                optim__micro_batch_size=2, rollout__num_prompts=8, optim__max_nonfinite_in_row=100),
                    verifier=length_reward)
    real = POLICY_LOSSES["ppo"]
    calls = []

    def nan_on_second_call(logp, logp_old, advantages, mask, **k):
        loss, stats = real(logp, logp_old, advantages, mask, **k)
        m = mask.bool()
        calls.append((float(-advantages[m].sum()), int(m.sum())))
        return (loss * float("nan") if len(calls) == 2 else loss), stats

    monkeypatch.setitem(POLICY_LOSSES, "ppo", nan_on_second_call)
    metrics = tr.learn(tr.rollout(1), 1).metrics
    assert len(calls) == 4 and metrics["nonfinite_skipped_total"] == 1

    def mean(rows):
        return sum(s for s, _ in rows) / sum(n for _, n in rows)

    assert metrics["policy_loss"] == pytest.approx(mean(calls[2:]), rel=1e-4, abs=1e-6)
    assert abs(mean(calls[2:]) - mean([calls[0]] + calls[2:])) > 1e-3, "the skipped call must matter"


def test_nonfinite_loss_is_skipped_then_stops(tmp_path, monkeypatch):
    import torch

    tr = PPOTrainer(tiny_config(tmp_path, iterations=5, optim__max_nonfinite_in_row=2), verifier=count_sevens)
    real = POLICY_LOSSES["ppo"]
    calls = {"n": 0}

    def nan_loss(logp, *a, **k):
        loss, stats = real(logp, *a, **k)
        calls["n"] += 1
        return loss * torch.tensor(float("nan")), stats

    before = [p.detach().clone() for p in tr.models.policy.lm.parameters()]
    monkeypatch.setitem(POLICY_LOSSES, "ppo", nan_loss)
    with pytest.raises(NonFiniteLossError, match="non-finite"):
        tr.train()
    assert all(torch.equal(a, b) for a, b in zip(before, tr.models.policy.lm.parameters()))  # nothing applied
    rows = (tmp_path / "metrics.jsonl").read_text().splitlines() if (tmp_path / "metrics.jsonl").exists() else []
    assert len(rows) == 0  # it stopped within the first iteration (2 minibatches × 2 epochs all skipped)


def test_kl_in_reward_with_a_score_only_estimator_is_refused():
    cfg = from_dict(TrainConfig, {"algo": {"estimator": "grpo", "kl_in": "reward"}, "rollout": {"samples_per_prompt": 2}})
    with pytest.raises(ConfigError, match="algo.kl_in.*no effect.*grpo"):
        validate_config(cfg)
    cfg.algo.kl_coef = 0.0  # nothing to put anywhere: fine
    validate_config(cfg)


def test_only_consecutive_nonfinite_updates_stop_the_run(tmp_path, monkeypatch):
    """Skips with applied updates between them do not add up; a run of skips does, across iterations."""
    import torch

    tr = PPOTrainer(tiny_config(tmp_path, iterations=3, optim__epochs=2, optim__num_minibatches=2,
                                optim__max_nonfinite_in_row=2), verifier=count_sevens)
    real = POLICY_LOSSES["ppo"]
    calls = {"n": 0, "bad": set()}

    def flaky(logp, *a, **k):
        loss, stats = real(logp, *a, **k)
        calls["n"] += 1
        return (loss * torch.tensor(float("nan")) if calls["n"] in calls["bad"] else loss), stats

    monkeypatch.setitem(POLICY_LOSSES, "ppo", flaky)
    calls["bad"] = {1, 3}  # skip, ok, skip, ok: never two in a row
    metrics = tr.train_iteration(1).metrics
    assert metrics["nonfinite_skipped_total"] == 2
    calls["bad"] = {8, 9}  # iteration 2 ends with a skip (call 8), iteration 3 starts with one (call 9)
    tr.train_iteration(2)
    with pytest.raises(NonFiniteLossError, match="2 consecutive minibatch updates"):
        tr.train_iteration(3)


def test_prompt_rows_must_share_their_columns(tmp_path):
    f = tmp_path / "p.jsonl"
    rows = [{"prompt": f"Solve x+{i}=9\n", "answer": str(9 - i)} for i in range(8)]
    del rows[5]["answer"]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match=r"row 5 has columns \['prompt'\] but row 0 has \['answer', 'prompt'\]"):
        PPOTrainer(tiny_config(tmp_path, data__prompts=str(f)), verifier=count_sevens)


@pytest.mark.parametrize("overrides,field", [
    ({"threads": -1}, "threads"),
    ({"log__save_every": -1}, "log.save_every"),
    ({"optim__warmup_steps": -2}, "optim.warmup_steps"),
    ({"critic__warmup_iterations": -1}, "critic.warmup_iterations"),
    ({"rollout__min_new_tokens": 9, "rollout__max_new_tokens": 8}, "rollout.min_new_tokens"),
    ({"model__builtin_hidden_size": 30}, "model.builtin_hidden_size"),
    ({"model__builtin_heads": 0}, "model.builtin_heads"),
    ({"model__builtin_layers": 0}, "model.builtin_layers"),
    ({"algo__adaptive_kl_target": 1.0, "algo__adaptive_kl_horizon": 1.0}, "algo.adaptive_kl_horizon"),
    ({"algo__adaptive_kl_target": 1.0, "algo__kl_coef": 0.0}, "algo.kl_coef"),
])
def test_start_up_checks_name_the_field(tmp_path, overrides, field):
    cfg = tiny_config(tmp_path, **overrides)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        validate_config(cfg)


def test_config_file_problems_exit_2_with_one_line(tmp_path, capsys):
    typo = tmp_path / "typo.yaml"
    typo.write_text("algo:\n  gae_lambd: 0.9\n")
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    for path, message in ((typo, "did you mean `gae_lambda`"), (binary, "not a text (UTF-8) file")):
        with pytest.raises(SystemExit) as e:
            main(["train", "--config", str(path)])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err


def test_exponents_without_a_dot_are_numbers(tmp_path):
    f = tmp_path / "lr.yaml"
    f.write_text("optim:\n  actor_lr: 1e-4\ncritic:\n  lr: 5E-6\n")
    cfg = load_yaml(f, TrainConfig)
    assert (cfg.optim.actor_lr, cfg.critic.lr) == (1e-4, 5e-6)


def test_builtin_prompt_settings_are_checked_only_when_used(tmp_path):
    for overrides, field in (({"data__builtin_num_prompts": 0}, "data.builtin_num_prompts"),
                             ({"data__prompt_column": "question"}, "data.prompt_column")):
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            PPOTrainer(tiny_config(tmp_path, **overrides), verifier=count_sevens)
    # rows passed from Python use their own column
    rows = [{"question": f"Solve x+{i}=9\n"} for i in range(8)]
    PPOTrainer(tiny_config(tmp_path, data__prompt_column="question"), prompt_rows=rows, verifier=count_sevens)


def test_prompt_rows_from_python_must_share_their_columns(tmp_path):
    rows = [{"prompt": f"Solve x+{i}=9\n", "answer": str(9 - i)} for i in range(8)]
    del rows[3]["answer"]
    with pytest.raises(ConfigError, match=r"`prompt_rows`: row 3 has columns"):
        PPOTrainer(tiny_config(tmp_path), prompt_rows=rows, verifier=count_sevens)
