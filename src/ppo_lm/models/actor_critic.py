"""Policy and critic modules that score response tokens of (prompt ‖ response) sequences.

Layout shared by every forward here: ``input_ids`` (B, P + T) is a left-padded prompt block of
width P followed by a right-padded response block of width T. Logits at position P − 1 + t predict
response token t, and the hidden state there is the context x_t before that token, so the value
V(x_t) and log π(y_t | x_t) come from the same positions P − 1 … P + T − 2; position P + T − 1 … gives
V(x_{T+1}) for the bootstrap of truncated responses.

Both modules run only the transformer body plus their head on the response positions, so the
vocabulary projection is never computed for prompt tokens. Bodies the lean forward of :mod:`.lean`
supports (Llama, Qwen2, Qwen3, Mistral, Phi-3) go through it (same results; its last layer also skips
the prompt positions), on packed sequences when the batch is mostly padding (:mod:`.packing`); others
(the Gemma family among them) through their own forward.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..algorithms import entropy_from_logits
from . import lean, lean_support, lora
from .hf_compat import scalar_head, trunk
from .logprobs import gather_logprobs, position_ids_from_mask
from .packing import plan_packing

PACKING = True
"""Pack the real tokens of padded batches (set False to compare against the padded forward)."""


def packs_sequences(model: nn.Module) -> bool:
    """True when ``model``'s (PolicyModel / CriticModel / reward model) forwards pack padded batches."""
    inner = getattr(model, "lm", None) or getattr(model, "model", None) or model
    return PACKING and lean_support.supported(trunk(inner))


def _hidden(body: nn.Module, input_ids: Tensor, attention_mask: Tensor, keep_from: int = 0) -> Tensor:
    """Final hidden states (B, L − keep_from, d) of positions keep_from … L − 1 (zeros at pads when
    the batch runs packed: lean-path bodies pack the real tokens when that saves ≥ 20 % of the
    positions, see :mod:`.packing`)."""
    lean_path = lean_support.supported(body)
    plan = plan_packing(attention_mask) if lean_path and PACKING else None
    if plan is not None:
        ids, pos, seg = plan.pack(input_ids)
        kept = plan.keep(keep_from)  # the last layer computes queries/MLP for these slots only
        h = lean.forward_hidden(body, ids, seg >= 0, position_ids=pos, segment_ids=seg, keep_index=kept.index)
        return kept.unpack(h)
    position_ids = position_ids_from_mask(attention_mask)
    if lean_path:
        return lean.forward_hidden(body, input_ids, attention_mask, keep_from=keep_from, position_ids=position_ids)
    out = body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    return out.last_hidden_state[:, keep_from:]


