"""Settings that moved keep working: a file, a flag or a run's config.yaml that names a setting by its
older name (the critic's settings before they had their own section) is read under the new name with
one line that says so; both names at once is an error naming both."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import yaml
from test_checkpoints import TINY

from ppo_lm.cli.main import _parse, main
from ppo_lm.config.critics import CriticConfig
from ppo_lm.config.io import from_dict, load_saved_config, load_yaml, respell_renamed
from ppo_lm.config.train import RENAMED, TrainConfig
from ppo_lm.runtime.errors import ConfigError

OLD = {"model": {"critic": "frozen", "critic_init": "policy", "critic_lora_r": 0, "value_grad_scale": 0.5,
                 "policy": "builtin"},
       "optim": {"critic_lr": 3e-4, "critic_epochs": 2, "critic_warmup_iterations": 1, "epochs": 3},
       "algo": {"vf_coef": 0.25, "value_clip_eps": None, "critic_lambda": 1.0, "critic_target": "score"}}
NEW = CriticConfig(kind="frozen", init="policy", lora_r=0, value_grad_scale=0.5, lr=3e-4, epochs=2,
                   warmup_iterations=1, vf_coef=0.25, value_clip_eps=None, gae_lambda=1.0, target="score")


def test_the_table_maps_names_that_are_gone_to_names_that_exist():
    cfg = TrainConfig()
    for old, new in RENAMED.items():
        section, field = new.split(".")
        assert hasattr(getattr(cfg, section), field), new
        section, field = old.split(".")
        assert not hasattr(getattr(cfg, section), field), old
    assert set(RENAMED.values()) == {f"critic.{f.name}" for f in dataclasses.fields(CriticConfig)}


def test_a_file_with_the_older_names_reads_as_the_new_ones_with_one_notice(tmp_path):
    f = tmp_path / "old.yaml"
    f.write_text(yaml.safe_dump(OLD))
    with pytest.warns(UserWarning) as seen:
        cfg = load_yaml(f, TrainConfig)
    assert cfg.critic == NEW and cfg.optim.epochs == 3 and cfg.model.policy == "builtin"
    (notice,) = [str(w.message) for w in seen]
    assert notice.startswith("renamed settings read under their new names: `model.critic` → `critic.kind`, ")
    assert "`algo.critic_lambda` → `critic.gae_lambda`" in notice and notice.count("→") == len(RENAMED)
    assert OLD["model"]["critic"] == "frozen"  # the caller's dict is left as it was


def test_an_older_and_a_newer_name_of_one_setting_is_an_error_naming_both():
    with pytest.raises(ConfigError, match=r"`optim.critic_lr` and `critic.lr` are both given: .*keep `critic.lr` alone"):
        from_dict(TrainConfig, {"optim": {"critic_lr": 1e-3}, "critic": {"lr": 1e-4}})
    with pytest.raises(ConfigError, match=r"`per_estimator.gae.model.critic` and `per_estimator.gae.critic.kind`"):
        respell_renamed(TrainConfig, {"model": {"critic": "shared"}, "critic": {"kind": "frozen"}},
                        where="per_estimator.gae")


def test_older_flags_parse_as_the_new_ones(recwarn):
    cfg = _parse(TrainConfig, ["--model.critic=shared", "--optim.critic-lr", "2e-4", "--algo.critic_target", "score",
                               "--critic.vf-coef", "0.5"], "ppo-lm train", "test")
    assert (cfg.critic.kind, cfg.critic.lr, cfg.critic.target, cfg.critic.vf_coef) == ("shared", 2e-4, "score", 0.5)
    (notice,) = [str(w.message) for w in recwarn if "renamed" in str(w.message)]
    assert notice.startswith("renamed flags read under their new names: `--model.critic` → `--critic.kind`, "
                             "`--optim.critic-lr` → `--critic.lr`, `--algo.critic_target` → `--critic.target`")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new names alone: no notice
        _parse(TrainConfig, ["--critic.kind", "shared", "--critic.lr", "2e-4"], "ppo-lm train", "test")


def test_a_run_written_with_the_older_names_resumes(tmp_path, capsys):
    """A run's config.yaml from before the rename: ``--resume`` reads it (no "settings differ" error), goes
    on, and writes it back under the new names."""
    run = tmp_path / "run"
    args = [*TINY, "--critic.kind", "separate", "--critic.lr", "2e-3"]
    assert main(["train", "--output-dir", str(run), "--iterations", "1", *args]) == 0
    saved = yaml.safe_load((run / "config.yaml").read_text())
    critic = saved.pop("critic")
    saved["model"]["critic"], saved["optim"]["critic_lr"] = critic.pop("kind"), critic.pop("lr")
    for old, new in RENAMED.items():
        section, field = old.split(".")
        if new.split(".")[1] in critic:
            saved[section][field] = critic.pop(new.split(".")[1])
    assert not critic
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    assert load_saved_config(run / "config.yaml", TrainConfig)["critic"]["lr"] == 2e-3
    assert main(["train", "--output-dir", str(run), "--iterations", "2", "--resume"]) == 0
    assert main(["train", "--output-dir", str(run), "--iterations", "3", "--resume", *args]) == 0
    rewritten = yaml.safe_load((run / "config.yaml").read_text())
    assert rewritten["critic"]["kind"] == "separate" and "critic" not in rewritten["model"]
    assert "differ" not in capsys.readouterr().err


def test_every_shipped_yaml_writes_todays_names():
    """The presets and examples are read without a rename notice: a user copying one learns the names
    as they are now (compare's per_estimator sections included)."""
    from pathlib import Path

    from ppo_lm.cli.compare_plan import read_file_settings

    root = Path(__file__).resolve().parents[1]
    files = sorted({*root.joinpath("examples").rglob("*.yaml"), *root.joinpath("src/ppo_lm/presets").glob("*.yaml")})
    assert len(files) >= 6
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for f in files:
            read_file_settings(str(f))


def test_a_run_written_when_the_reward_default_was_the_equations_resumes_under_auto(tmp_path):
    """`model.reward` was 'builtin:equations' by default before 'auto' named it: a run's config.yaml of
    then resumes with a --config that leaves the reward out (both name the same reward)."""
    run = tmp_path / "run"
    assert main(["train", "--output-dir", str(run), "--iterations", "1", *TINY]) == 0
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["model"]["reward"] == "auto"
    mine = {**saved, "iterations": 2, "resume": True}
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(mine))
    saved["model"]["reward"] = "builtin:equations"
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    assert main(["train", "--config", str(tmp_path / "mine.yaml")]) == 0
    saved["model"]["reward"] = "m.py:f"  # a different reward is a different run
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    assert main(["train", "--config", str(tmp_path / "mine.yaml"), "--iterations", "3"]) == 2
