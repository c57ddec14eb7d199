"""Settings a run would ignore: what a user names is read and used, or refused with one line that says
why this run does not use it and the fix — never silently accepted (docs/errors.md).

:data:`RULES` is the one table: the fields, when this run's path ignores them, and the fix. A setting
counts as given when it differs from its dataclass default (config/train.py), so a preset, or a
config.yaml that writes every field, passes wherever it leaves a field at its default. The table is
checked twice:

- by :func:`~ppo_lm.config.validate.validate_config`, from the settings alone: the rules that involve
  no setting naming a file (the estimator's critic, the KL, the policy loss, LoRA, logging), so
  ``ppo-lm compare`` and ``ppo-lm demo`` refuse them before anything runs;
- by the start-up checks (trainer/preflight.py) once every file the settings name has been read and
  checked — a missing or broken file is an error even where the run would not use it — with what they
  found (:class:`Facts`: the prompts' kind, torchrun, the device).

A resumed run keeps its own settings: those equal to its config.yaml's were accepted when it began,
and a resume may not change them, so they are not refused again (a rule added since would otherwise
leave the run impossible to continue).

A rule with :attr:`Rule.shared_by` only warns: a shipped workflow writes that setting for runs that
ignore it, and refusing it would break the workflow; the rule names it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple

from ..runtime.errors import ConfigError
from .train import TrainConfig
from .unused_rules import RULES, Facts, Rule

__all__ = ["RULES", "Facts", "Rule", "Unused", "check_unused", "unused_settings"]

UNKNOWN = Facts()
"""Nothing known beyond the settings: the rules that wait for the start-up checks are left out."""


class Unused(NamedTuple):
    field: str
    message: str
    refused: bool


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _plain(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def show(value: Any) -> str:
    """A value as a config file writes it: true/false, null, 'text', numbers and lists as they are."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else repr(_plain(value))


DEFAULTS = TrainConfig()


def unused_settings(cfg: TrainConfig, facts: Facts = UNKNOWN, keep: Mapping[str, Any] | None = None) -> list[Unused]:
    """Every setting of ``cfg`` given (not at its default) that this run would ignore, by :data:`RULES`,
    with the one-line message; ``keep``: a resumed run's own settings (flattened config.yaml), not
    refused again. Rules waiting for facts not known yet (``facts``) are left out."""
    keep = keep or {}
    found: dict[str, Unused] = {}
    for rule in RULES:
        if rule.after_files and not facts.files_read:
            continue
        for name in rule.fields:
            value = _get(cfg, name)
            if name in found or _plain(value) == _plain(_get(DEFAULTS, name)):
                continue
            if name in keep and _plain(keep[name]) == _plain(value):
                continue
            why = rule.why(cfg, facts)
            if why is not None:
                found[name] = Unused(name, f"`{name}`={show(value)} {why}; {rule.fix}", not rule.shared_by)
    return list(found.values())


def check_unused(cfg: TrainConfig, facts: Facts = UNKNOWN, keep: Mapping[str, Any] | None = None, *,
                 warn: bool = False) -> None:
    """Raise :class:`ConfigError` for the first setting this run ignores (:func:`unused_settings`);
    with ``warn``, then warn once for each setting only warned about (:attr:`Rule.shared_by`)."""
    found = unused_settings(cfg, facts, keep)
    refused = [u for u in found if u.refused]
    if refused:
        raise ConfigError(refused[0].message)
    if warn:
        for u in found:
            warnings.warn(u.message, stacklevel=2)  # the start-up checks' line: one ppo-lm warning line


AUTO_CRITIC_FIELDS = ("critic.init", "critic.lora_r", "critic.value_grad_scale")
"""The settings that only one kind of critic uses; an ``auto`` ``critic.kind`` picks the kind by the
policy's size, once it has loaded."""


def check_resolved_critic(cfg: TrainConfig, resolved_from_auto: bool) -> None:
    """Raise :class:`ConfigError` where ``critic.kind`` was ``auto`` (``resolved_from_auto``) and the kind
    it resolved to for this policy's size ignores a setting given with it (``critic.lora_r`` on a
    small policy's shared critic, say): the start-up checks could not tell before the policy loaded."""
    if not resolved_from_auto:
        return
    for u in unused_settings(cfg):
        if u.refused and u.field in AUTO_CRITIC_FIELDS:
            raise ConfigError(f"{u.message} (`critic.kind` auto resolved to {cfg.critic.kind!r} for this "
                              "policy's size and task: config/sizing.py)")
