"""A user's mistake is one line and exit status 2, found before any model loads where it can be
(docs/errors.md): model and tokenizer directories, the output directory, prompt data, reward
functions."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from trainer_helpers import tiny_config

from ppo_lm.cli.main import main
from ppo_lm.config.train import TrainConfig
from ppo_lm.models.loading import ModelLoadError, check_model_dir, load_model
from ppo_lm.rollout.score.reward import load_verifier, score_with_verifier
from ppo_lm.runtime.errors import ConfigError
from ppo_lm.trainer import roles
from ppo_lm.trainer.ppo import PPOTrainer

TRAIN = ["train", "--threads", "1", "--iterations", "1", "--rollout.num-prompts", "8", "--log.no-progress",
         "--log.no-tensorboard"]


def _train(capsys, *args) -> str:
    rc = main([*TRAIN, *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert err.startswith("ppo-lm: error: ") and "Traceback" not in err
    return err


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_policy_directory_problems_are_one_line_before_loading(tmp_path, capsys, saved_policy, no_model_loads):
    out = ["--output-dir", str(tmp_path / "run")]
    assert "does not exist" in _train(capsys, "--model.policy", str(tmp_path / "nope"), *out)
    (tmp_path / "file").write_text("x")
    assert "is a file" in _train(capsys, "--model.policy", str(tmp_path / "file"), *out)
    (tmp_path / "empty").mkdir()
    assert "empty directory" in _train(capsys, "--model.policy", str(tmp_path / "empty"), *out)
    garbage = _copy(saved_policy, tmp_path / "garbage")
    (garbage / "config.json").write_text("{not json")
    assert "config.json is not valid JSON" in _train(capsys, "--model.policy", str(garbage), *out)
    no_type = _copy(saved_policy, tmp_path / "no_type")
    (no_type / "config.json").write_text("{}")
    assert "no `model_type`" in _train(capsys, "--model.policy", str(no_type), *out)
    unknown = _copy(saved_policy, tmp_path / "unknown")
    cfg = json.loads((unknown / "config.json").read_text())
    (unknown / "config.json").write_text(json.dumps({**cfg, "model_type": "qwen99"}))
    assert "'qwen99' is unknown to transformers" in _train(capsys, "--model.policy", str(unknown), *out)
    no_weights = _copy(saved_policy, tmp_path / "no_weights")
    (no_weights / "model.safetensors").unlink()
    assert "holds no weights" in _train(capsys, "--model.policy", str(no_weights), *out)
    no_config = _copy(saved_policy, tmp_path / "no_config")
    (no_config / "config.json").unlink()
    assert "holds no config.json" in _train(capsys, "--model.policy", str(no_config), *out)
    no_tok = _copy(saved_policy, tmp_path / "no_tok")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (no_tok / f).unlink()
    assert "holds no tokenizer" in _train(capsys, "--model.policy", str(no_tok), *out)
    long = _train(capsys, "--model.policy", str(saved_policy), "--rollout.max-new-tokens", "600", *out)
    assert "`rollout.max_new_tokens`=600 leaves no room for a prompt" in long and "lower it below 128" in long


def test_a_critic_is_refused_as_policy(tmp_path, capsys, saved_policy, no_model_loads):
    """A run's critic/ (a token-classification model) is not a causal LM; found from config.json."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    critic = tmp_path / "critic"
    cfg = AutoConfig.from_pretrained(saved_policy)
    cfg.num_labels = 1
    AutoModelForTokenClassification.from_config(cfg).save_pretrained(critic)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (critic / f).write_bytes((saved_policy / f).read_bytes())
    err = _train(capsys, "--model.policy", str(critic), "--output-dir", str(tmp_path / "run"))
    assert "token-classification model" in err and "not a causal language model" in err


