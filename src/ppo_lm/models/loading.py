"""Loading a user's model and tokenizer directories, with a one-line error for everything a user can
get wrong: a missing path, a file, an empty or half-copied directory, a damaged ``config.json``, a
checkpoint of the wrong kind (a policy without a language-model head), missing weights.

:func:`check_model_dir` reads only ``config.json`` and the file names, so it runs before any model
loads; :func:`load_model` repeats it, loads, and checks that every weight the role needs came from
the checkpoint rather than from a random initialisation (docs/errors.md)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Literal

from torch import nn

from ..runtime.errors import UserError
from .hf_compat import gguf_file

Kind = Literal["causal-lm", "sequence-classification", "token-classification", "any"]

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")
_KIND_SUFFIXES = {
    "causal-lm": ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration"),
    "sequence-classification": ("ForSequenceClassification",),
    "token-classification": ("ForTokenClassification",),
}
_KIND_WORDS = {
    "causal-lm": "a causal language model (a policy needs its language-model head)",
    "sequence-classification": "a one-label sequence-classification reward model (train one with `ppo-lm rm`)",
}


class ModelLoadError(UserError):
    """A model or tokenizer directory that cannot be used; the message names the setting and the fix."""


def _describe(arch: str) -> str:
    for kind, word in (("ForTokenClassification", "a token-classification model (such as a run's critic/)"),
                       ("ForSequenceClassification", "a sequence-classification model (such as a reward model)"),
                       ("ForCausalLM", "a causal language model")):
        if arch.endswith(kind):
            return f"{word}, {arch}"
    return arch


def check_model_dir(path: str | Path, field: str, kind: Kind = "any") -> dict:
    """Check that ``path`` is a transformers checkpoint directory of ``kind`` without loading it.

    Returns its parsed ``config.json``. Raises :class:`ModelLoadError` naming ``field`` (the setting
    that gave the path) for a missing path, a file, an empty directory, no or damaged ``config.json``,
    an unknown ``model_type``, no weight files, or ``architectures`` of another kind.
    """
    p = Path(path)
    where = f"`{field}` {str(path)!r}"
    if not p.exists() and is_hub_id(str(path)):
        return _hub_config(str(path), where)
    if not p.exists():
        raise ModelLoadError(f"{where} does not exist (models load from a directory written by save_pretrained "
                             "or by ppo-lm, a .gguf file, or a Hugging Face Hub id such as org/name); check the path")
    if gguf_file(p) is not None:
        if kind not in ("causal-lm", "any"):
            raise ModelLoadError(f"{where} is a GGUF file, which holds a causal language model, not {_KIND_WORDS[kind]}")
        _require_gguf(where)
        return {}
    if not p.is_dir():
        raise ModelLoadError(f"{where} is a file; give the model's directory (the one holding config.json) or a "
                             ".gguf file")
    if not any(p.iterdir()):
        raise ModelLoadError(f"{where} is an empty directory; give a directory written by save_pretrained or by ppo-lm")
    cfg_file = p / "config.json"
    if not cfg_file.is_file():
        raise ModelLoadError(f"{where} holds no config.json, so it is not a transformers model directory "
                             f"(it holds: {', '.join(sorted(q.name for q in p.iterdir())[:6])})")
    try:
        config = json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{where}: config.json is not valid JSON ({e}); the checkpoint is damaged — "
                             "copy or save it again") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ModelLoadError(f"{where}: config.json has no `model_type`; the checkpoint is damaged or not "
                             "a transformers model — copy or save it again")
    from transformers import CONFIG_MAPPING, __version__

    if config["model_type"] not in CONFIG_MAPPING:
        raise ModelLoadError(f"{where}: model_type {config['model_type']!r} is unknown to transformers "
                             f"{__version__}; upgrade transformers or check config.json")
    if not any((p / f).is_file() for f in WEIGHT_FILES):
        raise ModelLoadError(f"{where} holds no weights ({' or '.join(WEIGHT_FILES[::2])}); the copy is "
                             "incomplete")
    archs = config.get("architectures") or []
    if kind in _KIND_WORDS and archs and not any(a.endswith(_KIND_SUFFIXES[kind]) for a in archs):
        raise ModelLoadError(f"{where} is {_describe(archs[0])}, not {_KIND_WORDS[kind]}")
    return config


def check_tokenizer_dir(path: str | Path, field: str) -> None:
    """Check that ``path`` holds a tokenizer (by its file names, or a GGUF file's) before anything loads."""
    p = Path(path)
    where = f"`{field}` {str(path)!r}"
    if gguf_file(p) is not None or (not p.exists() and is_hub_id(str(path))):
        return
    if not p.exists():
        raise ModelLoadError(f"{where} does not exist (tokenizers load offline, from a local directory); check the path")
    if not p.is_dir():
        raise ModelLoadError(f"{where} is a file; give the tokenizer's directory (the one holding tokenizer.json)")
    if not any((p / f).is_file() for f in TOKENIZER_FILES):
        raise ModelLoadError(f"{where} holds no tokenizer ({', '.join(TOKENIZER_FILES)}); set `model.tokenizer` "
                             "to the directory that has one")


@contextlib.contextmanager
def _quiet_transformers():
    """transformers prints a load report of missing/unexpected keys; :func:`load_model` checks the
    keys itself and says what matters, so the report is silenced while it runs."""
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(before)


def load_model(auto_cls, path: str | Path, field: str, kind: Kind, *, require_head: bool = True, **kwargs) -> nn.Module:
    """``auto_cls.from_pretrained(path, **kwargs)`` after :func:`check_model_dir`, with one-line errors.

    ``require_head``: every weight must come from the checkpoint — for a policy, a language-model
    head initialised at random would be trained as if it were the model's own. False allows a fresh
    output head only (e.g. a critic's value head on a causal LM's body); any other missing weight is
    still an error.
    """
    check_model_dir(path, field, kind)
    where = f"`{field}` {str(path)!r}"
    gguf = gguf_file(path)
    try:
        with _quiet_transformers():
            if gguf is not None:
                return _load_gguf(auto_cls, gguf, **kwargs)
            model, info = auto_cls.from_pretrained(str(path), output_loading_info=True, **kwargs)
    except Exception as e:  # noqa: BLE001 (whatever a damaged file makes transformers or safetensors raise)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"{where} could not be loaded: {first}") from None
    missing = sorted(info.get("missing_keys") or ())
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_names = {f"{n}.{p}" for n, m in model.named_modules() if head is not None and m is head
                  for p, _ in m.named_parameters(recurse=False)}
    for name in ("score", "classifier"):
        if isinstance(getattr(model, name, None), nn.Linear):
            head_names |= {f"{name}.weight", f"{name}.bias"}
    missing_head = [k for k in missing if k in head_names]
    missing_body = [k for k in missing if k not in head_names]
    if missing_head and require_head:
        what = "language-model head" if kind == "causal-lm" else "output head"
        raise ModelLoadError(
            f"{where} has no {what} weights ({', '.join(missing_head)}): it would start from a random head. "
            + ("Give a causal LM checkpoint (a run's policy/, not its critic/)" if kind == "causal-lm"
               else "Give a checkpoint trained for this role (`ppo-lm rm` writes reward models)"))
    if missing_body:
        more = f" and {len(missing_body) - 3} more" if len(missing_body) > 3 else ""
        raise ModelLoadError(f"{where} lacks weights {', '.join(missing_body[:3])}{more}: the checkpoint is "
                             "incomplete or of another architecture than its config.json says")
    return model


def is_hub_id(spec: str) -> bool:
    """``org/name`` as the Hugging Face Hub writes ids (not a local path: no leading ``.``, ``/``, ``~``)."""
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "~")) and not spec.endswith(".gguf")


