"""The update's statistics as a typed record, and the one aggregator that combines them over CPU
lanes, micro-batches, minibatches, epochs and data-parallel ranks (docs/algorithm.md §4).

Each statistic says what it is a mean over, so a combination of several calls weighs each call by
the right count and the result does not depend on how the rows were split:

- ``units``: the losses, means over the loss aggregation's units (tokens for ``token-mean``,
  responses for the seq-mean modes; :func:`~.losses.loss_units`);
- ``tokens``: the per-token diagnostics (clip fractions, approximate KLs, entropy);
- ``steps``: per-optimiser-step values (gradient norms), one weight per step;
- ``max``: maxima (``ratio_max``), whose combination is the maximum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import torch
from torch import Tensor

from .advantages import AllReduce

UNITS, TOKENS, STEPS, MAX = "units", "tokens", "steps", "max"

Value = Tensor | float | None


def _stat(kind: str):
    return field(default=None, metadata={"reduce": kind})


@dataclass
class UpdateStats:
    """Statistics of PPO update steps; a field is None where it was not computed.

    From :func:`~.objective.ppo_objective`: 0-dim detached tensors, means over that call's rows.
    From :meth:`StatsAggregator.result`: floats over everything the aggregator was given.
    """

    policy_loss: Value = _stat(UNITS)
    kl_loss: Value = _stat(UNITS)
    value_loss: Value = _stat(UNITS)
    approx_kl: Value = _stat(TOKENS)  # ½(logp − logp_old)², an estimate of KL(π_old ‖ π_θ)
    approx_kl_k3: Value = _stat(TOKENS)
    policy_clip_frac: Value = _stat(TOKENS)
    dual_clip_frac: Value = _stat(TOKENS)
    kl_clamp_frac: Value = _stat(TOKENS)  # tokens whose KL-loss estimate hit algo.kl_clamp
    value_clip_frac: Value = _stat(TOKENS)
    entropy: Value = _stat(TOKENS)
    ratio_max: Value = _stat(MAX)
    grad_norm_actor: Value = _stat(STEPS)
    grad_norm_critic: Value = _stat(STEPS)

    def items(self) -> list[tuple[str, Value]]:
        """(name, value) of the statistics that were computed."""
        return [(f.name, getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None]

    def as_dict(self) -> dict[str, float]:
        """The computed statistics as floats, for the metrics log."""
        return {k: float(v) for k, v in self.items()}


_FIELDS = [(f.name, f.metadata["reduce"]) for f in fields(UpdateStats)]
_MEANS = [name for name, kind in _FIELDS if kind != MAX]
_MAXIMA = [name for name, kind in _FIELDS if kind == MAX]

class StatsAggregator:
    """Weighted means and maxima of :class:`UpdateStats` over any number of calls.

    ``add`` one call's statistics with its counts; ``merge`` another aggregator (a minibatch's, once
    its step was applied); ``result`` reduces over ranks with the given all-reduce functions. Every
    rank reduces the same fixed set of fields, whatever it computed, so the collectives match.
    """

    def __init__(self) -> None:
        self._sums = dict.fromkeys(_MEANS, 0.0)
        self._weights = dict.fromkeys(_MEANS, 0.0)
        self._seen = dict.fromkeys(_MEANS, 0.0)
        self._maxima = dict.fromkeys(_MAXIMA, -math.inf)

    def add(self, stats: UpdateStats, *, units: float = 1.0, tokens: float = 1.0) -> None:
        """One call's statistics: means over ``units`` loss units and ``tokens`` valid tokens."""
        weights = {UNITS: units, TOKENS: tokens, STEPS: 1.0}
        for (name, kind), f in zip(_FIELDS, fields(stats)):
            v = getattr(stats, f.name)
            if v is None:
                continue
            if kind == MAX:
                self._maxima[name] = max(self._maxima[name], float(v))
            else:
                w = weights[kind]
                self._sums[name] += float(v) * w
                self._weights[name] += w
                self._seen[name] += 1.0

    def merge(self, other: StatsAggregator) -> None:
        for name in _MEANS:
            self._sums[name] += other._sums[name]
            self._weights[name] += other._weights[name]
            self._seen[name] += other._seen[name]
        for name in _MAXIMA:
            self._maxima[name] = max(self._maxima[name], other._maxima[name])

    def result(self, *, all_reduce_sum: AllReduce | None = None, all_reduce_max: AllReduce | None = None) -> UpdateStats:
        """The statistics over every call (and rank, given the all-reduces) as floats; a statistic
        no call computed is None, one whose calls had no weight NaN."""
        t = torch.tensor([[self._sums[k], self._weights[k], self._seen[k]] for k in _MEANS], dtype=torch.float64)
        mx = torch.tensor([self._maxima[k] for k in _MAXIMA], dtype=torch.float64)
        if all_reduce_sum is not None:
            t = all_reduce_sum(t)
        if all_reduce_max is not None:
            mx = all_reduce_max(mx)
        out: dict[str, float] = {}
        for name, (s, w, seen) in zip(_MEANS, t.tolist()):
            if seen:
                out[name] = s / w if w else float("nan")
        out.update({name: v for name, v in zip(_MAXIMA, mx.tolist()) if v > -math.inf})
        return UpdateStats(**out)
