"""Lean forward passes for Llama-family decoders (Llama, Qwen2, Qwen3, Mistral, Phi-3): the same math as
transformers' sdpa path, without its per-call overhead, and with work the PPO loop never reads left out.

What differs from ``model(input_ids, attention_mask, position_ids)`` — the results do not (tests check
log-probs and values against the plain transformers forward within 1e-5):

* q/k/v projections run as one matmul (weights concatenated per call, so the gradients still
  reach the original parameters), and so do gate/up when decoding with :func:`fused_weights`;
* RoPE is applied to q and k in one pass, from a cos/sin table built once by the model's own
  rotary module (so ``rope_scaling`` — linear, llama3, yarn, longrope — and Phi-3's partial rotary come
  out as transformers computes them);
* no per-row (B, 1, L, L) mask when no row is left-padded: trailing padding cannot reach a valid
  query under a causal mask, so one shared causal pattern is exact for every position that is read;
* attention is ``scaled_dot_product_attention`` (its fused CPU kernel avoids materialising the
  attention probabilities and beats two batched matmuls around a softmax in forward + backward,
  with one thread per CPU lane or two; see docs/benchmarks.md);
* ``keep_from``: the last layer computes queries, attention output and MLP only for positions
  ``>= keep_from`` (the earlier positions only contribute keys/values there), and the final norm
  runs on those positions only; ``keep_index`` does the same for any positions per row;
* packed rows (:mod:`.packing`): ``segment_ids`` give a block-diagonal causal mask, so several
  sequences share a row without seeing each other;
* decoding writes keys/values into preallocated buffers (:class:`KVBuffers`) instead of
  concatenating a growing cache every step;
* fp32 CPU matmuls go through oneDNN (:mod:`ppo_lm.models.onednn`), which beats MKL's sgemm at these shapes on
  some x86 CPUs (see docs/benchmarks.md);
* RMSNorm, RoPE and SwiGLU come from :mod:`ppo_lm.models.kernels` (fused by ``torch.compile`` when
  the trainer enables it).

Per-family pieces, each exactly as transformers computes it: Qwen3's RMSNorm of q and k per head before
RoPE; Phi-3's fused ``qkv_proj`` / ``gate_up_proj``; sliding-window layers (Mistral, Phi-3, Qwen2/3 with
``use_sliding_window``) get a banded mask once a row is longer than the window (by column index, as
transformers' cache positions; real tokens are contiguous in padded and packed rows alike).

:func:`ppo_lm.models.lean_support.supported` decides per model; anything it does not recognise (other architectures — the Gemma
family with its embedding scale, (1 + w) norms, GELU and soft-capping among them —, dynamic-NTK RoPE,
LoRA on Phi-3's fused projections, gradient checkpointing, dropout in training mode) takes the transformers
path. Separate projections with LoRA adapters (peft) run here: the frozen base's matmul plus the adapters'
(:func:`ppo_lm.models.lora.delta`), computed as peft's forward computes them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import kernels, lean_support, lora
from .onednn import linear, pack


def _proj(module: nn.Module, x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
    """A projection (``nn.Linear``, or a LoRA layer: its frozen base plus its adapters' output); with
    ``weight``, the base's weight and ``bias`` as :func:`fused_weights` holds them."""
    if weight is None:
        base = lora.plain_linear(module)
        weight, bias = base.weight, base.bias
    return lora.plus(linear(x, weight, bias), lora.delta(module, x))


def head(module: nn.Module, h: Tensor, packed: Tensor | None = None) -> Tensor:
    """An output head (e.g. ``lm_head``) applied to ``h``: through :func:`linear` when it is a plain
    ``nn.Linear`` (with ``packed``, its :func:`packed_head` weight), else the module itself (wrapped or
    custom heads)."""
    if packed is not None:
        return linear(h, packed)
    return _proj(module, h) if type(module) is nn.Linear else module(h)


def _heads(a: nn.Module) -> tuple[int, int, int]:
    """(query heads, key/value heads, head dim) of an attention module (separate or fused q/k/v)."""
    hd = a.head_dim
    fused = a._modules.get("qkv_proj")
    if fused is None:
        return a.q_proj.out_features // hd, a.k_proj.out_features // hd, hd
    n_q = a.o_proj.in_features // hd
    return n_q, (fused.out_features // hd - n_q) // 2, hd


def _qkv(a: nn.Module) -> tuple[Tensor, Tensor | None]:
    """The q‖k‖v weight and bias of an attention module: Phi-3's ``qkv_proj`` as it is, else the three
    projections concatenated (per call, so gradients reach them)."""
    fused = a._modules.get("qkv_proj")
    if fused is not None:
        return fused.weight, fused.bias
    return _fused([a.q_proj, a.k_proj, a.v_proj])


def _rms(x: Tensor, norm: nn.Module) -> Tensor:
    return kernels.rms_norm(x, norm.weight, norm.variance_epsilon)


def rope_table(body: nn.Module, length: int, dtype: torch.dtype, device) -> tuple[Tensor, Tensor]:
    """cos, sin (length, rd) for positions 0 … length−1, from the model's own rotary module (rd: the
    rotated dims, the head dim unless the rotary is partial)."""
    pos = torch.arange(length, device=device).unsqueeze(0)
    cos, sin = body.rotary_emb(torch.empty(0, dtype=dtype, device=device), pos)
    return cos[0], sin[0]


class KVBuffers:
    """Preallocated keys/values per layer: (N, kv_heads, capacity, hd); ``select`` drops finished rows."""

    def __init__(self, body: nn.Module, batch: int, capacity: int, dtype: torch.dtype, device):
        _, kv_heads, hd = _heads(body.layers[0].self_attn)
        shape = (batch, kv_heads, capacity, hd)
        self.k = [torch.empty(shape, dtype=dtype, device=device) for _ in body.layers]
        self.v = [torch.empty(shape, dtype=dtype, device=device) for _ in body.layers]

    def select(self, rows: Tensor) -> None:
        self.k = [k[rows] for k in self.k]
        self.v = [v[rows] for v in self.v]


def _fused(linears: list[nn.Module]) -> tuple[Tensor, Tensor | None]:
    """The concatenated weight and bias of projections that read the same input (LoRA layers: their
    frozen bases; :func:`lora.fused_delta` adds the adapters' part)."""
    bases = [lora.plain_linear(x) for x in linears]
    w = torch.cat([x.weight for x in bases])
    b = None if bases[0].bias is None else torch.cat([x.bias for x in bases])
    return w, b


def _separate(module: nn.Module, *names: str) -> list[nn.Module]:
    """The named projections of an attention or MLP module; [] where they are fused (Phi-3's qkv_proj,
    gate_up_proj: :func:`lean_support.supported` refuses adapters on those, so there is nothing to add)."""
    found = [module._modules.get(n) for n in names]
    return [] if any(f is None for f in found) else found


class DecodeWeights(NamedTuple):
    """One layer's weights for repeated no-grad calls (decoding): q‖k‖v and gate‖up concatenated once,
    every matrix in the layout :func:`onednn.pack` gives it (the plain tensors where oneDNN is not used).
    LoRA layers contribute their frozen bases here; their adapters still run per call."""

    qkv: Tensor
    qkv_bias: Tensor | None
    gate_up: Tensor
    o: Tensor
    o_bias: Tensor | None
    down: Tensor
    down_bias: Tensor | None


def fused_weights(body: nn.Module, rows: int = 1) -> list[DecodeWeights]:
    """Per layer :class:`DecodeWeights`, built once for inputs of about ``rows`` rows: for repeated
    no-grad calls while the weights do not change. Training forwards concatenate per call instead, so
    gradients reach the parameters."""
    with torch.no_grad():
        out = []
        for layer in body.layers:
            gate_up = layer.mlp._modules.get("gate_up_proj")
            w_gu = gate_up.weight if gate_up is not None else _fused([layer.mlp.gate_proj, layer.mlp.up_proj])[0]
            w_qkv, b_qkv = _qkv(layer.self_attn)
            o, down = lora.plain_linear(layer.self_attn.o_proj), lora.plain_linear(layer.mlp.down_proj)
            out.append(DecodeWeights(pack(w_qkv, rows), b_qkv, pack(w_gu, rows), pack(o.weight, rows), o.bias,
                                     pack(down.weight, rows), down.bias))
        return out


def packed_head(module: nn.Module, rows: int) -> Tensor | None:
    """The output head's weight in :func:`onednn.pack`'s layout when :func:`head` runs it as a plain linear
    layer, else None."""
    if type(module) is not nn.Linear or module.bias is not None:
        return None
    return pack(module.weight, rows)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE on the first cos.shape[-1] dims of each head of x (B, L, heads, hd); the rest pass through
    (partial rotary, Phi-3's ``partial_rotary_factor``)."""
    rd = cos.shape[-1]
    if rd == x.shape[-1]:
        return kernels.rotate(x, cos, sin)
    return torch.cat([kernels.rotate(x[..., :rd], cos, sin), x[..., rd:]], dim=-1)


_SDPA_GQA = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)
"""scaled_dot_product_attention takes ``enable_gqa`` (torch 2.5 on)."""


def _attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, plain_causal: bool, scale: float) -> Tensor:
    """Softmax attention. q (B, Hq, Lq, hd); k, v (B, Hkv, Lk, hd); mask bool, broadcastable to
    (B, 1, Lq, Lk), True = visible (None: every key); ``plain_causal``: the mask is the ordinary causal
    one starting at key 0. Returns (B, Hq, Lq, hd)."""
    B, n_q, Lq, hd = q.shape
    n_kv = k.shape[1]
    if Lq == 1 and n_q != n_kv:
        # One query per row: fold the query heads sharing a kv head into the query axis (no repeat).
        out = F.scaled_dot_product_attention(q.reshape(B, n_kv, n_q // n_kv, hd), k, v, attn_mask=mask, scale=scale)
        return out.reshape(B, n_q, 1, hd)
    gqa = {}
    if n_q != n_kv and _SDPA_GQA:
        # the kernel reads each kv head for its query heads: the backward keeps k and v as they are
        # (not n_q / n_kv copies); same outputs, k's and v's gradients summed over the group in another order
        gqa = {"enable_gqa": True}
    elif n_q != n_kv:
        k, v = k.repeat_interleave(n_q // n_kv, 1), v.repeat_interleave(n_q // n_kv, 1)
    if plain_causal:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, **gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, **gqa)


def split_qkv(a: nn.Module, qkv: Tensor, n_q: int, n_kv: int, cos: Tensor, sin: Tensor):
    """q, k, v (B, L, heads, hd) from the fused projection ``qkv`` (B, L, n_q + 2·n_kv, hd) of attention
    module ``a``: RoPE on q and k in one pass, after Qwen3's per-head q/k RMSNorm where ``a`` has it."""
    q_norm = a._modules.get("q_norm")
    if q_norm is None:
        qk, v = qkv.split([n_q + n_kv, n_kv], dim=2)
        q, k = _rotate(qk, cos, sin).split([n_q, n_kv], dim=2)
        return q, k, v
    q, k, v = qkv.split([n_q, n_kv, n_kv], dim=2)
    return _rotate(_rms(q, q_norm), cos, sin), _rotate(_rms(k, a.k_norm), cos, sin), v


def _queries(t: Tensor, cut: int, pick: Tensor | None) -> Tensor:
    """The query positions of a layer along dim 1 of ``t`` (B, L, …): from ``cut`` on, or ``pick`` (B, K)."""
    if pick is None:
        return t[:, cut:]
    return t.gather(1, pick.view(*pick.shape, *([1] * (t.dim() - 2))).expand(-1, -1, *t.shape[2:]))


def _attention_masks(body, attention_mask: Tensor, L: int, cache_pos: int, cached: bool, key_valid, segment_ids):
    """Per-layer masks of :func:`forward_hidden`: ``(windows, masks)``, ``windows[i]`` layer i's sliding
    window (None: full) and ``masks[w] = (mask, causal)``: mask (B, 1, L, total) bool or None, causal
    (L, total) bool when the plain causal pattern is all there is, both None for one query over real keys."""
    B, total, device = attention_mask.shape[0], cache_pos + L, attention_mask.device
    q_pos = torch.arange(cache_pos, total, device=device)
    k_pos = torch.arange(total, device=device)
    if not cached and segment_ids is None and not bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all()):
        key_valid = attention_mask.bool()  # some row is left-padded: mask its pad keys
    mask = causal = None
    if segment_ids is not None:  # block-diagonal causal (an empty slot sees the empty slots before it)
        same = segment_ids[:, :, None] == segment_ids[:, None, :]
        mask = (same & (k_pos[None, None, :] <= q_pos[None, :, None])).unsqueeze(1)  # (B, 1, L, L)
    elif key_valid is not None:
        allowed = key_valid[:, None, :] & (k_pos[None, None, :] <= q_pos[None, :, None])
        # A left-pad query sees no real key; let it see itself so its (unused) output stays finite.
        allowed |= k_pos[None, None, :] == q_pos[None, :, None]
        mask = allowed.unsqueeze(1)  # (B, 1, L, total)
    elif L > 1:
        causal = k_pos[None, :] <= q_pos[:, None]
    # Sliding-window layers: a window only changes anything once a query is ≥ window columns past a key.
    windows = [w if w is not None and w < total else None for w in lean_support.windows(body.config, len(body.layers))]
    masks = {None: (mask, causal)}
    for w in set(windows) - {None}:
        near = k_pos[None, :] > q_pos[:, None] - w  # (L, total), transformers' sliding_window_overlay
        base = mask if mask is not None else (causal if causal is not None else near).view(1, 1, L, total)
        masks[w] = ((base & near).expand(B, 1, L, total), None)
    return windows, masks


def _layer_qkv(a: nn.Module, x: Tensor, cos: Tensor, sin: Tensor, cut: int, pick: Tensor | None, wi):
    """Rotated q (B, L', n_q, hd) of the kept queries and k, v (B, L, n_kv, hd) of one attention layer
    from its normed input x (B, L, d); L' = L − cut, or K with ``pick``. ``wi``: its :func:`fused_weights`."""
    B, L = x.shape[:2]
    n_q, n_kv, hd = _heads(a)
    if not cut and pick is None:
        w, b = (wi.qkv, wi.qkv_bias) if wi is not None else _qkv(a)
        qkv = lora.plus(linear(x, w, b), lora.fused_delta(_separate(a, "q_proj", "k_proj", "v_proj"), x))
        return split_qkv(a, qkv.view(B, L, n_q + 2 * n_kv, hd), n_q, n_kv, cos, sin)
    if "qkv_proj" in a._modules:
        w, b = a.qkv_proj.weight, a.qkv_proj.bias
        wq, bq = w[: n_q * hd], None if b is None else b[: n_q * hd]
        w, b = w[n_q * hd :], None if b is None else b[n_q * hd :]
    else:
        base_q = lora.plain_linear(a.q_proj)
        wq, bq = base_q.weight, base_q.bias
        w, b = _fused([a.k_proj, a.v_proj])
    kv = lora.plus(linear(x, w, b), lora.fused_delta(_separate(a, "k_proj", "v_proj"), x)).view(B, L, 2 * n_kv, hd)
    k, v = kv.split([n_kv, n_kv], dim=2)  # split (not slicing): its backward is one cat
    xq = _queries(x, cut, pick)
    q = lora.plus(linear(xq, wq, bq), lora.fused_delta(_separate(a, "q_proj"), xq)).view(B, xq.shape[1], n_q, hd)
    q_norm = a._modules.get("q_norm")
    if q_norm is not None:
        q, k = _rms(q, q_norm), _rms(k, a.k_norm)
    return _rotate(q, _queries(cos, cut, pick), _queries(sin, cut, pick)), _rotate(k, cos, sin), v


def forward_hidden(
    body: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    keep_from: int = 0,
    position_ids: Tensor | None = None,
    cos_sin: tuple[Tensor, Tensor] | None = None,
    cache: KVBuffers | None = None,
    cache_pos: int = 0,
    key_valid: Tensor | None = None,
    weights: list[DecodeWeights] | None = None,
    segment_ids: Tensor | None = None,
    keep_index: Tensor | None = None,
) -> Tensor:
    """Final-norm hidden states (B, L − keep_from, d) of positions keep_from … L−1.

    Args:
        input_ids: (B, L) tokens; attention_mask: (B, L) 1 = real token (left/right padding allowed).
        keep_from: first position whose output is needed (the last layer skips earlier queries).
        position_ids: (B, L); default: count of real tokens before each position (left padding skipped).
        cos_sin: a :func:`rope_table` covering every position id (built here when None).
        cache, cache_pos: write this call's keys/values at ``cache_pos`` … ``cache_pos + L − 1`` of the
            buffers and attend over positions 0 … ``cache_pos + L − 1`` (prefill / decode).
        key_valid: (B, cache_pos + L) bool, real tokens among the attended keys (with ``cache``);
            None when every key is real.
        weights: :func:`fused_weights` of ``body`` (no-grad callers that run many steps).
        segment_ids: (B, L) packed rows (:mod:`.packing`): a query sees only earlier keys of its own
            segment; pass ``position_ids`` too. Not with ``cache``.
        keep_index: (B, K) positions whose outputs are needed, instead of ``keep_from``: the last
            layer computes queries, attention output and MLP for those only. Returns (B, K, d).
    """
    B, L = input_ids.shape
    if position_ids is None:
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
    h = body.embed_tokens(input_ids)
    if cos_sin is None:
        cos_sin = rope_table(body, int(position_ids.max()) + 1, h.dtype, h.device)
    cos, sin = cos_sin[0][position_ids].unsqueeze(2), cos_sin[1][position_ids].unsqueeze(2)

    total = cache_pos + L
    windows, masks = _attention_masks(body, attention_mask, L, cache_pos, cache is not None, key_valid, segment_ids)

    n = len(body.layers)
    for i, layer in enumerate(body.layers):
        a, m = layer.self_attn, layer.mlp
        wi = weights[i] if weights is not None else None
        last = i == n - 1
        cut = keep_from if last else 0  # queries before `cut` are never read after this layer
        pick = keep_index if last else None
        mask_i, causal_i = masks[windows[i]]

        residual = _queries(h, cut, pick)
        x = _rms(h, layer.input_layernorm)
        q, k, v = _layer_qkv(a, x, cos, sin, cut, pick, wi)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if cache is not None:
            cache.k[i][:, :, cache_pos:total] = k
            cache.v[i][:, :, cache_pos:total] = v
            k, v = cache.k[i][:, :, :total], cache.v[i][:, :, :total]
        if mask_i is not None:  # (B, 1, L, total): its query rows, selected along dim 1 of (B, L, 1, total)
            out = _attend(q, k, v, _queries(mask_i.transpose(1, 2), cut, pick).transpose(1, 2), False, a.scaling)
        elif causal_i is not None and pick is not None:
            out = _attend(q, k, v, _queries(causal_i.expand(B, -1, -1), cut, pick).unsqueeze(1), False, a.scaling)
        elif causal_i is not None:
            out = _attend(q, k, v, causal_i[cut:].view(1, 1, L - cut, total), not cut, a.scaling)
        else:
            out = _attend(q, k, v, None, False, a.scaling)
        out = out.transpose(1, 2).flatten(2)  # (B, L', n_q · hd)
        h = residual + (_proj(a.o_proj, out) if wi is None else _proj(a.o_proj, out, wi.o, wi.o_bias))
        x = _rms(h, layer.post_attention_layernorm)
        if wi is not None:
            gate, up = lora.plus(linear(x, wi.gate_up), lora.fused_delta(_separate(m, "gate_proj", "up_proj"), x)).chunk(2, dim=-1)
        elif "gate_up_proj" in m._modules:  # Phi-3: one fused projection, gate then up
            gate, up = _proj(m.gate_up_proj, x).chunk(2, dim=-1)
        else:  # with autograd, a fused gate/up would cost a weight cat and a (B, L, 2f) gradient cat
            gate, up = _proj(m.gate_proj, x), _proj(m.up_proj, x)
        act = kernels.swiglu(gate, up)
        h = h + (_proj(m.down_proj, act) if wi is None else _proj(m.down_proj, act, wi.down, wi.down_bias))
    return _rms(h, body.norm)
