"""The critic kinds are registered in one place (config/critics.py) with what the rest of the package
asks of them; nothing else compares a kind by name, and the unused-setting rules follow the registry."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest
from trainer_helpers import tiny_config

from ppo_lm.config import critics
from ppo_lm.config.train import TrainConfig
from ppo_lm.config.unused import unused_settings
from ppo_lm.config.unused_rules import Facts

PKG = Path(__file__).resolve().parents[1] / "src" / "ppo_lm"
KINDS = critics.CriticKind.REGISTRY
READ = Facts(files_read=True, torchrun=False, cuda=False, chat_prompts=False)


def test_critic_kind_takes_the_registered_kinds():
    hints = typing.get_type_hints(critics.CriticConfig)
    assert set(typing.get_args(hints["kind"])) == {"auto", *critics.SELECTABLE}
    assert set(KINDS) == {*critics.SELECTABLE, "none"}
    for kind in KINDS.values():
        assert kind.settings <= set(critics.KIND_SETTINGS), kind.name
        assert (kind.values_from is None) == (kind is critics.NONE)
        assert kind.own_body == (kind.values_from == "critic")


def test_nothing_outside_the_registry_compares_a_kind_by_name():
    """No comparison of a critic's kind with one of the registered names (``m.critic == "shared"``,
    ``kind in ("separate", …)``) anywhere in the package but config/critics.py."""
    names = set(KINDS)
    found = []
    for path in PKG.rglob("*.py"):
        if path == PKG / "config" / "critics.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            text = " ".join(ast.unparse(s) for s in sides)
            literals = {c.value for s in sides for c in ast.walk(s) if isinstance(c, ast.Constant)}
            if "critic" in text and literals & names:
                found.append(f"{path.relative_to(PKG)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, found


@pytest.mark.parametrize("name", critics.SELECTABLE)
def test_the_unused_setting_rules_follow_each_kinds_settings(tmp_path, name):
    """Each setting only some kinds read is refused with exactly the kinds that do not read it (and with
    every kind under a critic-free estimator)."""
    given = {"critic.init": "policy", "critic.lora_r": 4, "critic.value_grad_scale": 0.5}
    for field, value in given.items():
        if field == "critic.lora_r" and name == "frozen":
            continue  # refused outright: validate.py (test_critic_variants.py)
        cfg = tiny_config(tmp_path, critic__kind=name, **{field.replace(".", "__"): value})
        found = {u.field: u for u in unused_settings(cfg, READ)}
        reads = field in KINDS[name].settings
        assert (field in found) != reads, (name, field, found.get(field))
        if not reads:
            assert found[field].refused and f"a {name} critic" in found[field].message
        free = tiny_config(tmp_path, critic__kind=name, algo__estimator="grpo", rollout__samples_per_prompt=2,
                           **{field.replace(".", "__"): value})
        assert field in {u.field for u in unused_settings(free, READ)}


def test_auto_resolves_in_one_place():
    assert critics.resolve_auto(135_000_000, env=False) is KINDS["shared"]
    assert critics.resolve_auto(7_000_000_000, env=False) is KINDS["separate"]
    assert critics.resolve_auto(None, env=True) is KINDS["separate"]
    assert critics.resolve_auto(None, env=False) is None


@pytest.mark.parametrize("name, over, line", [
    ("separate", {}, "  critic    BODY"),
    ("separate", {"lora_r": 4}, "  critic    BODY; its body frozen (LoRA r 4 and the value head train)"),
    ("frozen", {}, "  critic    BODY; its body frozen (the value head trains)"),
    ("shared", {}, "  critic    shared: a value head on the policy's body, trained alone (no value-loss gradient "
                   "reaches the body)"),
    ("shared", {"value_grad_scale": 0.5}, "  critic    shared: a value head on the policy's body, its value-loss "
                                          "gradient × 0.5 into the body"),
])
def test_each_kind_gives_its_banner_line(name, over, line):
    cfg = TrainConfig(critic=critics.CriticConfig(kind=name, **over))
    assert KINDS[name].banner(cfg, "BODY") == line
    assert critics.NONE.banner(cfg, "BODY") == ""
