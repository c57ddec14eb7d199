"""KV-cached autoregressive sampling for rollouts (docs/algorithm.md §1.1).

One prefill over the left-padded prompts, then one single-token forward per step with a KV cache.
Sequences that stop leave the decode batch (their cache rows are dropped, in steps of
:data:`DECODE_ROWS_STEP` rows), so the cost of a step follows the number of still-running sequences,
not the batch size. Models the lean path of :mod:`ppo_lm.models.lean` supports (Llama, Qwen2, Qwen3,
Mistral, Phi-3) decode through it (preallocated KV buffers, no per-step mask building); other
architectures (the Gemma family among them) through their own forward and a transformers cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ...models import lean, lean_support
from ...models.decode import DecodePlan
from ...models.hf_compat import cache_kwarg, new_cache, trunk
from ...models.logprobs import gather_logprobs, position_ids_from_mask


@dataclass
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    stop_token_ids: tuple[int, ...] = ()
    min_new_tokens: int = 0  # stop tokens are masked out before this many tokens


@dataclass
class Generation:
    """responses (B, T) padded with ``pad_token_id``; mask (B, T) right-padded, including the stop
    token; terminated (B,) True when a stop token ended the response; logprobs (B, T) (0 on padding)
    when asked for."""

    responses: Tensor
    mask: Tensor
    terminated: Tensor
    logprobs: Tensor | None = None  # (B, T) log π(token) under softmax(logits / T), with return_logprobs


def filter_logits(logits: Tensor, top_k: int, top_p: float) -> Tensor:
    """Top-k then nucleus (top-p) filtering of (N, V) logits; removed entries become −inf."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next(logits: Tensor, params: SamplingParams, generator: torch.Generator | None) -> Tensor:
    """(N, V) next-token logits → (N,) token ids."""
    if params.temperature == 0:
        return logits.argmax(-1)
    logits = filter_logits(logits.float() / params.temperature, params.top_k, params.top_p)
    return sample_categorical(logits.softmax(-1), generator)


def sample_categorical(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """One draw per row of (N, V) probabilities by inverting the CDF: one uniform number per row
    (``torch.multinomial`` draws V exponentials per row, a visible share of decoding time
    even at small vocabularies; see docs/benchmarks.md).

    Token i is drawn when u ∈ [cdf_{i−1}, cdf_i); a zero-probability token has an empty interval, so
    filtered tokens are never drawn. Returns (N,) token ids.
    """
    cdf = probs.cumsum(-1)
    u = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device, dtype=cdf.dtype) * cdf[:, -1:]
    idx = torch.searchsorted(cdf, u, right=True).squeeze(-1)
    # u rounds up to the total in rare cases: fall back to the last token that can be drawn.
    last = probs.shape[-1] - 1 - (probs > 0).flip(-1).to(torch.uint8).argmax(-1)
    return torch.minimum(idx, last)


class _HFDecoder:
    """Decoding through the model's own forward and a transformers DynamicCache (any architecture)."""

    def __init__(self, lm: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, max_new_tokens: int):
        B, P = prompt_ids.shape
        self.lm, self.P = lm, P
        self.cache = new_cache(lm)
        self.ckw = cache_kwarg(type(lm))
        self.attn = torch.zeros(B, P + max_new_tokens, dtype=prompt_mask.dtype, device=prompt_ids.device)
        self.attn[:, :P] = prompt_mask
        self.prompt_ids, self.prompt_mask = prompt_ids, prompt_mask

    def prefill(self) -> Tensor:
        m = self.prompt_mask
        return self.lm(input_ids=self.prompt_ids, attention_mask=m, position_ids=position_ids_from_mask(m),
                       use_cache=True, logits_to_keep=1, **{self.ckw: self.cache}).logits[:, -1]

    def select(self, keep: Tensor) -> None:
        self.cache.batch_select_indices(keep)
        self.attn = self.attn[keep]

    def step(self, tokens: Tensor, positions: Tensor, t: int) -> Tensor:
        """Logits (N, V) after feeding response token ``t`` (N,) at ``positions`` (N,)."""
        self.attn[:, self.P + t] = 1
        return self.lm(input_ids=tokens.unsqueeze(-1), attention_mask=self.attn[:, : self.P + t + 1],
                       position_ids=positions.unsqueeze(-1), use_cache=True, **{self.ckw: self.cache}).logits[:, -1]


class _LeanDecoder:
    """Decoding through :mod:`ppo_lm.models.lean` (the prefill) and :mod:`ppo_lm.models.decode` (each
    step): preallocated key/value buffers, a RoPE table, and the weights fused and packed for oneDNN
    once per call (:class:`~ppo_lm.models.decode.DecodePlan`); no mask unless a prompt is left-padded."""

    def __init__(self, lm: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, max_new_tokens: int):
        B, P = prompt_ids.shape
        self.body, self.head, self.P = trunk(lm), lm.get_output_embeddings(), P
        dtype, device = self.head.weight.dtype, prompt_ids.device
        self.cache = lean.KVBuffers(self.body, B, P + max_new_tokens, dtype, device)
        self.cos_sin = lean.rope_table(self.body, P + max_new_tokens, dtype, device)
        self.plan = DecodePlan(self.body, B)
        self.head_w = lean.packed_head(self.head, B)
        self.key_valid = None
        if not bool(prompt_mask.all()):
            self.key_valid = torch.ones(B, P + max_new_tokens, dtype=torch.bool, device=device)
            self.key_valid[:, :P] = prompt_mask.bool()
        self.prompt_ids, self.prompt_mask = prompt_ids, prompt_mask

    def _run(self, ids: Tensor, mask: Tensor, positions: Tensor, cache_pos: int, keep_from: int) -> Tensor:
        L = cache_pos + ids.shape[1]
        kv = None if self.key_valid is None else self.key_valid[:, :L]
        h = lean.forward_hidden(self.body, ids, mask, keep_from=keep_from, position_ids=positions,
                                cos_sin=self.cos_sin, cache=self.cache, cache_pos=cache_pos, key_valid=kv,
                                weights=self.plan.weights)
        return lean.head(self.head, h[:, -1], self.head_w)

    def prefill(self) -> Tensor:
        m = self.prompt_mask
        return self._run(self.prompt_ids, m, position_ids_from_mask(m), 0, self.P - 1)

    def select(self, keep: Tensor) -> None:
        self.cache.select(keep)
        if self.key_valid is not None:
            self.key_valid = self.key_valid[keep]

    def step(self, tokens: Tensor, positions: Tensor, t: int) -> Tensor:
        cache_pos = self.P + t
        kv = None if self.key_valid is None else self.key_valid[:, : cache_pos + 1]
        h = self.plan.hidden(tokens.unsqueeze(-1), positions.unsqueeze(-1), self.cos_sin, self.cache, cache_pos, kv)
        return lean.head(self.head, h[:, -1], self.head_w)


