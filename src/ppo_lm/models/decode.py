"""One decode step of the lean forward: a single new token per row against the KV buffers.

The same arithmetic as :func:`ppo_lm.models.lean.forward_hidden` with one query per row, a cache and
:func:`~ppo_lm.models.lean.fused_weights` (tests compare every supported family's sampled tokens and
logits with the full forward), without the work a general call does per layer that a decode step does
not need: no causal pattern (one query sees every cached key), per-layer facts (heads, norms, windows,
adapters) looked up once per :class:`DecodePlan` instead of every step, and masks only for
left-padded prompts and sliding windows. At a few rows per step a decode step is per-op overhead more
than arithmetic (docs/benchmarks.md, W4).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from . import kernels, lean_support, lora
from .lean import DecodeWeights, KVBuffers, _attend, _heads, _proj, _rms, _separate, fused_weights, split_qkv
from .onednn import linear


@dataclass
class _Layer:
    """What a decode step needs of one decoder layer, looked up once."""

    module: nn.Module
    weights: DecodeWeights
    heads: tuple[int, int, int]  # query heads, key/value heads, head dim
    window: int | None
    qkv_adapters: list[nn.Module]  # the separate q/k/v projections (LoRA deltas), [] when fused
    gate_up_adapters: list[nn.Module]


class DecodePlan:
    """A body's decode step for a batch of about ``rows`` rows: weights packed once
    (:func:`~ppo_lm.models.lean.fused_weights`) and per-layer facts, valid while the weights stay."""

    def __init__(self, body: nn.Module, rows: int):
        self.body = body
        n = len(body.layers)
        windows = lean_support.windows(body.config, n) or [None] * n
        self.layers = [
            _Layer(layer, w, _heads(layer.self_attn), windows[i],
                   _separate(layer.self_attn, "q_proj", "k_proj", "v_proj"),
                   _separate(layer.mlp, "gate_proj", "up_proj"))
            for i, (layer, w) in enumerate(zip(body.layers, fused_weights(body, rows)))
        ]
        self.weights = [x.weights for x in self.layers]

    def hidden(self, tokens: Tensor, positions: Tensor, cos_sin: tuple[Tensor, Tensor], cache: KVBuffers,
               cache_pos: int, key_valid: Tensor | None = None) -> Tensor:
        """Final-norm hidden states (N, 1, d) after feeding ``tokens`` (N, 1) at ``positions`` (N, 1),
        written to the buffers at ``cache_pos``; ``key_valid`` (N, cache_pos + 1) bool marks the real
        keys (None: all are)."""
        N = tokens.shape[0]
        total = cache_pos + 1
        h = self.body.embed_tokens(tokens)
        cos, sin = cos_sin[0][positions].unsqueeze(2), cos_sin[1][positions].unsqueeze(2)
        masks: dict[int | None, Tensor | None] = {None: None if key_valid is None else key_valid.view(N, 1, 1, total)}
        for x in self.layers:
            if x.window is not None and x.window < total and x.window not in masks:
                near = torch.arange(total, device=h.device) > cache_pos - x.window  # transformers' overlay
                masks[x.window] = near.view(1, 1, 1, total) if key_valid is None else masks[None] & near
        for i, x in enumerate(self.layers):
            h = self._layer(i, x, h, cos, sin, cache, cache_pos, masks[x.window if x.window in masks else None])
        return _rms(h, self.body.norm)

    @staticmethod
    def _layer(i: int, x: _Layer, h: Tensor, cos: Tensor, sin: Tensor, cache: KVBuffers, cache_pos: int,
               mask: Tensor | None) -> Tensor:
        """One layer on (N, 1, d) hidden states: attention over the buffers, then the MLP."""
        layer, w = x.module, x.weights
        a, m = layer.self_attn, layer.mlp
        n_q, n_kv, hd = x.heads
        N = h.shape[0]
        y = _rms(h, layer.input_layernorm)
        qkv = lora.plus(linear(y, w.qkv, w.qkv_bias), lora.fused_delta(x.qkv_adapters, y)).view(N, 1, n_q + 2 * n_kv, hd)
        q, k, v = split_qkv(a, qkv, n_q, n_kv, cos, sin)
        total = cache_pos + 1
        cache.k[i][:, :, cache_pos:total] = k.transpose(1, 2)
        cache.v[i][:, :, cache_pos:total] = v.transpose(1, 2)
        out = _attend(q.transpose(1, 2), cache.k[i][:, :, :total], cache.v[i][:, :, :total], mask, False, a.scaling)
        h = h + _proj(a.o_proj, out.transpose(1, 2).reshape(N, 1, n_q * hd), w.o, w.o_bias)
        y = _rms(h, layer.post_attention_layernorm)
        gate, up = lora.plus(linear(y, w.gate_up), lora.fused_delta(x.gate_up_adapters, y)).chunk(2, dim=-1)
        return h + _proj(m.down_proj, kernels.swiglu(gate, up), w.down, w.down_bias)
