"""The kinds of critic (``model.critic``), each registered where it is defined — as the estimators are
(``ppo_lm.algorithms.registry``) — with everything the rest of the package asks of a kind: where its
values come from, whether it has a body of its own and what of it trains, which settings it reads
(the unused-setting rules derive from them), what its checkpoint holds, its banner line and how a
comparison names it; and the one place ``auto`` resolves (docs/critic.md). Nothing outside this module
compares a critic kind by name.

Kinds, as docs/critic.md describes them:

- ``separate`` — a model of its own: a transformer body (``model.critic_init``'s) and a scalar head; its
  whole body trains, or with ``model.critic_lora_r`` (else ``model.lora_r``) > 0 only LoRA adapters on a
  body it holds by reference (the frozen reference's in full fine-tuning);
- ``frozen`` — a separate critic whose body never trains, only its value head;
- ``shared`` — a value head on the policy's body: the policy's scoring forward gives the values, and
  ``model.value_grad_scale`` says how much of the value loss reaches the body;
- ``none`` — the estimator is critic-free (``algo.estimator``); not a value of ``model.critic``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from ..algorithms import get_advantage_estimator

LARGE_CRITIC_PARAMETERS = 1_000_000_000
"""From this many policy parameters ``auto`` takes :data:`AUTO_LARGE`."""


@dataclass(frozen=True)
class CriticKind:
    """One kind of critic; ``m`` in the methods is a run's ``ModelConfig``."""

    name: str
    what: str
    """What it is, as a clause after "a <name> critic" in messages: "is a value head on the policy's body"."""
    values_from: Literal["policy", "critic"] | None
    """Where V comes from: the policy's forward (a head on its features), the critic's own, or nowhere."""
    own_body: bool
    """A second model with a body of its own (built from ``model.critic_init``)."""
    settings: frozenset[str]
    """The settings of this module's :data:`KIND_SETTINGS` the kind reads; the others are unused with it."""
    checkpoint: str | None
    """What a checkpoint holds of it, relative to the checkpoint's folder (None: nothing of its own)."""

    REGISTRY: ClassVar[dict[str, CriticKind]] = {}

    def adapter_rank(self, m) -> int:
        """The rank of LoRA adapters on its body (0: none)."""
        return 0

    def body_frozen(self, m) -> bool:
        """Whether its own body is held frozen (adapters or the value head alone train)."""
        return False

    def trains(self, m) -> str:
        """What of it trains, in words (the banner's)."""
        return "nothing"

    def held(self, m) -> str:
        """What a comparison lists this run as holding for its critic (``ppo-lm compare``)."""
        return ""

    def banner(self, m, body: str) -> str:
        """The banner's critic line; ``body``: its own model's class and parameter counts."""
        return ""


KIND_SETTINGS = {
    "model.critic_init": "picks the body the critic starts from",
    "model.critic_lora_r": "gives the critic's body LoRA adapters",
    "model.value_grad_scale": "scales the value-loss gradient that reaches the policy's body",
}
"""The settings only some kinds read, and what each does."""


def critic(cls: type[CriticKind]) -> type[CriticKind]:
    """Register the kind ``cls()`` under its name."""
    kind = cls()
    CriticKind.REGISTRY[kind.name] = kind
    return cls


@critic
@dataclass(frozen=True)
class Separate(CriticKind):
    name: str = "separate"
    what: str = "has a body of its own"
    values_from: Literal["policy", "critic"] | None = "critic"
    own_body: bool = True
    settings: frozenset[str] = frozenset({"model.critic_init", "model.critic_lora_r"})
    checkpoint: str | None = "critic"

    def adapter_rank(self, m) -> int:
        return m.lora_r if m.critic_lora_r is None else m.critic_lora_r

    def body_frozen(self, m) -> bool:
        return self.adapter_rank(m) > 0

    def trains(self, m) -> str:
        rank = self.adapter_rank(m)
        return f"LoRA r {rank} and the value head" if rank else "its body and value head"

    def held(self, m) -> str:
        return "critic's adapters" if self.adapter_rank(m) else "critic"

    def banner(self, m, body: str) -> str:
        line = f"  critic    {body}"
        if self.body_frozen(m):
            line += f"; its body frozen ({self.trains(m)} train{'' if self.adapter_rank(m) else 's'})"
        return line


