"""The generation engine (rollout/sample/engine.py): every sampler of the package goes through one; the
in-process TorchEngine decodes exactly as the sampler does, keeps the module's mode, nests its
sessions, and carries the version of the weights the learner published."""

from __future__ import annotations

import torch
from trainer_helpers import count_sevens, tiny_config

from ppo_lm.rollout.sample.engine import GenerationEngine, TorchEngine
from ppo_lm.rollout.sample.sampling import SamplingParams, generate
from ppo_lm.tasks.equations import build_tiny_policy, build_tokenizer, make_prompts
from ppo_lm.trainer.ppo import PPOTrainer


def _prompts(tok, n=6):
    enc = tok([r["prompt"] for r in make_prompts(n, seed=3)], return_tensors="pt", padding=True)
    return enc["input_ids"], enc["attention_mask"]


def test_the_torch_engine_samples_as_the_sampler_does():
    tok = build_tokenizer()
    lm = build_tiny_policy(tok, seed=0, hidden_size=32)
    ids, mask = _prompts(tok)
    params = SamplingParams(max_new_tokens=6, temperature=1.0, stop_token_ids=(tok.eos_token_id,))
    want = generate(lm, ids, mask, params, pad_token_id=tok.pad_token_id, generator=torch.Generator().manual_seed(1),
                    return_logprobs=True)
    engine: GenerationEngine = TorchEngine(lm, pad_token_id=tok.pad_token_id)
    got = engine.generate(ids, mask, params, generator=torch.Generator().manual_seed(1), return_logprobs=True)
    for a, b in ((got.responses, want.responses), (got.mask, want.mask), (got.terminated, want.terminated),
                 (got.logprobs, want.logprobs)):
        assert torch.equal(a, b)


def test_sessions_nest_and_the_module_keeps_its_mode():
    tok = build_tokenizer()
    lm = build_tiny_policy(tok, seed=0, hidden_size=32)
    engine = TorchEngine(lm, pad_token_id=tok.pad_token_id)
    lm.train()
    with engine.session():
        assert not lm.training
        with engine.session():
            engine.generate(*_prompts(tok, 2), SamplingParams(max_new_tokens=2))
            assert not lm.training
        assert not lm.training  # the inner session leaves the outer one as it was
    assert lm.training
    lm.eval()
    engine.generate(*_prompts(tok, 2), SamplingParams(max_new_tokens=2))
    assert not lm.training


def _versions_sampled(trainer) -> list[int]:
    """The engine's version at each rollout the trainer takes (what a trajectory would be stamped with)."""
    seen, rollout = [], trainer.rollout

    def stamped(iteration, timer=None):
        seen.append(trainer.sampler.engine.version)
        return rollout(iteration, timer)

    trainer.rollout = stamped
    return seen


def test_the_trainer_publishes_each_update_as_a_version(tmp_path):
    """Iteration k samples with the weights of version k − 1 (its predecessor's update), a resumed run too."""
    kw = dict(iterations=2, log__save_every=1, rollout__num_prompts=4, rollout__max_new_tokens=3)
    tr = PPOTrainer(tiny_config(tmp_path / "run", **kw), verifier=count_sevens)
    seen = _versions_sampled(tr)
    tr.train()
    assert seen == [0, 1] and tr.sampler.engine.version == 2
    resumed = PPOTrainer(tiny_config(tmp_path / "run", resume=True, **{**kw, "iterations": 3}), verifier=count_sevens)
    seen = _versions_sampled(resumed)
    resumed.train()
    assert seen == [2] and resumed.sampler.engine.version == 3
