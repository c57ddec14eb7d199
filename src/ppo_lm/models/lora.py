"""LoRA adapters through peft (docs/lora.md): only low-rank adapters train, and the frozen reference is
the same model with its adapters switched off, so the weights are held once.

A model here is the plain transformers model (``*ForCausalLM``, the critic's classification model)
with peft's LoRA layers injected in place; the :class:`peft.PeftModel` that wraps it is kept beside it
(:func:`peft_model`) for peft's own state-dict and config handling, while every forward of ppo-lm
calls the plain model (its ``base_model`` is still the transformer body). Adapter B matrices start at
zero (peft's default), so a fresh adapter leaves the model's outputs unchanged.
"""

from __future__ import annotations

import contextlib
import json
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from .hf_compat import UPDATE_STATE, trunk

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
_PEFT = "_ppo_lm_peft"  # where the PeftModel handle sits in the model's __dict__ (not a submodule)
_SWITCHES = "_ppo_lm_lora_switches"
_DROPOUTS = "_ppo_lm_lora_dropouts"
_PREFIX = "base_model.model."  # peft's key prefix of the wrapped model's tensors


@dataclass(frozen=True)
class LoraSettings:
    """``r`` rank, ``alpha`` scale numerator (adapters add (alpha/r)·B·A·x), ``dropout`` on the adapters'
    input, ``target_modules``: ("all-linear",) or module-name suffixes such as ("q_proj", "v_proj") of the
    transformer body; ``head``: the output head (``get_output_embeddings()``) gets adapters too."""

    r: int
    alpha: float
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("all-linear",)
    head: bool = False