def output_logits(lm: nn.Module, h: Tensor) -> Tensor:
    """The causal LM's logits for final hidden states ``h`` (…, d): its output embeddings, then the
    scaling some architectures apply in their forward (Granite ``logits_scaling``, Cohere
    ``logit_scale``, Gemma 2/3 ``final_logit_softcapping``)."""
    logits = lean.head(lm.get_output_embeddings(), h)
    cfg = lm.config
    if getattr(cfg, "logits_scaling", None):
        logits = logits / cfg.logits_scaling
    if str(getattr(cfg, "model_type", "")).startswith("cohere") and getattr(cfg, "logit_scale", None) is not None:
        logits = logits * cfg.logit_scale
    cap = getattr(cfg, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def check_output_head(lm: nn.Module) -> None:
    """Raise ``ValueError`` unless :func:`output_logits` on the body's hidden states reproduces the
    model's own logits (probed on 4 tokens): an architecture whose forward changes its logits in a
    way ppo-lm does not know would otherwise train on log-probs of another distribution than the one
    it samples. Lean-path bodies (:func:`lean_support.supported`: architectures without such a transform) need no
    probe."""
    body = trunk(lm)
    if lean_support.supported(body) or any(p.is_meta for p in lm.parameters()):
        return
    device = next(lm.parameters()).device
    vocab = lm.get_output_embeddings().weight.shape[0]
    ids = (torch.arange(4, device=device) % max(vocab - 1, 1) + 1).unsqueeze(0)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        theirs = lm(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
        ours = output_logits(lm, _hidden(body, ids, mask)).float()
    err = float((ours - theirs).abs().max())
    if not err <= 1e-2 * (1.0 + float(theirs.abs().max())):
        raise ValueError(
            f"{type(lm).__name__}: its logits are not its output embeddings applied to its last hidden "
            f"states (max difference {err:.3g} on a probe), a transform ppo-lm does not reproduce, so its "
            "log-probs would be wrong; supported: plain heads, Granite logits_scaling, Cohere logit_scale, "
            "Gemma 2/3 final_logit_softcapping"
        )


class PolicyModel(nn.Module):
    """A causal LM as a policy, optionally with a value head on its trunk (shared-body critic).

    ``value_grad_scale`` routes the value loss into the trunk: 1 = full gradient, 0 = the value head
    trains on detached features (the trunk only sees the policy loss), in between = scaled.
    """

    base_only = False  # see :class:`AdaptersOff`

    def __init__(self, lm: nn.Module, *, value_head: nn.Linear | None = None, value_grad_scale: float = 1.0):
        super().__init__()
        check_output_head(lm)
        self.lm = lm
        self.value_head = value_head
        self.value_grad_scale = float(value_grad_scale)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        prompt_width: int,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
        entropy_grad: bool = True,
        with_values: bool = False,
        adapters_off: bool = False,
    ) -> dict[str, Tensor]:
        """Returns ``logp`` (B, T) of the response tokens under softmax(logits/temperature), plus
        ``entropy`` (B, T) and ``values`` (B, T + 1) when asked (values need a value head).
        ``entropy_grad=False`` computes the entropy as a detached diagnostic; ``adapters_off`` runs a
        LoRA policy's base model (:func:`ppo_lm.models.lora.adapters_off`)."""
        P = prompt_width
        switch = lora.adapters_off(self.lm) if adapters_off else lora.train_dropout(self.lm, torch.is_grad_enabled())
        with switch:  # body and LM head (adapted too with model.lora_head)
            hidden = _hidden(trunk(self.lm), input_ids, attention_mask, P - 1)  # contexts x_0 … x_T
            h = hidden[:, :-1]  # contexts x_0 … x_{T-1}
            logits = output_logits(self.lm, h)
        labels = input_ids[:, P:]
        if temperature != 1.0:
            # in fp32, as the sampler divides: a bf16 quotient would be rounded a second time
            logits = logits.float() / temperature
        out: dict[str, Tensor] = {"logp": gather_logprobs(logits, labels)}
        if with_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                out["entropy"] = entropy_from_logits(logits)
        if with_values:
            if self.value_head is None:
                raise ValueError("this policy has no value head (critic.kind is not 'shared')")
            hv = hidden
            if self.value_grad_scale != 1.0:
                s = self.value_grad_scale
                hv = hv * s + hv.detach() * (1.0 - s)
            out["values"] = self.value_head(hv.to(self.value_head.weight.dtype)).squeeze(-1).float()
        return out


class AdaptersOff(nn.Module):
    """The frozen reference π_ref of a LoRA policy: the policy module itself, called with its adapters
    off — no second copy of the weights, and under FSDP the forward still enters through the sharded
    root. Its forward takes :meth:`PolicyModel.forward`'s arguments."""

    base_only = True

    def __init__(self, policy: PolicyModel):
        super().__init__()
        self.policy = policy

    @property
    def lm(self) -> nn.Module:
        return self.policy.lm

    def forward(self, *args, **kwargs) -> dict[str, Tensor]:
        return self.policy(*args, adapters_off=True, **kwargs)


class CriticModel(nn.Module):
    """Separate-body critic: a one-label token-classification model (transformer + scalar head).

    Kept as a plain ``AutoModelForTokenClassification`` so ``save_pretrained`` output loads in
    transformers without ppo-lm.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor, prompt_width: int) -> Tensor:
        """Returns values (B, T + 1): V(x_t) for t = 0 … T (the last column is V after the block)."""
        with lora.train_dropout(self.model, torch.is_grad_enabled()):
            hidden = _hidden(trunk(self.model), input_ids, attention_mask, prompt_width - 1)
        return scalar_head(self.model)(hidden).squeeze(-1).float()


REWARD_MEAN_KEY = "ppo_lm_reward_mean"
REWARD_STD_KEY = "ppo_lm_reward_std"


def sequence_scores(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, last_index: Tensor, *, normalize: bool = True
) -> Tensor:
    """Scalar score of a sequence-classification model read at ``last_index`` (B,) of each row.

    The head runs only at the scored positions. With ``normalize``, applies the normalisation stored
    by ``ppo-lm rm`` (``config.ppo_lm_reward_mean/std``) when present. Keeps the caller's grad mode.
    Returns (B,) fp32.
    """
    last_index = last_index.to(input_ids.device)
    first = int(last_index.min()) if last_index.numel() else 0  # positions before it are never read
    hidden = _hidden(trunk(model), input_ids, attention_mask, first)
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    scores = scalar_head(model)(hidden[rows, last_index - first])[:, 0].float()
    if normalize:
        mean = getattr(model.config, REWARD_MEAN_KEY, None)
        std = getattr(model.config, REWARD_STD_KEY, None)
        if mean is not None and std is not None:
            scores = (scores - mean) / std
    return scores


class RewardScorer(nn.Module):
    """A sequence-classification reward model as one module whose ``forward`` scores sequences (see
    :func:`sequence_scores`): the root unit FSDP shards (its hooks gather embeddings, norm and head)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor, last_index: Tensor) -> Tensor:
        """(B, L) ids/mask, (B,) positions of the last response token → (B,) fp32 scores."""
        return sequence_scores(self.model, input_ids, attention_mask, last_index)
