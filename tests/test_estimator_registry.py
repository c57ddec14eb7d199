"""The estimators are registered where they are defined (algorithms/registry.py), with the properties
the trainer reads — no estimator is compared by name outside the registry, and the names are listed once."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

from ppo_lm.algorithms.registry import ADVANTAGE_ESTIMATORS, estimator
from ppo_lm.config.io import _hints
from ppo_lm.config.train import AlgoConfig

SRC = Path(__file__).resolve().parents[1] / "src" / "ppo_lm"


def test_the_config_takes_exactly_the_registered_names():
    assert typing.get_args(_hints(AlgoConfig)["estimator"]) == tuple(ADVANTAGE_ESTIMATORS)


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="registered twice"):
        estimator("gae", needs_critic=True, needs_groups=False, uses_shaped_rewards=True)(lambda *a: None)


def test_no_estimator_is_compared_by_name_outside_the_registry():
    """Whitening, λ, the critic: properties of the spec (whitened_by_trainer, uses_lambda, needs_critic)."""
    pattern = re.compile(r"(?<!\w)estimator\s*[!=]=\s*['\"]")  # `a.estimator == "gae"`, not `kl_estimator`
    found = [f"{p.relative_to(SRC)}:{i}" for p in SRC.rglob("*.py") if p.parent.name != "algorithms"
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, found


def test_only_gae_is_whitened_by_the_trainer_and_uses_lambda():
    assert [n for n, s in ADVANTAGE_ESTIMATORS.items() if s.whitened_by_trainer] == ["gae"]
    assert [n for n, s in ADVANTAGE_ESTIMATORS.items() if s.uses_lambda] == ["gae"]
