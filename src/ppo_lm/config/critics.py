"""The critic: its section of the config (``critic:``, :class:`CriticConfig`) and its kinds
(``critic.kind``), each registered where it is defined — as the estimators are
(``ppo_lm.algorithms.registry``) — with everything the rest of the package asks of a kind: where its
values come from, whether it has a body of its own and what of it trains, which settings it reads
(the unused-setting rules derive from them), what its checkpoint holds, its banner line and how a
comparison names it; and the one place ``auto`` resolves (docs/critic.md). Nothing outside this module
compares a critic kind by name.

Kinds, as docs/critic.md describes them:

- ``separate`` — a model of its own: a transformer body (``critic.init``'s) and a scalar head; its
  whole body trains, or with ``critic.lora_r`` (else ``model.lora_r``) > 0 only LoRA adapters on a
  body it holds by reference (the frozen reference's in full fine-tuning);
- ``frozen`` — a separate critic whose body never trains, only its value head;
- ``shared`` — a value head on the policy's body: the policy's scoring forward gives the values, and
  ``critic.value_grad_scale`` says how much of the value loss reaches the body;
- ``none`` — the estimator is critic-free (``algo.estimator``); not a value of ``critic.kind``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from ..algorithms import get_advantage_estimator
from ..runtime.settings import setting


@dataclass
class CriticConfig:
    """The ``critic:`` section: what the critic is, and how it learns. Only the estimators with a critic
    read it (``algo.estimator: gae``); a setting given to a critic-free one is refused as unused."""

    kind: Literal["auto", "separate", "shared", "frozen"] = "auto"
    """The kind of critic (config/critics.py, docs/critic.md): 'separate', a transformer body of its own
    (`critic.init`'s) and a scalar head; 'frozen', a separate critic whose body never trains, only its
    value head; 'shared', a value head on the policy's body. auto: 'separate' with `rollout.env` (an
    environment's episodes), else by the policy's size: 'shared' below 1 B parameters, where the head on
    the policy's features learned about as well per sampled token as a separate critic at a critic-free
    run's cost; 'separate' from 1 B, not measured here (docs/critic.md, "What a critic costs")."""
    init: str = "auto"
    """A separate critic's body: 'auto' (the reward model if there is one, else the policy), 'policy',
    'reward', or a path to a checkpoint."""
    lora_r: int | None = setting(None, ge=0)
    """LoRA rank of a separate critic; None = `model.lora_r`. With r > 0 the critic's body is frozen and
    held by reference, not copied (in full fine-tuning it is the frozen reference's body), and only its
    adapters (`model.lora_alpha`, `model.lora_dropout`, `model.lora_target_modules`) and value head
    train; 0 trains every weight of the critic."""
    value_grad_scale: float = setting(0.0, ge=0, le=1)
    """A shared critic only: scale of the value-loss gradient that reaches the trunk. 0 (the default):
    the head trains alone on the policy's features, and only the policy loss moves the trunk; 1 on the
    built-in task learned less (docs/critic.md, "What a critic costs")."""
    lr: float | Literal["auto"] = setting("auto", gt=0, finite=True)
    """AdamW learning rate of the critic: the separate critic (body and head), or the shared critic's
    value head. auto: by the policy's size — 1e-3 below 10 M parameters, 1e-4 from 10 M (measured on
    SmolLM2-135M, docs/critic.md), 1e-5 from 1 B (verl's and OpenRLHF's for models of that size)."""
    epochs: int | None = setting(None, ge=1)
    """The critic's passes over each rollout (as verl's and slime's critic epochs); None =
    `optim.epochs`. More than `optim.epochs`: the later passes train the critic alone (no policy
    forward); fewer: the later passes train the policy alone."""
    warmup_iterations: int = setting(0, ge=0)
    """The first N iterations train only the critic (policy frozen)."""
    vf_coef: float = setting(0.1, ge=0, finite=True)
    """c₁: weight of the value loss (docs/algorithm.md §1.4). Added to the policy loss with a shared
    critic; with a separate critic it scales that critic's own loss."""
    value_clip_eps: float | None = setting(0.2, gt=0)
    """Value clipping ε_v (docs/algorithm.md §1.4), in reward units: the loss takes the larger of
    (V − R̂)² and (clip(V, V_old ± ε_v) − R̂)²; None = unclipped."""
    gae_lambda: float | None = setting(None, ge=0, le=1)
    """Decoupled GAE (VC-PPO): the λ of the critic's target; None = `algo.gae_lambda`."""
    target: Literal["shaped", "score"] = "shaped"
    """'score' trains the critic on score-only rewards (the KL part of the shaped reward left out of its
    target)."""

LARGE_CRITIC_PARAMETERS = 1_000_000_000
"""From this many policy parameters ``auto`` takes :data:`AUTO_LARGE`."""


@dataclass(frozen=True)
class CriticKind:
    """One kind of critic; ``cfg`` in the methods is a run's ``TrainConfig``."""

    name: str
    what: str
    """What it is, as a clause after "a <name> critic" in messages: "is a value head on the policy's body"."""
    values_from: Literal["policy", "critic"] | None
    """Where V comes from: the policy's forward (a head on its features), the critic's own, or nowhere."""
    own_body: bool
    """A second model with a body of its own (built from ``critic.init``)."""
    settings: frozenset[str]
    """The settings of this module's :data:`KIND_SETTINGS` the kind reads; the others are unused with it."""
    checkpoint: str | None
    """What a checkpoint holds of it, relative to the checkpoint's folder (None: nothing of its own)."""

    REGISTRY: ClassVar[dict[str, CriticKind]] = {}

    def adapter_rank(self, cfg) -> int:
        """The rank of LoRA adapters on its body (0: none)."""
        return 0

    def body_frozen(self, cfg) -> bool:
        """Whether its own body is held frozen (adapters or the value head alone train)."""
        return False

    def trains(self, cfg) -> str:
        """What of it trains, in words (the banner's)."""
        return "nothing"

    def held(self, cfg) -> str:
        """What a comparison lists this run as holding for its critic (``ppo-lm compare``)."""
        return ""

    def banner(self, cfg, body: str) -> str:
        """The banner's critic line; ``body``: its own model's class and parameter counts."""
        return ""


KIND_SETTINGS = {
    "critic.init": "picks the body the critic starts from",
    "critic.lora_r": "gives the critic's body LoRA adapters",
    "critic.value_grad_scale": "scales the value-loss gradient that reaches the policy's body",
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
    settings: frozenset[str] = frozenset({"critic.init", "critic.lora_r"})
    checkpoint: str | None = "critic"

    def adapter_rank(self, cfg) -> int:
        return cfg.model.lora_r if cfg.critic.lora_r is None else cfg.critic.lora_r

    def body_frozen(self, cfg) -> bool:
        return self.adapter_rank(cfg) > 0

    def trains(self, cfg) -> str:
        rank = self.adapter_rank(cfg)
        return f"LoRA r {rank} and the value head" if rank else "its body and value head"

    def held(self, cfg) -> str:
        return "critic's adapters" if self.adapter_rank(cfg) else "critic"

    def banner(self, cfg, body: str) -> str:
        line = f"  critic    {body}"
        if self.body_frozen(cfg):
            line += f"; its body frozen ({self.trains(cfg)} train{'' if self.adapter_rank(cfg) else 's'})"
        return line


@critic
@dataclass(frozen=True)
class Frozen(Separate):
    name: str = "frozen"
    what: str = "has a body of its own that never trains"
    settings: frozenset[str] = frozenset({"critic.init"})

    def adapter_rank(self, cfg) -> int:
        return 0

    def body_frozen(self, cfg) -> bool:
        return True

    def trains(self, cfg) -> str:
        return "the value head"

    def held(self, cfg) -> str:
        return "critic's value head on a frozen body"


@critic
@dataclass(frozen=True)
class Shared(CriticKind):
    name: str = "shared"
    what: str = "is a value head on the policy's body"
    values_from: Literal["policy", "critic"] | None = "policy"
    own_body: bool = False
    settings: frozenset[str] = frozenset({"critic.value_grad_scale"})
    checkpoint: str | None = "value_head.safetensors"

    def trains(self, cfg) -> str:
        return "the value head" if cfg.critic.value_grad_scale == 0 else "the value head, and the policy's body a little"

    def held(self, cfg) -> str:
        return "value head"

    def banner(self, cfg, body: str) -> str:
        scale = cfg.critic.value_grad_scale
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
"""The values ``critic.kind`` takes besides ``auto``."""

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
    name = cfg.critic.kind
    if name == "auto":
        return resolve_auto(parameters, cfg.rollout.episodic)
    return CriticKind.REGISTRY[name]


def settings_kind(cfg) -> CriticKind:
    """The kind whose rules a run's settings follow before its policy is loaded: the named one, or for
    ``auto`` :data:`AUTO_UNRESOLVED`."""
    kind = cfg.critic.kind
    return CriticKind.REGISTRY[kind] if kind != "auto" else AUTO_UNRESOLVED
