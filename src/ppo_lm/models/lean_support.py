"""Which decoder bodies the lean forward (:mod:`ppo_lm.models.lean`) runs exactly, and the per-config
facts it needs (RoPE type, sliding windows per layer). Anything :func:`supported` does not recognise takes
the transformers path, so a new architecture or setting is never run through math it was not checked
against (tests/test_model_families.py compares every supported family with transformers).
"""

from __future__ import annotations

from torch import Tensor, nn

from . import lora

_TYPES = ("qwen2", "llama", "qwen3", "mistral", "phi3")
# RoPE types whose frequencies are fixed by the config; "longrope" picks its short or long factors per
# call from the longest position (the lean forward builds its table the same way, see :func:`rope_fits`).
# "dynamic" (NTK) rescales from the history of calls, which a table built once would not follow.
_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")
_QK_NORM = ("qwen3",)  # RMSNorm of each query/key head before RoPE
_ALL_LAYERS_WINDOW = ("mistral", "phi3")  # config.sliding_window (when set) applies to every layer
# Config keys that ``actor_critic.output_logits`` applies to the logits (the lean decoder does not).
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logits_scaling")


def _rope_type(config) -> str:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
        return "other"  # per-layer-type RoPE (Gemma 3) or something unknown
    return params.get("rope_type", params.get("type", "default"))


def windows(config, n_layers: int) -> list[int | None] | None:
    """Per layer, the sliding-window size transformers applies (None: full attention); None when the
    config names a layer type the lean forward does not implement."""
    window = getattr(config, "sliding_window", None)
    if config.model_type in _ALL_LAYERS_WINDOW:
        return [window] * n_layers
    types = getattr(config, "layer_types", None) or ["full_attention"] * n_layers
    if config.model_type == "llama":  # LlamaModel has no sliding layers
        return [None] * n_layers if all(t == "full_attention" for t in types) else None
    if len(types) != n_layers or any(t not in ("full_attention", "sliding_attention") for t in types):
        return None
    return [window if t == "sliding_attention" else None for t in types]


def _is_dtensor(t: Tensor) -> bool:
    return type(t).__name__ == "DTensor" or type(getattr(t, "data", None)).__name__ == "DTensor"


def supported(body: nn.Module) -> bool:
    """True when ``body`` (a LlamaModel, Qwen2Model, Qwen3Model, MistralModel or Phi3Model) can run
    through the lean path exactly."""
    cfg = getattr(body, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in _TYPES or not hasattr(body, "layers"):
        return False
    if getattr(body, "gradient_checkpointing", False) or getattr(cfg, "hidden_act", None) != "silu":
        return False
    if _rope_type(cfg) not in _ROPE_TYPES or getattr(cfg, "pretraining_tp", 1) not in (None, 1):
        return False
    if windows(cfg, len(body.layers)) is None:
        return False
    if any(getattr(cfg, k, None) for k in _LOGIT_TRANSFORMS):
        return False  # (stray keys these architectures ignore: the output-head probe of the policy decides)
    if getattr(cfg, "_attn_implementation", "sdpa") not in ("sdpa", "eager", None):
        return False
    if type(getattr(body, "embed_tokens", None)) is not nn.Embedding or not hasattr(body, "rotary_emb"):
        return False
    qk_norm = cfg.model_type in _QK_NORM
    for layer in body.layers:
        a, m = layer.self_attn, layer.mlp
        fused_qkv, fused_mlp = a._modules.get("qkv_proj"), m._modules.get("gate_up_proj")
        qkv = [fused_qkv] if fused_qkv is not None else [a.q_proj, a.k_proj, a.v_proj]
        gate_up = [fused_mlp] if fused_mlp is not None else [m.gate_proj, m.up_proj]
        if _is_dtensor(qkv[0].weight):  # FSDP-sharded: only the layer's own forward gathers it
            return False
        if any(lora.is_lora_layer(x) for x in (fused_qkv, fused_mlp) if x is not None):
            return False  # adapters on a fused projection: transformers' path
        linears = [lora.plain_linear(x) for x in (*qkv, a.o_proj, *gate_up, m.down_proj)]
        if any(x is None for x in linears) or any(lora.plain_linear(x).bias is not None for x in gate_up):
            return False
        if len({lora.plain_linear(x).bias is None for x in qkv}) != 1:
            return False
        norms = [a._modules.get("q_norm"), a._modules.get("k_norm")]
        if qk_norm:
            if not all(x is not None and hasattr(x, "variance_epsilon") for x in norms):
                return False
        elif any(x is not None for x in norms):
            return False
        if body.training and (getattr(a, "attention_dropout", 0.0) or any(
                isinstance(x, nn.Dropout) and x.p > 0 for x in layer.modules())):
            return False
    return True


def rope_fits(body: nn.Module, length: int) -> bool:
    """Whether one RoPE table for positions 0 … ``length`` − 1 gives what transformers computes at every
    decode step up to that length: always, except for longrope past its original context (transformers
    switches from the short to the long factors mid-sequence there)."""
    cfg = body.config
    if _rope_type(cfg) != "longrope":
        return True
    params = getattr(cfg, "rope_parameters", None) or {}
    original = params.get("original_max_position_embeddings") or getattr(cfg, "original_max_position_embeddings", 0)
    return length <= int(original or 0)
