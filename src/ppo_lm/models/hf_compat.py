"""Small shims over Hugging Face model APIs that differ across transformers versions."""

from __future__ import annotations

import contextlib
import inspect
import json
from functools import cache
from pathlib import Path

from torch import nn


@cache
def cache_kwarg(model_cls: type) -> str:
    """Name of the KV-cache argument of ``model_cls.forward`` (``cache`` since 5.x, else ``past_key_values``)."""
    params = inspect.signature(model_cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def new_cache(model: nn.Module):
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:  # older transformers
        return DynamicCache()


def trunk(model: nn.Module) -> nn.Module:
    """The transformer body of any ``*ForCausalLM``/``*ForSequenceClassification``/``*ForTokenClassification``."""
    body = getattr(model, "base_model", None)
    if body is None or body is model:
        raise ValueError(f"{type(model).__name__} has no separate transformer body (`base_model`)")
    return body


def hidden_size(model: nn.Module) -> int:
    """The model's hidden size from its config (0 when it has none)."""
    return int(getattr(getattr(model, "config", None), "hidden_size", 0) or 0)


def scalar_head(model: nn.Module) -> nn.Linear:
    """The scalar output layer of a one-label classification model (``score`` or ``classifier``)."""
    for name in ("score", "classifier", "v_head"):
        head = getattr(model, name, None)
        if isinstance(head, nn.Linear):
            return head
    raise ValueError(f"{type(model).__name__} has no `score`/`classifier` linear head")


def disable_dropout(model: nn.Module) -> None:
    """PPO needs identical numerics in rollout and update: no dropout anywhere — the ``nn.Dropout``
    modules and the attention dropout rates that attention modules read at forward time in training
    mode — so that training mode (which gradient checkpointing needs) computes what eval mode does."""
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
        for name, value in list(vars(m).items()):
            if is_dropout_rate(name, value):
                setattr(m, name, 0.0)
    model.eval()


def is_dropout_rate(name: str, value: object) -> bool:
    """A float attribute that holds a random-drop probability by transformers' naming: dropout
    (``attention_dropout``, ``hidden_dropout``, ``resid_pdrop``, …), ``layerdrop``, ``drop_path_rate``."""
    return isinstance(value, float) and not isinstance(value, bool) and "drop" in name


def enable_checkpointing(model: nn.Module) -> None:
    """Switch on transformers' gradient (activation) checkpointing of ``model``'s layers: each layer's
    activations are recomputed in the backward instead of kept (transformers 5 renamed the method)."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()


def is_checkpointed(*models: nn.Module | None) -> bool:
    """Whether any of ``models`` has gradient checkpointing switched on (transformers' layer flag)."""
    return any(vars(m).get("gradient_checkpointing") is True for model in models if model is not None
               for m in model.modules())


UPDATE_STATE = "_ppo_lm_update_state"
"""Key in a module's ``__dict__`` of ``f(module) -> context manager`` that :func:`checkpointing_on` holds."""


@contextlib.contextmanager
def checkpointing_on(*models: nn.Module | None):
    """Make gradient checkpointing run in a forward/backward of models that sit in eval mode.

    transformers checkpoints a layer's activations only when that layer is in training mode, and the
    trained models stay in eval mode (:func:`disable_dropout`). For the duration, put only the
    modules that carry the checkpointing switch in training mode — their sub-modules (attention,
    MLP, dropout) stay in eval mode — and zero the dropout rates that some layers read from the model
    config at forward time; everything is put back afterwards. A no-op for models that do not
    checkpoint.

    A module may also hold, under :data:`UPDATE_STATE` in its ``__dict__``, a function that takes the
    module and returns a context manager: it is entered for the duration too, for state that the
    module's forwards switch on only while they run and that the backward's recomputation must see
    as well. LoRA's adapter dropout is one (:func:`ppo_lm.models.lora.add_adapters` registers it): a
    forward that records gradients switches it on only while it runs, but a checkpointed layer runs
    again inside ``backward()``, after that forward has returned, and with the dropout off by then the
    recompute would save other tensors than the forward did (torch's CheckpointError) and compute
    other activations. Held on, the recompute drops as the forward did, with the same masks, as the
    checkpoint restores the random state the forward started from.
    """
    modes, rates = [], []
    checkpointed = [m for m in models if m is not None and is_checkpointed(m)]
    for model in checkpointed:
        for sub in model.modules():
            if vars(sub).get("gradient_checkpointing") is True:
                modes.append((sub, sub.training))
            config = vars(sub).get("config")
            if config is not None and all(c is not config for c, _, _ in rates):
                rates += [(config, k, v) for k, v in vars(config).items() if is_dropout_rate(k, v) and v != 0.0]
    for sub, _ in modes:
        sub.training = True
    for config, k, _ in rates:
        setattr(config, k, 0.0)
    try:
        with contextlib.ExitStack() as held:
            for sub in (s for model in checkpointed for s in model.modules() if UPDATE_STATE in vars(s)):
                held.enter_context(vars(sub)[UPDATE_STATE](sub))
            yield
    finally:
        for sub, training in modes:
            sub.training = training
        for config, k, v in rates:
            setattr(config, k, v)


def gguf_file(path: str | Path) -> Path | None:
    """The GGUF file ``path`` names: the file itself, or the one ``.gguf`` of a directory without a
    ``config.json`` (a llama.cpp-style download); None for anything else."""
    p = Path(path)
    if p.is_file() and p.suffix == ".gguf":
        return p
    if p.is_dir() and not (p / "config.json").is_file():
        found = sorted(p.glob("*.gguf"))
        if len(found) == 1:
            return found[0]
    return None


def load_tokenizer(path: str | Path):
    """Load a tokenizer directory (or the tokenizer inside a GGUF file, see :func:`gguf_file`) offline.

    A plain ``tokenizers``-backed tokenizer (like the built-in character tokenizer) is loaded as
    ``PreTrainedTokenizerFast``: transformers 5's ``AutoTokenizer`` would otherwise pick the model
    type's own tokenizer class (e.g. Qwen2Tokenizer) next to a Qwen2 ``config.json`` and re-split
    the text differently from how the model was trained.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    gguf = gguf_file(path)
    if gguf is not None:  # the tokenizer stored in the GGUF file's metadata
        return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    cfg_file = Path(path) / "tokenizer_config.json"
    declared = json.loads(cfg_file.read_text()).get("tokenizer_class") if cfg_file.is_file() else None
    if declared in ("TokenizersBackend", "PreTrainedTokenizerFast"):
        return PreTrainedTokenizerFast.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path)
