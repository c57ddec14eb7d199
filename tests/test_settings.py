"""Settings carry their rules (ppo_lm.runtime.settings): ranges and "may change on resume" are declared
with each field of the config dataclasses, and the choices of a config agree with the registries."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field

import pytest

from ppo_lm.algorithms import ADVANTAGE_ESTIMATORS, AGG_MODES, KL_ESTIMATORS, POLICY_LOSSES
from ppo_lm.config.train import AlgoConfig, OptimConfig, TrainConfig
from ppo_lm.config.validate import validate_config
from ppo_lm.runtime.errors import ConfigError
from ppo_lm.runtime.settings import Range, check_ranges, resumable, setting
from ppo_lm.stages import RMConfig, SFTConfig
from ppo_lm.stages._common import StageConfig


@dataclass
class _Inner:
    rate: float = setting(0.5, ge=0, lt=1)
    pair: tuple[float, float] = setting((0.1, 0.2), gt=0, finite=True)


@dataclass
class _Outer:
    count: int = setting(1, ge=1, resume=True)
    limit: float | None = setting(None, gt=0)
    inner: _Inner = setting(default_factory=_Inner, resume=True)
    other: _Inner = field(default_factory=_Inner)


@pytest.mark.parametrize("rule,text", [
    (Range(ge=1), "be >= 1"),
    (Range(gt=0, finite=True), "be a finite number > 0"),
    (Range(ge=0, lt=1), "lie in [0, 1)"),
    (Range(gt=0, le=1), "lie in (0, 1]"),
    (Range(gt=1), "be > 1"),
])
def test_a_range_says_what_a_value_must_be(rule, text):
    assert rule.describe() == text


@pytest.mark.parametrize("value,ok", [(0.0, True), (0.999, True), (1.0, False), (-1e-9, False),
                                      (float("nan"), False)])
def test_a_range_holds_its_bounds_and_refuses_nan(value, ok):
    assert Range(ge=0, lt=1).holds(value) is ok


def test_check_ranges_names_the_nested_field_and_the_element():
    check_ranges(_Outer())  # the defaults hold, None passes
    with pytest.raises(ConfigError, match=r"^`count` must be >= 1, got 0$"):
        check_ranges(_Outer(count=0), error=ConfigError)
    with pytest.raises(ValueError, match=r"^`s.other.rate` must lie in \[0, 1\), got 1.0$"):
        check_ranges(_Outer(other=_Inner(rate=1.0)), "s.")
    with pytest.raises(ValueError, match=r"`inner.pair\[1\]` must be a finite number > 0, got inf"):
        check_ranges(_Outer(inner=_Inner(pair=(0.1, float("inf")))))
    with pytest.raises(ValueError, match=r"`limit` must be > 0, got -2"):
        check_ranges(_Outer(limit=-2))


def test_resumable_lists_fields_and_whole_sections():
    assert resumable(_Outer) == ["count", "inner."]


def test_what_a_resume_may_change_is_declared_on_the_train_config_fields():
    """The fields a resumed run may set differently: its length, logging, devices and the speed
    settings that do not change results (the list the trainer compared against before the rules moved
    onto the fields)."""
    assert set(resumable(TrainConfig)) == {
        "iterations", "resume", "auto_resume", "output_dir", "threads", "log.", "model.device", "model.cpu_lanes",
        "model.compile_kernels", "model.gradient_checkpointing", "rollout.forward_batch_size",
        "optim.micro_batch_size", "data.eval_prompts", "data.eval_split", "data.builtin_eval_prompts", "data.task_eval_size",
        "data.eval_max_prompts"}


def test_every_numeric_train_setting_with_a_bound_refuses_a_value_outside_it(tmp_path):
    """Walk every ranged field of TrainConfig: a value just outside its range is a ConfigError naming it."""
    def ranged(cls, prefix=""):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                yield from ranged(hints[f.name], f"{prefix}{f.name}.")
            elif "ppo_lm.rule" in f.metadata:
                yield f"{prefix}{f.name}", f.metadata["ppo_lm.rule"]

    found = list(ranged(TrainConfig))
    assert len(found) >= 40
    for name, rule in found:
        bad = (rule.ge - 1 if rule.ge is not None else rule.gt if rule.gt is not None else
               rule.le + 1 if rule.le is not None else rule.lt if rule.lt is not None else float("inf"))
        cfg = TrainConfig(output_dir=str(tmp_path))
        *path, last = name.split(".")
        holder = cfg
        for part in path:
            holder = getattr(holder, part)
        old = getattr(holder, last)
        setattr(holder, last, (bad, *old[1:]) if isinstance(old, tuple) else [float(bad)] if isinstance(old, list)
                else int(bad) if isinstance(old, int) else float(bad))
        with pytest.raises(ConfigError, match=f"`{name}(\\[0\\])?` must"):
            validate_config(cfg)


def test_the_stage_configs_share_one_base():
    shared = {f.name for f in dataclasses.fields(StageConfig)}
    assert {f.name for f in dataclasses.fields(SFTConfig)} == shared
    assert {f.name for f in dataclasses.fields(RMConfig)} == shared | {"normalize"}
    assert SFTConfig().lr == RMConfig().lr == StageConfig().lr


def test_the_config_choices_are_the_registries():
    hints = typing.get_type_hints(AlgoConfig)
    assert set(typing.get_args(hints["estimator"])) == set(ADVANTAGE_ESTIMATORS)
    assert set(typing.get_args(hints["policy_loss"])) == set(POLICY_LOSSES)
    assert set(typing.get_args(hints["loss_agg"])) == {"auto", *AGG_MODES}
    assert set(typing.get_args(hints["kl_estimator"])) == {"auto", *KL_ESTIMATORS}
    from ppo_lm.runtime.optim import LR_SCHEDULES

    assert set(typing.get_args(typing.get_type_hints(OptimConfig)["schedule"])) == set(LR_SCHEDULES)
    assert set(typing.get_args(typing.get_type_hints(StageConfig)["schedule"])) == set(LR_SCHEDULES)


def test_the_shipped_presets_load_and_validate():
    """The YAML presets hold only known, valid settings; the demo uses its preset, and the file under
    examples/ is the one the package ships."""
    from pathlib import Path

    from ppo_lm.cli.demo import DemoConfig
    from ppo_lm.config.io import load_yaml
    from ppo_lm.presets import preset

    root = Path(__file__).resolve().parents[1]
    demo = load_yaml(preset("demo_ppo"), TrainConfig)
    validate_config(demo)
    assert (demo.iterations, demo.rollout.num_prompts, demo.optim.actor_lr) == (400, 128, 5e-4)
    assert DemoConfig().ppo == demo
    assert (root / "examples" / "demo_ppo.yaml").resolve() == preset("demo_ppo").resolve()
    recipe = load_yaml(root / "examples" / "real_model" / "grpo.yaml", TrainConfig)
    validate_config(recipe)
    assert (recipe.algo.estimator, recipe.rollout.samples_per_prompt, recipe.log.report_to) == ("grpo", 8, [])
    from ppo_lm.cli.compare_plan import read_file_settings

    every, sections = read_file_settings(str(root / "examples" / "real_model" / "compare.yaml"))
    assert every["optim"]["actor_lr"] == recipe.optim.actor_lr and not sections  # GAE's critic: the auto defaults
