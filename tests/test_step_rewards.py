"""Step rewards inside one response (docs/algorithm.md §2.1): a reward function returns
``Reward(score, steps=[(char_end, r), …])``; each step lands on the token that completes its character,
GAE consumes r_t = steps + score − β·kl_t, the critic-free estimators the episode total."""

from __future__ import annotations

import random
import textwrap

import pytest
import torch
from trainer_helpers import bpe_tokenizer, tiny_config

from ppo_lm.algorithms import gae, shape_rewards
from ppo_lm.cli.main import main
from ppo_lm.rollout import Reward
from ppo_lm.rollout.score.reward import RewardError, verifier_rewards
from ppo_lm.rollout.score.step_rewards import step_reward_tensor, token_of_char
from ppo_lm.trainer.ppo import PPOTrainer

CORPUS = ["the step is 3 + 4 = 7", "café costs 5 €", "naïve über 12 × 3 = 36", "ok → done ✓", "日本語 text"]


@pytest.fixture(scope="module")
def bpe():
    """A byte-level BPE tokenizer built here: multi-byte characters span several tokens."""
    return bpe_tokenizer(CORPUS)


def naive_token_of_char(tokenizer, ids, text, char_end):
    """The first prefix whose decoding covers text[:char_end], by a linear scan."""
    for k in range(1, len(ids) + 1):
        if tokenizer.decode(ids[:k], skip_special_tokens=True).startswith(text[:char_end]):
            return k - 1
    raise AssertionError("no prefix covers the step")


def test_every_character_lands_on_the_token_that_completes_it(bpe):
    decode = lambda ids: bpe.decode(ids, skip_special_tokens=True)  # noqa: E731
    for text in CORPUS:
        ids = bpe(text)["input_ids"]
        assert decode(ids) == text
        assert any(len(bpe.decode([i])) != 1 for i in ids)  # tokens are not characters here
        for end in range(1, len(text) + 1):
            k = token_of_char(decode, ids, text, end)
            assert k == naive_token_of_char(bpe, ids, text, end)
            assert decode(ids[: k + 1]).startswith(text[:end]) and not decode(ids[:k]).startswith(text[:end])


def test_a_multibyte_character_lands_where_its_last_byte_is(bpe):
    text = "5 €"
    ids = bpe(text)["input_ids"]
    pieces = [bpe.decode(ids[: k + 1]) for k in range(len(ids))]
    k = token_of_char(lambda x: bpe.decode(x), ids, text, len(text))
    assert pieces[k] == text and (k == 0 or not pieces[k - 1].endswith("€"))


def test_step_rewards_are_placed_and_summed_per_token(bpe):
    texts = ["café costs 5 €", "ok → done ✓"]
    kept = [bpe(t)["input_ids"] for t in texts]
    steps = [[(4, 0.5), (len(texts[0]), 1.0), (len(texts[0]), -0.25)], []]
    out, counts = step_reward_tensor(bpe, kept, texts, steps, width=20)
    decode = lambda ids: bpe.decode(ids)  # noqa: E731
    want = torch.zeros(2, 20)
    want[0, token_of_char(decode, kept[0], texts[0], 4)] += 0.5
    want[0, len(kept[0]) - 1] += 0.75
    assert torch.equal(out, want) and counts.tolist() == [3, 0]


def test_shape_rewards_adds_steps_on_valid_tokens_only():
    g = torch.Generator().manual_seed(0)
    B, T = 6, 9
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T) < lengths[:, None]
    lo, lr = torch.randn(B, T, generator=g, dtype=torch.float64), torch.randn(B, T, generator=g, dtype=torch.float64)
    steps = torch.randn(B, T, generator=g, dtype=torch.float64)  # garbage on padding too
    scores = torch.randn(B, generator=g, dtype=torch.float64)
    out = shape_rewards(scores, lo, lr, mask, kl_coef=0.1, step_rewards=steps)
    for i in range(B):  # naive: per token
        for t in range(T):
            want = 0.0
            if mask[i, t]:
                want = steps[i, t] - 0.1 * (lo[i, t] - lr[i, t]) + (scores[i] if t == lengths[i] - 1 else 0.0)
            assert float(out[i, t]) == pytest.approx(float(want), abs=1e-12)


def steps_at_lowercase(prompts, responses, **columns):
    """Terminal score: the response has a lower-case letter; a step reward of 0.5 at every one."""
    return [Reward(float(any(c.islower() for c in r)), steps=[(i + 1, 0.5) for i, c in enumerate(r) if c.islower()])
            for r in responses]


def test_gae_consumes_steps_on_their_tokens(tmp_path):
    tr = PPOTrainer(tiny_config(tmp_path / "run", rollout__max_new_tokens=8, algo__kl_coef=0.05),
                    verifier=steps_at_lowercase)
    batch = tr.rollout(1)
    n7 = [sum(c.islower() for c in r) for r in batch.responses]
    assert batch.step_counts.tolist() == n7 and sum(n7) > 0
    assert torch.equal(batch.scores, torch.tensor([float(c > 0) for c in n7]))
    # the built-in tokenizer has one token per character, and special tokens (sampled mid-response by
    # the untrained model) decode to nothing: character j is the j-th token that decodes to a character
    for i, r in enumerate(batch.responses):
        ids = batch.input_ids[i, batch.prompt_width:][batch.response_mask[i]].tolist()
        chars = [t for t, x in enumerate(ids) if tr.models.tokenizer.decode([x], skip_special_tokens=True)]
        want = torch.zeros(batch.response_mask.shape[1])
        want[[chars[j] for j, c in enumerate(r) if c.islower()]] = 0.5
        assert torch.equal(batch.step_rewards[i], want)
    done = tr.learn(batch, 1)
    beta = tr.training.kl_ctl.value
    want_r = shape_rewards(batch.scores, batch.logp_old, batch.logp_ref, batch.response_mask, kl_coef=beta)
    want_r = want_r + batch.step_rewards.where(batch.response_mask, 0)
    assert torch.allclose(done.targets.rewards, want_r, atol=1e-6)
    adv, ret = gae(want_r, batch.values_old, batch.response_mask, gamma=1.0, lam=tr.cfg.algo.gae_lambda,
                   terminated=batch.terminated, bootstrap_values=batch.bootstrap_values)
    assert torch.allclose(done.targets.advantages_raw, adv, atol=1e-5)
    assert torch.allclose(done.targets.returns, ret, atol=1e-5)
    m = done.metrics
    assert m["steps_per_response"] == pytest.approx(sum(n7) / len(n7))
    assert m["step_reward_mean"] == pytest.approx(0.5)


