"""A resumed run continues the same experiment: the CLI reads the run's own config.yaml, and settings
that would change the experiment are refused with the fields named."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from trainer_helpers import count_sevens, tiny_config

from ppo_lm.cli.main import main
from ppo_lm.runtime.errors import ConfigError
from ppo_lm.trainer.checkpoint.folders import write_manifest
from ppo_lm.trainer.ppo import PPOTrainer

TINY = ["--model.builtin-hidden-size", "32", "--rollout.num-prompts", "8", "--rollout.max-new-tokens", "4",
        "--optim.epochs", "1", "--data.builtin-num-prompts", "64", "--seed", "3",
        "--log.save-every", "1", "--log.no-progress", "--log.no-tensorboard"]


def test_cli_resume_reads_the_runs_own_settings(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["train", "--output-dir", out, "--iterations", "1", *TINY]) == 0
    # docs/training.md's "continue up to N": no other flag repeated
    assert main(["train", "--output-dir", out, "--iterations", "2", "--resume", "--threads", "1"]) == 0
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["iterations"] == 2 and saved["seed"] == 3
    assert saved["model"]["builtin_hidden_size"] == 32 and saved["rollout"]["num_prompts"] == 8
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2]
    # a flag that changes the experiment is refused, naming it
    capsys.readouterr()
    assert main(["train", "--output-dir", out, "--iterations", "3", "--resume", "--rollout.num-prompts", "16"]) == 2
    err = capsys.readouterr().err
    assert "rollout.num_prompts: 16 here, 8 in the run" in err


def test_resume_with_a_different_experiment_is_refused(tmp_path):
    PPOTrainer(tiny_config(tmp_path, iterations=1, log__save_every=1), verifier=count_sevens).train()
    cfg = tiny_config(tmp_path, iterations=2, resume=True, algo__clip_eps=0.3, log__save_every=1)
    cfg.model.cpu_lanes = 1  # a speed setting may change
    with pytest.raises(ConfigError, match=r"algo\.clip_eps: 0\.3 here, 0\.2 in the run"):
        PPOTrainer(cfg, verifier=count_sevens).train()


def test_extending_a_decaying_schedule_warns(tmp_path):
    PPOTrainer(tiny_config(tmp_path, iterations=1, log__save_every=1, optim__schedule="linear"),
               verifier=count_sevens).train()
    cfg = tiny_config(tmp_path, iterations=2, resume=True, log__save_every=1, optim__schedule="linear")
    with pytest.warns(UserWarning, match="schedule over 1 iterations"):
        PPOTrainer(cfg, verifier=count_sevens).train()


def test_resume_compares_settings_as_they_run(tmp_path):
    """An explicit value equal to what "auto" chose for the run is the same experiment."""
    PPOTrainer(tiny_config(tmp_path, iterations=1, log__save_every=1), verifier=count_sevens).train()
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert saved["algo"]["kl_in"] == "auto"
    cfg = tiny_config(tmp_path, iterations=2, resume=True, log__save_every=1, algo__kl_in="reward",
                      algo__kl_estimator="k1")
    PPOTrainer(cfg, verifier=count_sevens).train()


def test_an_old_grpo_run_resumes_without_its_inert_kl(tmp_path, capsys):
    """Runs written before kl_in=auto saved `kl_in: reward` with GRPO, where the KL had no effect;
    they resume with `--algo.kl-coef 0`, which computes the same, and the refusal says so."""
    out = str(tmp_path / "run")
    grpo = ["--algo.estimator", "grpo", "--rollout.samples-per-prompt", "2", "--algo.kl-coef", "0"]
    assert main(["train", "--output-dir", out, "--iterations", "1", *TINY, *grpo]) == 0
    path = tmp_path / "run" / "config.yaml"
    saved = yaml.safe_load(path.read_text())
    saved["algo"].update(kl_in="reward", kl_estimator="k1", kl_coef=0.05)  # as the old code wrote it
    path.write_text(yaml.safe_dump(saved))
    state_path = tmp_path / "run" / "checkpoints" / "iter_000001" / "trainer_state.pt"
    state = torch.load(state_path, weights_only=False)
    state["kl_ctl"]["value"] = 0.05  # and the β its controller held
    torch.save(state, state_path)
    write_manifest(state_path.parent)  # (the old code's checkpoint, as it would have been written)
    capsys.readouterr()
    assert main(["train", "--output-dir", out, "--iterations", "2", "--resume"]) == 2
    assert "--algo.kl-coef 0" in capsys.readouterr().err
    assert main(["train", "--output-dir", out, "--iterations", "2", "--resume", "--algo.kl-coef", "0"]) == 0
    # the KL placement may change too: the run still has no KL term, whatever β its checkpoint holds
    assert main(["train", "--output-dir", out, "--iterations", "3", "--resume", "--algo.kl-coef", "0",
                 "--algo.kl-in", "auto"]) == 0
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["iteration"] == 3 and last["kl_coef"] == 0.0 and "kl_loss" not in last