@critic
@dataclass(frozen=True)
class Frozen(Separate):
    name: str = "frozen"
    what: str = "has a body of its own that never trains"
    settings: frozenset[str] = frozenset({"model.critic_init"})

    def adapter_rank(self, m) -> int:
        return 0

    def body_frozen(self, m) -> bool:
        return True

    def trains(self, m) -> str:
        return "the value head"

    def held(self, m) -> str:
        return "critic's value head on a frozen body"


@critic
@dataclass(frozen=True)
class Shared(CriticKind):
    name: str = "shared"
    what: str = "is a value head on the policy's body"
    values_from: Literal["policy", "critic"] | None = "policy"
    own_body: bool = False
    settings: frozenset[str] = frozenset({"model.value_grad_scale"})
    checkpoint: str | None = "value_head.safetensors"

    def trains(self, m) -> str:
        return "the value head" if m.value_grad_scale == 0 else "the value head, and the policy's body a little"

    def held(self, m) -> str:
        return "value head"

    def banner(self, m, body: str) -> str:
        scale = m.value_grad_scale
        return "  critic    shared: a value head on the policy's body, " + (
            "trained alone (no value-loss gradient reaches the body)" if scale == 0 else
            f"its value-loss gradient × {scale:g} into the body")


@critic
@dataclass(frozen=True)
class NoCritic(CriticKind):
    name: str = "none"
    what: str = "does not exist: the estimator is critic-free"
    values_from: Literal["policy", "critic"] | None = None
    own_body: bool = False
    settings: frozenset[str] = frozenset()
    checkpoint: str | None = None


NONE = CriticKind.REGISTRY["none"]
SELECTABLE = tuple(n for n in CriticKind.REGISTRY if n != "none")
"""The values ``model.critic`` takes besides ``auto``."""

AUTO_SMALL = CriticKind.REGISTRY["shared"]
"""``auto`` below :data:`LARGE_CRITIC_PARAMETERS`: a value head on the policy's features learned per
sampled token about as a separate critic did on the built-in task and on SmolLM2-135M's tasks, at about
a critic-free iteration's cost (docs/critic.md "What a critic costs")."""
AUTO_LARGE = CriticKind.REGISTRY["separate"]
"""``auto`` from :data:`LARGE_CRITIC_PARAMETERS`, where nothing was measured here: verl's and OpenRLHF's."""
AUTO_ENV = CriticKind.REGISTRY["separate"]
"""``auto`` with ``rollout.env``, at any size: on the built-in multi-turn task the head on the policy's
features learned less than the separate critic per sampled token (docs/critic.md "Measured: a
multi-turn task")."""
AUTO_UNRESOLVED = CriticKind.REGISTRY["separate"]
"""How an ``auto`` not yet resolved (the policy not loaded) is read where a kind must be assumed: the
kind with the most settings of its own, so none given with ``auto`` is called unused too early."""


def resolve_auto(parameters: int | None, env: bool) -> CriticKind | None:
    """The kind ``auto`` takes for a policy of ``parameters`` parameters (None: not known yet), with an
    environment (``env``) or without; None where it cannot be told yet."""
    if env:
        return AUTO_ENV
    if parameters is None:
        return None
    return AUTO_LARGE if parameters >= LARGE_CRITIC_PARAMETERS else AUTO_SMALL


def kind_of(cfg, parameters: int | None = None) -> CriticKind | None:
    """The run's critic kind: :data:`NONE` for a critic-free estimator, the named kind, or what ``auto``
    resolves to (None where that needs the policy's size and ``parameters`` is not given)."""
    if not get_advantage_estimator(cfg.algo.estimator).needs_critic:
        return NONE
    name = cfg.model.critic
    if name == "auto":
        return resolve_auto(parameters, cfg.rollout.env is not None)
    return CriticKind.REGISTRY[name]


def settings_kind(m) -> CriticKind:
    """The kind whose rules a ``ModelConfig``'s own properties follow: the named one, or for ``auto``
    :data:`AUTO_UNRESOLVED`."""
    return CriticKind.REGISTRY[m.critic] if m.critic != "auto" else AUTO_UNRESOLVED