def test_critic_free_estimators_see_the_episode_total(tmp_path):
    cfg = tiny_config(tmp_path / "run", rollout__max_new_tokens=8, algo__estimator="rloo",
                      rollout__samples_per_prompt=4, rollout__num_prompts=4)
    tr = PPOTrainer(cfg, verifier=steps_at_lowercase)
    batch = tr.rollout(1)
    total = batch.scores + batch.step_rewards.sum(1)
    g = total.view(-1, 4)
    want = (g - (g.sum(1, keepdim=True) - g) / 3).reshape(-1)
    done = tr.learn(batch, 1)
    first = done.targets.advantages_raw[:, 0]
    assert torch.allclose(first, want, atol=1e-6)
    assert not torch.allclose(first, torch.zeros(16)), "the batch needs some steps for this test to bite"


def test_numbers_rewards_and_dicts_mix_and_weights_scale_steps(tmp_path):
    def some(prompts, responses, **columns):  # odd rows: a step at the first character
        return [(Reward(1.0, steps=[(1, 2.0)]) if i % 4 == 1 else {"score": 1.0, "steps": [(1, 2.0)]}) if i % 2 and r
                else 0.5 for i, r in enumerate(responses)]

    tr = PPOTrainer(tiny_config(tmp_path / "run", model__reward_weights=[3.0]), verifier=[some])
    b = tr.rollout(1)
    odd = torch.tensor([i % 2 == 1 and bool(r) for i, r in enumerate(b.responses)])
    assert odd.any()
    assert torch.equal(b.scores, torch.where(odd, 3.0, 1.5))
    assert torch.equal(b.step_rewards[:, 0], torch.where(odd, 6.0, 0.0)) and b.step_rewards[:, 1:].abs().sum() == 0


@pytest.mark.parametrize("answer, message", [
    ([Reward(1.0, steps=[(0, 1.0)])], "step ending at character 0 of a response of 3 characters"),
    ([Reward(1.0, steps=[(9, 1.0)])], "char_end must be in 1 … 3"),
    ([object()], "must return a list of numbers (or of Reward"),
    ([{"score": 1.0, "step": []}], "a dict with keys ['score', 'step']"),
])
def test_bad_steps_are_one_line_errors(answer, message):
    with pytest.raises(RewardError, match=".*") as e:
        verifier_rewards(lambda p, r: answer, ["q"], ["abc"], {})
    assert message in str(e.value)


@pytest.mark.parametrize("steps, message", [
    ([(1.5, 1.0)], "char_end must be an int"), ([(1, float("nan"))], "the reward must be finite"),
    ([3], "must be a (char_end, reward) pair"),
])
def test_a_malformed_reward_names_the_field(steps, message):
    with pytest.raises((TypeError, ValueError), match=".*") as e:
        Reward(1.0, steps=steps)
    assert message in str(e.value)


def test_a_bad_reward_from_a_file_shows_the_users_frame(tmp_path, capsys):
    f = tmp_path / "bad_steps.py"
    f.write_text(textwrap.dedent("""
        from ppo_lm.rollout import Reward

        def steps(prompts, responses, **columns):
            return [Reward(1.0, steps=[("end", 1.0)]) for r in responses]
    """))
    code = main(["train", "--iterations", "1", "--log.no-tensorboard", "--rollout.num-prompts", "4",
                 "--model.reward", f"{f}:steps", "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code != 0 and "char_end must be an int" in err and "bad_steps.py:5 in steps" in err
    assert "Traceback" not in err


def test_random_steps_round_trip_through_the_rollout(tmp_path):
    """Random step positions: each lands on the one token that completes it (built-in tokenizer: one
    token per character, special tokens none), and their sum per response is kept."""
    rng = random.Random(0)

    def random_steps(prompts, responses, **columns):
        return [Reward(0.0, steps=[(rng.randint(1, len(r)), rng.uniform(-1, 1)) for _ in range(3)] if r else [])
                for r in responses]

    tr = PPOTrainer(tiny_config(tmp_path / "run", rollout__max_new_tokens=8), verifier=random_steps)
    rng_copy = random.Random(0)
    b = tr.rollout(1)
    for i, r in enumerate(b.responses):
        ids = b.input_ids[i, b.prompt_width:][b.response_mask[i]].tolist()
        chars = [t for t, x in enumerate(ids) if tr.models.tokenizer.decode([x], skip_special_tokens=True)]
        want = torch.zeros(b.response_mask.shape[1])
        if r:
            for _ in range(3):
                end, val = rng_copy.randint(1, len(r)), rng_copy.uniform(-1, 1)
                want[chars[end - 1]] += val
        assert torch.allclose(b.step_rewards[i], want, atol=1e-6)