DECODE_ROWS_STEP = 8
"""The decode batch shrinks in steps of this many rows: a handful of matmul shapes per batch size,
so oneDNN's per-shape primitive cache (:mod:`ppo_lm.models.lean`) and the allocator reuse what they
built (one shape per running count would keep building new ones, and growing peak memory, over the
iterations whenever responses stop early; see docs/benchmarks.md)."""


def decode_rows(n_running: int, current: int) -> int:
    """Rows to keep in the decode batch for ``n_running`` unfinished sequences (≤ ``current``)."""
    return min(-(-n_running // DECODE_ROWS_STEP) * DECODE_ROWS_STEP, current)


@torch.no_grad()
def generate(
    lm: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    params: SamplingParams,
    *,
    pad_token_id: int,
    generator: torch.Generator | None = None,
    lean_path: bool | None = None,
    return_logprobs: bool = False,
) -> Generation:
    """Sample responses for left-padded prompts (B, P) with a causal LM.

    ``lean_path``: None = the lean decoder when the model supports it (:func:`lean_support.supported`, and one
    RoPE table fits the whole length: :func:`lean_support.rope_fits`), else transformers' forward; False forces
    the transformers path (the two give the same logits within fp32 rounding).
    Returns a :class:`Generation` whose width T is the longest response (≤ ``max_new_tokens``).
    ``return_logprobs``: also the sampled tokens' log-probs under the policy's full distribution
    softmax(logits / temperature) (temperature 0 counts as 1) — before top-k/top-p filtering and the
    ``min_new_tokens`` mask, as the training forward computes them.
    """
    B, P = prompt_ids.shape
    device = prompt_ids.device
    T = params.max_new_tokens
    stop = torch.tensor(list(params.stop_token_ids), device=device, dtype=torch.long)
    responses = torch.full((B, T), pad_token_id, dtype=torch.long, device=device)
    lengths = torch.full((B,), T, dtype=torch.long, device=device)
    terminated = torch.zeros(B, dtype=torch.bool, device=device)
    logprobs = torch.zeros(B, T, device=device) if return_logprobs else None
    temperature = params.temperature or 1.0

    if lean_path is None:
        body = trunk(lm)
        lean_path = lean_support.supported(body) and lean_support.rope_fits(body, P + T)
    decoder = (_LeanDecoder if lean_path else _HFDecoder)(lm, prompt_ids, prompt_mask, T)
    logits = decoder.prefill()
    next_pos = prompt_mask.long().sum(-1)  # (B,) position id of the next token
    alive = torch.arange(B, device=device)  # original row of each decode-batch row
    live = torch.ones(B, dtype=torch.bool, device=device)  # decode-batch rows still sampling
    for t in range(T):
        raw = logits
        if t < params.min_new_tokens and stop.numel():
            logits = logits.index_fill(-1, stop, float("-inf"))
        tokens = sample_next(logits, params, generator)
        responses[alive[live], t] = tokens[live]
        if logprobs is not None:
            lp = gather_logprobs(raw.float() / temperature, tokens)
            logprobs[alive[live], t] = lp[live]
        if stop.numel():
            done = live & torch.isin(tokens, stop)
            if bool(done.any()):
                rows = alive[done]
                lengths[rows] = t + 1
                terminated[rows] = True
                live = live & ~done
                n_live = int(live.sum())
                if n_live == 0:
                    break
                size = decode_rows(n_live, alive.numel())
                if size < alive.numel():
                    # Finished rows leave the decode batch, so a step costs what is still running;
                    # a few stay as filler up to the next multiple of DECODE_ROWS_STEP.
                    filler = (~live).nonzero().squeeze(-1)[: size - n_live]
                    keep = torch.cat([live.nonzero().squeeze(-1), filler]).sort().values
                    alive, tokens, next_pos, live = alive[keep], tokens[keep], next_pos[keep], live[keep]
                    decoder.select(keep)
        if t == T - 1:
            break
        logits = decoder.step(tokens, next_pos, t)
        next_pos = next_pos + 1
    width = int(lengths.max()) if B else 0
    mask = torch.arange(width, device=device).unsqueeze(0) < lengths.unsqueeze(1)
    responses = responses[:, :width].masked_fill(~mask, pad_token_id)
    if logprobs is not None:
        logprobs = logprobs[:, :width].where(mask, 0)
    return Generation(responses=responses, mask=mask, terminated=terminated, logprobs=logprobs)
