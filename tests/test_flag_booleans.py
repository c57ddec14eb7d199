"""Flags take booleans as the docs and config files spell them: `--algo.bootstrap-truncated false`,
`--log.progress off`, `--resume yes` — YAML's words in any case, and 1/0 — on every command, for a plain
boolean (a --x/--no-x switch) and for a boolean that may also be `auto`."""

from __future__ import annotations

import pytest
import tyro
import yaml

from ppo_lm.cli import compare
from ppo_lm.cli.demo import DemoConfig
from ppo_lm.cli.main import _parse
from ppo_lm.cli.stages import SFTCommand
from ppo_lm.config.io import dump_yaml, yaml_bool_flags
from ppo_lm.config.train import TrainConfig
from ppo_lm.runtime.errors import UsageError
from ppo_lm.runtime.settings import yaml_bool

TRUE_WORDS = ["true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON", "tRuE", "1"]
FALSE_WORDS = ["false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF", "fAlSe", "0"]


def test_yaml_bool_reads_yaml_words_as_yaml_does():
    for word in TRUE_WORDS + FALSE_WORDS:
        assert yaml_bool(word) is (word in TRUE_WORDS)
        if word not in ("tRuE", "fAlSe", "1", "0"):  # the spellings PyYAML resolves to a boolean read alike
            assert yaml.safe_load(f"x: {word}")["x"] is yaml_bool(word)
    for word in ("maybe", "", "2", "auto", "y"):
        with pytest.raises(ValueError, match="is not a boolean; give true or false"):
            yaml_bool(word)


@pytest.mark.parametrize("word", TRUE_WORDS + FALSE_WORDS)
def test_every_spelling_sets_a_switch_and_an_auto_able_boolean(word):
    """A plain boolean whose default is True (`log.progress`) or False (`model.fsdp`, `resume`), and
    `algo.bootstrap_truncated` (true, false or auto), as `--flag WORD` and as `--flag=WORD`."""
    want = word in TRUE_WORDS
    for form in (lambda f: [f, word], lambda f: [f"{f}={word}"]):
        argv = [*form("--log.progress"), *form("--model.fsdp"), *form("--resume"), *form("--algo.bootstrap-truncated")]
        c = tyro.cli(TrainConfig, args=yaml_bool_flags(TrainConfig, argv), default=TrainConfig())
        assert (c.log.progress, c.model.fsdp, c.resume, c.algo.bootstrap_truncated) == (want,) * 4


def test_other_words_and_flags_pass_unchanged():
    argv = ["--algo.bootstrap-truncated", "auto", "--model.pad-token", "yes", "--log.progress", "--model.no-fsdp",
            "--rollout.max-new-tokens", "0", "--log.tensorboard", "maybe"]
    assert yaml_bool_flags(TrainConfig, argv) == argv
    # underscores as the parser takes them; the switch's `no-` form built on dashes
    assert yaml_bool_flags(TrainConfig, ["--auto_resume", "off", "--algo.bootstrap_truncated=No"]) == \
        ["--no-auto-resume", "--algo.bootstrap-truncated", "False"]


@pytest.mark.parametrize("cls, argv, read", [
    (TrainConfig, ["--algo.bootstrap-truncated", "false", "--log.progress", "off", "--model.lora-head", "1"],
     lambda c: (c.algo.bootstrap_truncated, c.log.progress, c.model.lora_head) == (False, False, True)),
    (TrainConfig, ["--algo.bootstrap-truncated", "auto", "--log.tensorboard", "NO"],
     lambda c: (c.algo.bootstrap_truncated, c.log.tensorboard) == ("auto", False)),
    (DemoConfig, ["--rlhf", "yes", "--ppo.algo.whiten-advantages", "false", "--ppo.algo.bootstrap-truncated", "On"],
     lambda c: (c.rlhf, c.ppo.algo.whiten_advantages, c.ppo.algo.bootstrap_truncated) == (True, False, True)),
    (SFTCommand, ["--overwrite", "true"], lambda c: c.overwrite is True),
])
def test_the_commands_take_yaml_booleans(cls, argv, read):
    """`ppo-lm train`, `demo` (its `--ppo.*` settings too) and `sft` read their flags through one parser."""
    assert read(_parse(cls, argv, "ppo-lm test", "test"))


def test_resume_yes_reads_the_runs_settings_and_resume_no_does_not(tmp_path):
    """`--resume` decides, before the flags are parsed, whether the run's config.yaml is the base: its
    spelled-out forms decide alike."""
    dump_yaml(TrainConfig(iterations=7), tmp_path / "config.yaml")
    out = ["--output-dir", str(tmp_path)]
    for argv, resume, iterations in ((["--resume", "yes"], True, 7), (["--auto-resume=ON"], False, 7),
                                     (["--resume", "false"], False, TrainConfig().iterations)):
        c = _parse(TrainConfig, [*out, *argv], "ppo-lm train", "test", resumable=True)
        assert (c.resume, c.iterations) == (resume, iterations), argv


def test_a_word_that_is_no_boolean_is_still_refused(capsys):
    with pytest.raises(SystemExit) as e:
        _parse(TrainConfig, ["--algo.bootstrap-truncated", "maybe"], "ppo-lm train", "test")
    assert e.value.code == 2 and "maybe" in capsys.readouterr().err


def test_compare_switches_take_yaml_booleans(tmp_path):
    out = ["--output-dir", str(tmp_path)]
    assert compare.parse_args([*out, "--overwrite", "false", "--smoke", "yes"]).overwrite is False
    c = compare.parse_args([*out, "--overwrite", "--smoke", "Off"])
    assert c.overwrite is True and c.smoke is False and c.iterations == compare.CompareConfig().iterations
    assert compare.parse_args([*out, "--smoke", "1"]).iterations == compare.SMOKE_ITERATIONS
    with pytest.raises(UsageError, match="unrecognized arguments: maybe"):
        compare.parse_args([*out, "--overwrite", "maybe"])
    with pytest.raises(UsageError, match="--overwrite: ignored explicit argument 'maybe'"):
        compare.parse_args([*out, "--overwrite=maybe"])


def test_every_commands_switches_take_yaml_booleans():
    """The switches of the argparse commands (bench, export, compare, …) as the config's flags: bare,
    or given a YAML boolean as the next word or after `=`; a word that is not one stays an argument."""
    from ppo_lm.runtime.errors import ArgumentParser

    p = ArgumentParser(prog="x")
    p.add_argument("path", nargs="?")
    p.add_argument("--json", action="store_true")
    assert p.parse_args(["--json"]).json is True and p.parse_args([]).json is False
    for word, value in (("yes", True), ("On", True), ("1", True), ("false", False), ("NO", False), ("0", False)):
        assert p.parse_args(["--json", word]).json is value and p.parse_args([f"--json={word}"]).json is value
    assert vars(p.parse_args(["--json", "run_dir"])) == {"json": True, "path": "run_dir"}
    assert vars(p.parse_args(["run_dir", "--json", "off"])) == {"json": False, "path": "run_dir"}