def _output_head(model: nn.Module) -> tuple[str, nn.Linear] | None:
    """(name, module) of ``model``'s output head when it is a linear layer (a causal LM's ``lm_head``)."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if get is not None else None
    if not isinstance(head, nn.Linear):
        return None
    return next((n, m) for n, m in model.named_modules() if m is head)


def target_names(model: nn.Module, targets: tuple[str, ...], head: bool = False) -> list[str]:
    """Full names of the ``nn.Linear`` modules of ``model``'s transformer body that ``targets`` select,
    plus the output head with ``head`` (otherwise never: the LM head stays frozen, a critic's value
    head trains in full). Raises ``ValueError`` naming every target that matches none of them, and
    for a ``head`` that shares its weight with the input embeddings (merging would change both)."""
    body = trunk(model)
    prefix = next(name for name, m in model.named_modules() if m is body)
    linears = [f"{prefix}.{n}" if prefix else n for n, m in body.named_modules() if isinstance(m, nn.Linear)]
    out_head = _output_head(model)

    def matches(name: str, t: str) -> bool:
        return name == t or name.endswith("." + t)

    if tuple(targets) != ("all-linear",):
        unmatched = [t for t in targets if not any(matches(n, t) for n in linears)]
        if unmatched or not linears:
            names = sorted({n.rsplit(".", 1)[-1] for n in linears})
            heads = [t for t in unmatched if out_head is not None and matches(out_head[0], t)]
            why = f"; {heads} is the output head: set model.lora_head true to adapt it" if heads else ""
            raise ValueError(f"`model.lora_target_modules`={unmatched or list(targets)} selects no linear layer "
                             f"of {type(model).__name__}'s transformer body; its linear layers are named {names}{why}")
        linears = [n for n in linears if any(matches(n, t) for t in targets)]
    if head:
        if out_head is None:
            raise ValueError(f"`model.lora_head`: {type(model).__name__} has no linear output head to adapt")
        embed = model.get_input_embeddings()
        if embed is not None and out_head[1].weight.data_ptr() == embed.weight.data_ptr():
            raise ValueError(f"`model.lora_head`: {type(model).__name__}'s output head shares its weight with the "
                             "input embeddings (tie_word_embeddings), so merging its adapters would change both; "
                             "set model.lora_head false (the body's adapters train as usual)")
        linears.append(out_head[0])
    return linears


def add_adapters(model: nn.Module, settings: LoraSettings, *, seed: int = 0, name_or_path: str | None = None) -> nn.Module:
    """Inject LoRA adapters into ``model`` in place and freeze everything else; returns ``model``.

    The adapters' random A matrices come from a generator forked off ``seed``, so the global random
    streams advance exactly as in a run without LoRA, and every rank draws the same adapters.
    ``name_or_path`` is written to adapter_config.json as the base model (for ``PeftModel.from_pretrained``).
    """
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout, bias="none",
                        target_modules=target_names(model, settings.target_modules, settings.head),
                        base_model_name_or_path=name_or_path)
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # peft reads transformers' deprecated is_gradient_checkpointing; nothing for the user to act on
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        torch.manual_seed(seed)
        wrapped = get_peft_model(model, config)
    model.__dict__[_PEFT] = wrapped
    model.__dict__[_SWITCHES] = _Switches()
    model.__dict__[_DROPOUTS] = [m for name, m in model.named_modules()
                                 if ".lora_dropout." in name and isinstance(m, nn.Dropout) and m.p > 0]
    # the dropout stays on through a checkpointed update's backward, whose recomputation must drop as
    # the forward did (:func:`ppo_lm.models.hf_compat.checkpointing_on`)
    model.__dict__[UPDATE_STATE] = _update_dropout
    # peft builds its layers in training mode; ppo-lm's models sit in eval mode (no dropout) and the
    # adapters' dropout acts only in forwards that record gradients (:func:`train_dropout`)
    model.eval()
    return model


class _Switches(dict):
    """Counts of the nested entries that turn the adapters off and their dropout on, and their lock. A
    copy (``copy.deepcopy``, pickling to an asynchronous producer's process) starts afresh: no entry open."""

    def __init__(self):
        super().__init__(off=[0], dropout=[0], lock=threading.Lock())

    def __reduce__(self):
        return _Switches, ()


def peft_model(model: nn.Module):
    """The ``PeftModel`` around ``model`` (None without adapters)."""
    return model.__dict__.get(_PEFT)


def has_adapters(model: nn.Module | None) -> bool:
    return model is not None and peft_model(model) is not None


@contextlib.contextmanager
def _counted(model: nn.Module, which: str, switch):
    """``switch(True)`` at the first of nested entries (from any thread), ``switch(False)`` at the last exit."""
    state = model.__dict__[_SWITCHES]
    with state["lock"]:
        state[which][0] += 1
        if state[which][0] == 1:
            switch(True)
    try:
        yield
    finally:
        with state["lock"]:
            state[which][0] -= 1
            if state[which][0] == 0:
                switch(False)


def adapters_off(model: nn.Module):
    """Forwards of ``model`` inside run the base model (adapters off). Entries nest and may come from
    several threads at once (CPU lanes scoring the reference side by side): the adapters go off at
    the first entry and back on at the last exit. No forward of the adapted model may run meanwhile —
    the switch is the model's, not the thread's — which is why the rollout scores the reference in a
    pass of its own (:func:`ppo_lm.rollout.score.scoring.score_sequences`)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]

    def switch(off: bool) -> None:
        for layer in layers:
            layer.enable_adapters(not off)

    return _counted(model, "off", switch)


def train_dropout(model: nn.Module | None, active: bool):
    """With ``active`` (a forward that records gradients, i.e. the update), the adapters' dropout
    (``model.lora_dropout`` > 0) acts; the rollout's scoring forwards and generation run without it,
    as every other dropout of ppo-lm's models. A no-op without adapters or dropout."""
    drops = model.__dict__.get(_DROPOUTS) if active and model is not None else None
    if not drops:
        return contextlib.nullcontext()

    def switch(on: bool) -> None:
        for m in drops:
            m.train(on)

    return _counted(model, "dropout", switch)


def _update_dropout(model: nn.Module):
    """:func:`train_dropout` on, for every forward of an update and the recomputation of its backward
    (every forward there records gradients, so none drops where it would not anyway)."""
    return train_dropout(model, True)


# ---- the lean forward's view of a LoRA layer (ppo_lm.models.lean) ----------------------------------
def is_lora_layer(module: nn.Module) -> bool:
    return hasattr(module, "lora_A") and hasattr(module, "base_layer")


def plain_linear(module: nn.Module) -> nn.Linear | None:
    """The ``nn.Linear`` whose weight a lean forward multiplies by: the module itself, or the frozen
    base of a vanilla (non-DoRA, unmerged) LoRA layer with plain linear adapters; None for anything else."""
    if not is_lora_layer(module):
        return module if type(module) is nn.Linear else None
    base = module.base_layer
    if type(base) is not nn.Linear or getattr(module, "lora_variant", None) or module.merged:
        return None
    for name in module.lora_A:
        if type(module.lora_A[name]) is not nn.Linear or type(module.lora_B[name]) is not nn.Linear:
            return None
    return base


def delta(module: nn.Module, x: Tensor) -> Tensor | None:
    """What a LoRA layer's active adapters add to its base output for input ``x`` (…, in) → (…, out):
    Σ scaling·B(A(dropout(x))), as peft's forward computes it; None when nothing is added (not a LoRA
    layer, adapters off).

    As in peft's forward, ``x`` is cast to the adapter weights' dtype first — a bfloat16/float16 body
    keeps fp32 adapters (peft's ``autocast_adapter_dtype``), whose matmul would refuse a half-precision
    input — so the result is in the adapters' dtype: add it to the base output with :func:`plus`, which
    casts the sum back to the base output's dtype, as peft casts its result."""
    if not is_lora_layer(module) or module.disable_adapters:
        return None
    out = None
    for name in module.active_adapters:
        if name not in module.lora_A:
            continue
        dtype = module.lora_A[name].weight.dtype
        if getattr(module, "cast_input_dtype_enabled", True) and x.dtype != dtype:  # (peft's switch for the cast)
            x = x.to(dtype)
        d = module.lora_B[name](module.lora_A[name](module.lora_dropout[name](x))) * module.scaling[name]
        out = d if out is None else out + d
    return out


def plus(y: Tensor, d: Tensor | None) -> Tensor:
    """A base output ``y`` (…, out) plus an adapters' :func:`delta` ``d`` (…, out) or None: summed in the
    wider of the two dtypes and cast back to ``y``'s, as peft's forward does (one rounding to a half
    precision ``y``'s dtype, not one for ``d`` and one for the sum)."""
    return y if d is None else (y + d).to(y.dtype)


def fused_delta(modules: list[nn.Module], x: Tensor) -> Tensor | None:
    """:func:`delta` of several layers that read the same ``x``, concatenated along the output
    (zeros for layers without adapters), for a fused projection such as q‖k‖v; None when none adds.
    In the adapters' dtype, as :func:`delta`: add it with :func:`plus`."""
    parts = [delta(m, x) for m in modules]
    if all(p is None for p in parts):
        return None
    like = next(p for p in parts if p is not None)
    return torch.cat([p if p is not None else like.new_zeros(*x.shape[:-1], plain_linear(m).out_features)
                      for p, m in zip(parts, modules)], dim=-1)


# ---- checkpoints -----------------------------------------------------------------------------------
def is_adapter_key(key: str) -> bool:
    """Whether a module state-dict key belongs to a LoRA adapter (``…lora_A.default.weight``)."""
    return ".lora_A." in key or ".lora_B." in key


def to_saved_keys(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The adapter tensors of a module state dict (keys relative to the adapted model), keyed as peft
    saves them in adapter_model.safetensors: ``base_model.model.<path>.lora_A.weight``."""
    return {_PREFIX + k.replace(".default.", "."): v.contiguous() for k, v in state.items() if is_adapter_key(k)}


def from_saved_keys(saved: dict[str, Tensor]) -> dict[str, Tensor]:
    """Inverse of :func:`to_saved_keys`: peft's saved keys → the adapted model's state-dict keys."""
    out = {}
    for k, v in saved.items():
        if not k.startswith(_PREFIX) or not is_adapter_key(k.replace(".weight", ".x.weight")):
            raise ValueError(f"{ADAPTER_WEIGHTS}: unexpected tensor {k!r}")
        for part in ("lora_A", "lora_B"):
            k = k.replace(f".{part}.weight", f".{part}.default.weight")
        out[k[len(_PREFIX):]] = v
    return out


def save_adapters(model: nn.Module, directory: Path, state: dict[str, Tensor]) -> None:
    """Write ``model``'s adapters (``state``: its module state dict, or just its adapter tensors) as peft
    does: adapter_config.json and adapter_model.safetensors, loadable with ``PeftModel.from_pretrained``."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    peft_model(model).peft_config["default"].save_pretrained(str(directory))
    save_file(to_saved_keys(state), str(directory / ADAPTER_WEIGHTS), metadata={"format": "pt"})


def read_adapters(directory: Path) -> dict[str, Tensor]:
    """The adapter tensors of a directory :func:`save_adapters` wrote, keyed as the adapted model's state dict."""
    from safetensors.torch import load_file

    json.loads((directory / ADAPTER_CONFIG).read_text())  # present and readable, or an error to report
    return from_saved_keys(load_file(str(directory / ADAPTER_WEIGHTS)))


def base_fingerprint(state: dict[str, Tensor]) -> list[float]:
    """A cheap fingerprint of the frozen base weights of a LoRA model's (or a frozen critic's body's)
    state dict: sum and sum of squares, in float64, over every floating tensor that is not an adapter. A
    resumed run checks with it that its base model is the one the adapters were trained on."""
    s = sq = 0.0
    with torch.no_grad():
        for key in sorted(state):
            t = state[key]
            if is_adapter_key(key) or not t.is_floating_point():
                continue
            d = (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().double()
            s += float(d.sum())
            sq += float((d * d).sum())
    return [s, sq]


def same_base(now: list[float], saved: list[float]) -> bool:
    """Whether two :func:`base_fingerprint` values describe the same weights (summation order may differ
    by the module names peft gives the base layers: a relative 1e-6 allows for it)."""
    return all(abs(a - b) <= 1e-6 * max(1.0, abs(b)) for a, b in zip(now, saved))