def test_a_policy_without_lm_head_weights_is_refused(tmp_path, saved_policy):
    """config.json says causal LM but the weights have no head: refused rather than trained from a
    random head (found at load time, from transformers' missing keys)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    d = _copy(saved_policy, tmp_path / "headless")
    sd = load_file(d / "model.safetensors")
    save_file({k: v for k, v in sd.items() if not k.startswith("lm_head")}, d / "model.safetensors",
              metadata={"format": "pt"})
    check_model_dir(d, "model.policy", "causal-lm")  # nothing to see without loading
    with pytest.raises(ModelLoadError, match=r"no language-model head weights \(lm_head.weight\)"):
        load_model(AutoModelForCausalLM, d, "model.policy", "causal-lm")
    with pytest.raises(ModelLoadError, match="model.policy"):
        PPOTrainer(tiny_config(tmp_path / "run", model__policy=str(d)))


def test_truncated_weights_are_one_line(tmp_path, capsys, saved_policy):
    d = _copy(saved_policy, tmp_path / "cut")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    err = _train(capsys, "--model.policy", str(d), "--output-dir", str(tmp_path / "run"))
    assert "could not be loaded" in err and "model.policy" in err


def test_reward_model_and_critic_init_directories_are_checked(tmp_path, capsys, saved_policy, no_model_loads):
    out = ["--output-dir", str(tmp_path / "run")]
    err = _train(capsys, "--model.reward", str(saved_policy), *out)
    assert "`model.reward`" in err and "not a one-label sequence-classification reward model" in err
    assert "does not exist" in _train(capsys, "--critic.init", str(tmp_path / "nope"), *out)


def test_cheap_checks_come_before_any_model(tmp_path, capsys, no_model_loads):
    run = tmp_path / "run"
    err = _train(capsys, "--data.prompts", str(tmp_path / "missing.jsonl"), "--model.reward", "builtin:equations",
                 "--output-dir", str(run))
    assert "no such file" in err and "data.prompts" in err
    run.mkdir(exist_ok=True)
    (run / "metrics.jsonl").write_text('{"iteration": 1}\n')
    assert "already holds a run" in _train(capsys, "--output-dir", str(run))
    err = _train(capsys, "--model.reward", "no_such_module_xyz:fn", "--output-dir", str(tmp_path / "r2"))
    assert "cannot import module 'no_such_module_xyz'" in err


def test_a_folder_another_run_writes_is_one_line_before_loading(tmp_path, capsys, no_model_loads):
    from test_files import _holder

    run = tmp_path / "run"
    run.mkdir()
    proc = _holder(run)
    try:
        err = _train(capsys, "--output-dir", str(run), "--auto-resume")
    finally:
        proc.kill()
        proc.wait()
    assert f"another process (pid {proc.pid}) is writing to" in err and "--output-dir" in err


def test_reward_from_a_file_and_from_the_current_directory(tmp_path, monkeypatch):
    (tmp_path / "helper_mod_abc.py").write_text("BONUS = 2.0\n")
    (tmp_path / "my_rewards_abc.py").write_text(textwrap.dedent("""
        from helper_mod_abc import BONUS

        def score(prompts, responses, **columns):
            return [BONUS for _ in responses]
    """))
    fn = load_verifier(f"{tmp_path / 'my_rewards_abc.py'}:score")
    assert fn(["p"], ["r"]) == [2.0]  # and its sibling module imported, as for a script

    # a console script does not put the current directory on sys.path; ppo-lm does, as `python -m` would
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    sys.modules.pop("my_rewards_abc", None)
    assert load_verifier("my_rewards_abc:score")(["p"], ["r"]) == [2.0]


def test_reward_spec_errors(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        load_verifier(f"{tmp_path / 'none.py'}:fn")
    (tmp_path / "broken_reward_abc.py").write_text("def score(:\n")
    with pytest.raises(ValueError, match=r"(?s)SyntaxError.*broken_reward_abc.py:1: def score"):
        load_verifier(f"{tmp_path / 'broken_reward_abc.py'}:score")
    (tmp_path / "some_reward_abc.py").write_text("def scorer(p, r, **c):\n    return [0.0] * len(r)\n")
    with pytest.raises(ValueError, match=r"has no function 'score' \(it defines: scorer\)"):
        load_verifier(f"{tmp_path / 'some_reward_abc.py'}:score")
    with pytest.raises(ConfigError, match="model.reward"):
        roles.load_reward_verifier("nocolon", TrainConfig())


def test_a_raising_reward_shows_the_users_own_lines(tmp_path):
    (tmp_path / "raising_reward_abc.py").write_text(textwrap.dedent("""
        def parse(text):
            return int(text)

        def score(prompts, responses, **columns):
            return [parse(r) for r in responses]
    """))
    fn = load_verifier(f"{tmp_path / 'raising_reward_abc.py'}:score")
    from ppo_lm.rollout.score.reward import RewardError

    with pytest.raises(RewardError) as e:
        score_with_verifier(fn, ["1+1="], ["two"], {})
    msg = str(e.value)
    assert "ValueError: invalid literal for int()" in msg
    assert "raising_reward_abc.py:6 in score: return [parse(r) for r in responses]" in msg
    assert "raising_reward_abc.py:3 in parse: return int(text)" in msg
    assert "ppo_lm" not in msg.split("first prompt")[0].replace("raising_reward_abc", "")


def test_a_hub_id_offline_is_one_line(tmp_path, capsys, monkeypatch, no_model_loads):
    from huggingface_hub import constants, file_download

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    err = _train(capsys, "--model.policy", "no-such-org-xyz/no-such-model", "--output-dir", str(tmp_path / "run"))
    assert "is not a local path, and the Hugging Face Hub is switched off (HF_HUB_OFFLINE is set)" in err

    def unreachable(*a, **k):  # what huggingface_hub raises when the network is down
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(file_download, "hf_hub_download", unreachable)
    monkeypatch.setattr("huggingface_hub.hf_hub_download", unreachable)
    err = _train(capsys, "--model.policy", "no-such-org-xyz/no-such-model", "--output-dir", str(tmp_path / "run"))
    assert "loading it as a Hugging Face Hub id failed (We couldn't connect" in err and "offline" in err