def _hub_config(repo_id: str, where: str) -> dict:
    """The ``config.json`` of a Hub model (downloaded and cached); a one-line error when the Hub cannot
    be reached or has no such model."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        raise ModelLoadError(
            f"{where} is not a local path, and the Hugging Face Hub is switched off (HF_HUB_OFFLINE is set): "
            "download the model where there is network (`huggingface-cli download ID --local-dir DIR`) and give "
            "the directory, or unset HF_HUB_OFFLINE")
    try:
        from huggingface_hub import hf_hub_download

        return json.loads(Path(hf_hub_download(repo_id, "config.json", etag_timeout=5)).read_text())
    except Exception as e:  # noqa: BLE001 (offline, unknown id, gated model: all say the same to the user)
        first = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise ModelLoadError(
            f"{where} is not a local path, and loading it as a Hugging Face Hub id failed ({first}). This machine "
            "may be offline: download the model where there is network (`huggingface-cli download ID --local-dir "
            "DIR`) and give the directory") from None


def _require_gguf(where: str) -> None:
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        raise ModelLoadError(f"{where} is a GGUF file; reading one needs the `gguf` package: pip install gguf")


def _load_gguf(auto_cls, gguf: Path, **kwargs) -> nn.Module:
    """A GGUF checkpoint, dequantised by transformers, copied into a fresh model of its config:
    transformers refuses ``save_pretrained`` on a GGUF-loaded model, and checkpoints must save."""
    loaded = auto_cls.from_pretrained(str(gguf.parent), gguf_file=gguf.name, **kwargs)
    fresh = auto_cls.from_config(loaded.config, dtype=kwargs.get("dtype", loaded.dtype))
    fresh.load_state_dict(loaded.state_dict())
    fresh.generation_config = loaded.generation_config
    return fresh
