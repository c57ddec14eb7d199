"""A checkpoint's weight files for one model (the policy's ``policy/``, a separate critic's ``critic/``):
what trains is written, what is frozen is fingerprinted, and reading checks both.

- A model that trains in full: ``save_pretrained`` (loads with plain transformers).
- A LoRA model: peft's adapter files, plus a critic's value head in ``value_head.safetensors``.
- A critic whose body is frozen and holds no adapters (``critic.kind: frozen``): its value head alone,
  in ``value_head.safetensors``. Its body is the frozen reference's (or the reward model's), which the
  run's own ``model.policy`` rebuilds, so a checkpoint holds kilobytes for it, not the body's weights.

The frozen tensors' fingerprints (:func:`lora.base_fingerprint`) go into ``trainer_state.pt``, so a
resume on other base weights is refused instead of training the saved head on features it never saw.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ...models import lora
from ...models.hf_compat import scalar_head
from ...runtime.errors import ConfigError

VALUE_HEAD = "value_head.safetensors"


def head_tensors(model: torch.nn.Module, state: dict) -> dict:
    """A critic's value-head tensors of ``state`` (keys relative to ``model``); empty for a policy."""
    try:
        head = scalar_head(model)
    except ValueError:
        return {}
    name = next(n for n, m in model.named_modules() if m is head)
    return {k: v for k, v in state.items() if k.startswith(name + ".")}


def body_frozen(model: torch.nn.Module) -> bool:
    """A critic with no adapters whose value head alone trains (a frozen critic)."""
    if lora.has_adapters(model):
        return False
    try:
        head = {id(p) for p in scalar_head(model).parameters()}
    except ValueError:
        return False
    trains = {id(p) for p in model.parameters() if p.requires_grad}
    return bool(trains) and trains <= head


def partial(model: torch.nn.Module) -> bool:
    """Whether the model's files hold part of its tensors (LoRA adapters, a frozen critic's head)."""
    return lora.has_adapters(model) or body_frozen(model)


def save_model(model: torch.nn.Module, directory: Path, state: dict) -> None:
    """Write ``model``'s trained tensors of ``state`` (its full state dict, keys relative to it) into
    ``directory``, as the module docstring lists."""
    if body_frozen(model):
        directory.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in head_tensors(model, state).items()}, str(directory / VALUE_HEAD))
        return
    if not lora.has_adapters(model):
        model.save_pretrained(directory, state_dict=state, safe_serialization=True)
        return
    lora.save_adapters(model, directory, state)
    head = head_tensors(model, state)
    if head:
        save_file({k: v.contiguous() for k, v in head.items()}, str(directory / VALUE_HEAD))


def load_model(directory: Path, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tensors :func:`save_model` wrote for ``model``. A frozen critic's checkpoint written whole
    (before its head was saved alone) still loads, its head alone: the body stays the run's own, which
    it shares with the reference."""
    if body_frozen(model):
        if (directory / VALUE_HEAD).is_file():
            return load_file(str(directory / VALUE_HEAD))
        return head_tensors(model, load_weights(directory))
    if not lora.has_adapters(model):
        return load_weights(directory)
    if not (directory / lora.ADAPTER_CONFIG).is_file():
        raise ConfigError(f"checkpoint directory {directory} holds no LoRA adapters ({lora.ADAPTER_CONFIG}), but "
                          "this run trains with model.lora_r > 0; resume with the run's own settings")
    tensors = lora.read_adapters(directory)
    if (directory / VALUE_HEAD).is_file():
        tensors.update(load_file(str(directory / VALUE_HEAD)))
    return tensors


def load_weights(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a ``save_pretrained`` directory: its ``model.safetensors``, or the shards that
    ``model.safetensors.index.json`` lists (transformers splits big models into several files)."""
    single = directory / "model.safetensors"
    if single.is_file():
        return load_file(str(single))
    index = directory / "model.safetensors.index.json"
    if not index.is_file():
        raise ConfigError(f"checkpoint directory {directory} has no model.safetensors nor model.safetensors.index.json")
    weights: dict[str, torch.Tensor] = {}
    for name in sorted(set(json.loads(index.read_text())["weight_map"].values())):
        weights.update(load_file(str(directory / name)))
    return weights


def frozen_bases(models: dict[str, tuple[torch.nn.Module | None, dict]]) -> dict:
    """Fingerprints of the frozen tensors (under LoRA adapters, or a frozen critic's body) of each
    ``name: (model, its full state dict)``; the trained value head left out. Empty when nothing is."""
    out = {}
    for name, (model, state) in models.items():
        if model is not None and partial(model):
            head = head_tensors(model, state)
            out[name] = lora.base_fingerprint({k: v for k, v in state.items() if k not in head})
    return out


def check_frozen_bases(path: Path, saved: dict, models: dict[str, torch.nn.Module | None]) -> None:
    """The frozen tensors are the ones the checkpoint's trained tensors were trained on."""
    for name, fingerprint in saved.items():
        model = models[name]
        state = model.state_dict()  # (sharded tensors are gathered one by one, on every rank)
        head = head_tensors(model, state)
        now = lora.base_fingerprint({k: v for k, v in state.items() if k not in head})
        if not lora.same_base(now, fingerprint):
            what = "LoRA adapters" if lora.has_adapters(model) else "value head"
            raise ConfigError(f"checkpoint {path}: the {name}'s base weights differ from the ones its {what} "
                              "were trained on; resume with the run's own model.policy (and reward model)")


def check_keys(model: torch.nn.Module, sd: dict, name: str) -> None:
    """Every tensor the model's files should hold is in ``sd``. ``save_pretrained`` drops tied
    duplicates, so those may be missing; nothing else may."""
    expected = model.state_dict()
    if partial(model):
        expected = [k for k in expected if lora.is_adapter_key(k)] + list(head_tensors(model, expected))
    missing = [k for k in expected if k not in sd]
    untied = set(missing) - {k for k in missing if "lm_head" in k or "embed" in k}
    if untied:
        raise ConfigError(f"checkpoint {name} weights do not match the model: missing {sorted(untied)[:5]}")
