"""What samples the rollout: a generation engine (docs/architecture.md, "Generation engines").

Every caller that samples — the single-turn rollout, the episodes of an environment, held-out
evaluation, the demo, the benchmark — goes through an engine: token prompts and sampling settings
in, completions out (token ids, the sampler's log-probabilities when asked, whether a stop token
ended each). The engine holds a version of the policy's weights; the learner publishes each update
with :meth:`GenerationEngine.update_weights`, so what an engine sampled can be stamped with the
version that sampled it.

:class:`TorchEngine` is the one this package ships: in-process, decoding with the training module's
own weights (:func:`~ppo_lm.rollout.sample.sampling.generate`: the lean decoder where the model supports it,
transformers' forward otherwise), FSDP's gathering of the sharded weights inside it only.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

import torch
from torch import Tensor, nn

from ...models.sharding import gathered
from .sampling import Generation, SamplingParams, generate


class GenerationEngine(Protocol):
    """Samples completions of left-padded token prompts with one version of the policy's weights."""

    @property
    def version(self) -> int:
        """The version of the weights it samples with (0 before the first update)."""
        ...

    def generate(self, prompt_ids: Tensor, prompt_mask: Tensor, params: SamplingParams, *,
                 generator: torch.Generator | None = None, return_logprobs: bool = False) -> Generation:
        """Completions of (B, P) left-padded prompts (on any device): responses (B, T), their right-padded
        mask, whether a stop token ended each (else the length limit), and with ``return_logprobs`` the
        sampler's log-probabilities of the sampled tokens (B, T) — on the engine's device."""
        ...

    def update_weights(self, version: int) -> None:
        """Sample with the learner's weights of ``version`` from now on."""
        ...

    def session(self) -> contextlib.AbstractContextManager:
        """Many :meth:`generate` calls with the weights held ready (the turns of an iteration's episodes)."""
        ...


class TorchEngine:
    """In-process generation with the training module's weights (shared: an update is seen at once, so
    :meth:`update_weights` only records the version). ``lm``: the causal LM that decodes;
    ``pad_token_id``: what pads the responses (the tokenizer's); ``root``: the module FSDP shards it
    under (the policy module; default ``lm``); ``lean_path`` as for
    :func:`~ppo_lm.rollout.sample.sampling.generate`."""

    def __init__(self, lm: nn.Module, *, pad_token_id: int, root: nn.Module | None = None,
                 lean_path: bool | None = None):
        self.lm, self.pad_token_id, self.lean_path = lm, pad_token_id, lean_path
        self.root = root if root is not None else lm
        self._version = 0
        self._depth = 0  # open sessions: only the outermost gathers the weights

    @property
    def version(self) -> int:
        return self._version

    def update_weights(self, version: int) -> None:
        self._version = version

    @contextlib.contextmanager
    def session(self):
        """The sharded weights gathered once for every decode inside (FSDP; a no-op unsharded); the
        module in eval mode, its own mode back afterwards."""
        if self._depth:
            yield
            return
        was_training = self.lm.training
        self.lm.eval()
        self._depth += 1
        try:
            with gathered(self.root):
                yield
        finally:
            self._depth -= 1
            self.lm.train(was_training)

    @torch.no_grad()
    def generate(self, prompt_ids: Tensor, prompt_mask: Tensor, params: SamplingParams, *,
                 generator: torch.Generator | None = None, return_logprobs: bool = False) -> Generation:
        device = next(self.lm.parameters()).device  # prompts may come from the CPU, as for any engine
        prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
        with self.session():
            return generate(self.lm, prompt_ids, prompt_mask, params, pad_token_id=self.pad_token_id,
                            generator=generator, lean_path=self.lean_path, return_logprobs=return_logprobs)
