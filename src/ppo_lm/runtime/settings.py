"""Settings that carry their own rules: a config dataclass declares, with each field, the range its
value must lie in and whether a resumed run may set it differently (:func:`setting`). The checks
(:func:`check_ranges`) and the resume comparison (:func:`resumable`) read them from the fields, so a
rule lives in one place, beside the default and the doc it belongs to.

    lr: float = setting(1e-4, gt=0, finite=True)
    \"\"\"AdamW learning rate.\"\"\"
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass
from typing import Any

RULE = "ppo_lm.rule"
RESUME = "ppo_lm.resume"


@dataclass(frozen=True)
class Range:
    """The values a number may take: ``ge``/``gt`` below, ``le``/``lt`` above (None: unbounded), and
    ``finite`` (no ±inf; NaN always fails)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    finite: bool = False

    def describe(self) -> str:
        """``>= 1``, ``a finite number > 0``, ``lie in [0, 1)``… — what :func:`check_ranges` says a
        value must be."""
        low, high = (self.ge, self.gt), (self.le, self.lt)
        if any(v is not None for v in low) and any(v is not None for v in high):
            lo = f"[{_num(self.ge)}" if self.ge is not None else f"({_num(self.gt)}"
            hi = f"{_num(self.le)}]" if self.le is not None else f"{_num(self.lt)})"
            return f"lie in {lo}, {hi}"
        bounds = ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt))
        bound = " ".join(f"{op} {_num(v)}" for op, v in bounds if v is not None)
        if self.finite:
            return f"be a finite number {bound}".rstrip()
        return f"be {bound}"

    def holds(self, value: float) -> bool:
        v = float(value)
        if math.isnan(v) or (self.finite and math.isinf(v)):
            return False
        return ((self.ge is None or v >= self.ge) and (self.gt is None or v > self.gt)
                and (self.le is None or v <= self.le) and (self.lt is None or v < self.lt))


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def setting(default: Any = MISSING, *, default_factory: Any = MISSING, ge: float | None = None,
            gt: float | None = None, le: float | None = None, lt: float | None = None, finite: bool = False,
            resume: bool = False) -> Any:
    """A dataclass field with its rules: the range of :class:`Range` (a None value passes, as does
    every element of a list or tuple that lies in it), and ``resume``: a resumed run may set it
    differently from the run it continues (its length, logging, devices, speed settings that do not
    change results). On a field holding a nested config, ``resume`` covers the whole section."""
    metadata: dict[str, Any] = {RESUME: resume}
    if any(v is not None for v in (ge, gt, le, lt)) or finite:
        metadata[RULE] = Range(ge, gt, le, lt, finite)
    if default_factory is not MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_ranges(cfg: Any, prefix: str = "", error: type[Exception] = ValueError) -> None:
    """Raise ``error`` naming the first field of ``cfg`` (and of its nested configs) whose value breaks
    its :class:`Range`: ``\\`optim.actor_lr\\` must be a finite number > 0, got -1.0``. ``prefix``
    (``"sft."``) names the section in the message."""
    for f in dataclasses.fields(cfg):
        value, name = getattr(cfg, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check_ranges(value, f"{name}.", error)
            continue
        rule = f.metadata.get(RULE)
        if rule is None or value is None:
            continue
        items = list(enumerate(value)) if isinstance(value, (list, tuple)) else [(None, value)]
        for i, v in items:
            if _number(v) and not rule.holds(v):
                where = name if i is None else f"{name}[{i}]"
                raise error(f"`{where}` must {rule.describe()}, got {v}")


def resumable(cls: type, prefix: str = "") -> list[str]:
    """The dotted names of the fields of ``cls`` a resumed run may change (``setting(resume=True)``); a
    whole section as ``"log."``."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        name, tp = f"{prefix}{f.name}", hints[f.name]
        if f.metadata.get(RESUME):
            out.append(f"{name}." if dataclasses.is_dataclass(tp) else name)
        elif dataclasses.is_dataclass(tp):
            out.extend(resumable(tp, f"{name}."))
    return out


YAML_TRUE = frozenset({"true", "yes", "on", "1"})
YAML_FALSE = frozenset({"false", "no", "off", "0"})
"""The spellings of a boolean a flag takes, in any case: YAML 1.1's words, as a config file writes them
(``bootstrap_truncated: false``), and 1/0."""


def yaml_bool(text: str) -> bool:
    """``text`` as a boolean (:data:`YAML_TRUE`, :data:`YAML_FALSE`); ValueError otherwise."""
    word = text.strip().lower()
    if word in YAML_TRUE or word in YAML_FALSE:
        return word in YAML_TRUE
    raise ValueError(f"{text!r} is not a boolean; give true or false")


def respell_booleans(argv: list[str], spelling: Callable[[str], Callable[[bool], list[str]] | None]) -> list[str]:
    """``argv`` with each boolean flag given a YAML spelling (``--x yes``, ``--x=off``; any case, or 1/0)
    written as its parser takes it. ``spelling(flag)``: None for a flag that is not a boolean, else how
    to write the flag for a value (e.g. ``--x`` / nothing for a switch). A flag without a boolean word
    after it, and every other argument, pass as they are (the parser names a mistake)."""
    words = YAML_TRUE | YAML_FALSE
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        flag, eq, value = arg.partition("=")
        spell = spelling(flag)
        if spell is None:
            out.append(arg)
            continue
        if not eq and i < len(argv) and argv[i].strip().lower() in words:
            value, eq = argv[i], "="
            i += 1
        out += spell(yaml_bool(value)) if eq and value.strip().lower() in words else [arg]
    return out
