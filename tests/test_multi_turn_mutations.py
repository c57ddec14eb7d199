"""Multi-turn targets checked against values computed apart from the trainer (issue 42: breaks the fast
suite missed).

- The turn limit truncates an episode after its last observation: the bootstrap value is V of that
  context, after the trailing observation (docs/environments.md, "Termination and truncation"). The
  critic here is not zero, so V after the last action token and V after the trailing observation
  differ, and a bootstrap read at the wrong place shows.
- The critic-free estimators see each episode's total return, every turn's reward summed
  (trainer/ppo.py `learn`): their advantages equal a naive per-group loop over the totals, on a batch
  whose earlier turns carry rewards that vary within each group.

Everything goes through a tiny PPOTrainer with an environment file and its public rollout and learn.
"""

from __future__ import annotations

import pytest
import torch
from trainer_helpers import action_runs, tiny_config

from ppo_lm.models.hf_compat import scalar_head, trunk
from ppo_lm.trainer.ppo import PPOTrainer

ENV = '''
class Echo:
    """Three turns; each turn's reward is its text's length; the answer names the turn."""

    def reset(self, row, seed):
        self.n = 0
        return row["prompt"]

    def step(self, text):
        self.n += 1
        return (" ok%d:" % self.n, float(len(text)), self.n >= 3)


class Endless(Echo):
    """Never done: only the turn limit ends an episode, right after an observation."""

    def step(self, text):
        obs, reward, _ = super().step(text)
        return obs, reward, False
'''


@pytest.fixture
def env_file(tmp_path):
    f = tmp_path / "mut_env.py"
    f.write_text(ENV)
    return f


def make_trainer(tmp_path, env_file, cls, **kw):
    kw = {"rollout__max_new_tokens": 6, "rollout__num_prompts": 4, **kw}
    return PPOTrainer(tiny_config(tmp_path / "run", rollout__env=f"{env_file}:{cls}", **kw))


def prompt_ids(batch, i):
    return batch.input_ids[i, :batch.prompt_width][batch.attention_mask[i, :batch.prompt_width].bool()].tolist()


# ------------------------------------------------------------------- (a) the truncation bootstrap
def value_of(tr, ids: list[int]) -> float:
    """V of the context ``ids`` (unpadded, one row), by the Hugging Face body's own forward and the value
    head — not the trainer's scoring path."""
    x = torch.tensor([ids], device=tr.device)
    with torch.no_grad():
        if tr.models.critic is not None:
            return float(tr.models.critic.model(input_ids=x).logits[0, -1, 0])
        hidden = trunk(tr.models.policy.lm)(input_ids=x).last_hidden_state[0, -1]
        return float(tr.models.policy.value_head(hidden.to(tr.models.policy.value_head.weight.dtype)).squeeze(-1))


@pytest.mark.parametrize("critic", ["separate", "shared"])
def test_the_turn_limit_bootstraps_from_v_after_the_trailing_observation(tmp_path, env_file, critic):
    tr = make_trainer(tmp_path, env_file, "Endless", rollout__max_turns=2, critic__kind=critic,
                      algo__bootstrap_truncated=True, algo__gamma=1.0, algo__gae_lambda=1.0, algo__kl_coef=0.0,
                      algo__whiten_advantages=False)
    # a critic that is not zero: V depends on the context, so where it is read matters
    head = scalar_head(tr.models.critic.model) if tr.models.critic is not None else tr.models.policy.value_head
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=g))
        if head.bias is not None:
            head.bias.fill_(0.25)
    b = tr.rollout(1)
    assert not bool(b.terminated.any()) and b.episode_info["turns"].tolist() == [2] * b.size
    tok = tr.models.tokenizer
    want, wrong = [], []
    for i in range(b.size):
        runs = action_runs(b, i)
        # action, " ok1:", action, " ok2:": the turn limit ends the episode after the second answer
        assert [a for a, _ in runs] == [True, False, True, False]
        assert runs[-1][1] == tok(" ok2:", add_special_tokens=False)["input_ids"]
        context = prompt_ids(b, i) + [t for _, ids in runs for t in ids]
        want.append(value_of(tr, context))
        wrong.append(value_of(tr, context[: len(context) - len(runs[-1][1])]))  # after the last action token
    want, wrong = torch.tensor(want), torch.tensor(wrong)
    assert float((want - wrong).abs().min()) > 1e-2, (want, wrong)  # the two places tell apart
    torch.testing.assert_close(b.bootstrap_values.float().cpu(), want, rtol=1e-4, atol=1e-4)

    # and the update's critic target uses it: with γ = λ = 1 and no KL, R̂ at the last action token is
    # the last turn's reward plus the bootstrap value
    ret = tr.learn(b, 1).targets.returns
    for i in range(b.size):
        last = int(b.action_mask[i].nonzero().max())
        assert float(ret[i, last]) == pytest.approx(float(b.scores[i]) + float(want[i]), rel=1e-4, abs=1e-4)


# ------------------------------------------------- (c) critic-free estimators see the episode total
def naive_advantages(estimator: str, totals: list[float], tokens: list[int], group: int) -> list[float]:
    """One advantage per episode (the same on each of its action tokens), from the episodes' returns,
    written from the definitions: group by group for the group estimators; REINFORCE++ (γ = 1, no KL)
    has the return on every action token, whitened over the batch's action tokens."""
    out = []
    if estimator == "reinforce++":
        xs = [r for r, n in zip(totals, tokens) for _ in range(n)]
        mean = sum(xs) / len(xs)
        var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
        return [(r - mean) / (var + 1e-8) ** 0.5 for r in totals]
    for start in range(0, len(totals), group):
        g = totals[start:start + group]
        mean = sum(g) / group
        for r in g:
            if estimator == "grpo":
                std = (sum((x - mean) ** 2 for x in g) / (group - 1)) ** 0.5
                out.append((r - mean) / (std + 1e-6))
            elif estimator == "dr_grpo":
                out.append(r - mean)
            elif estimator == "rloo":
                out.append(r - (sum(g) - r) / (group - 1))
    return out


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce++", "dr_grpo"])
def test_critic_free_estimators_see_the_episode_total(tmp_path, env_file, estimator):
    G = 4
    tr = make_trainer(tmp_path, env_file, "Echo", algo__estimator=estimator, rollout__samples_per_prompt=G,
                      rollout__num_prompts=2, algo__gamma=1.0, algo__kl_coef=0.0)
    b = tr.rollout(1)
    assert b.episode_info["turns"].tolist() == [3] * b.size
    tok, stops = tr.models.tokenizer, set(tr.sampler.sampling.stop_token_ids)
    # each turn's reward from the text the environment got: the turn's sampled ids, stop token aside
    turn_rewards, tokens = [], []
    for i in range(b.size):
        actions = [ids for a, ids in action_runs(b, i) if a]
        assert len(actions) == 3
        turn_rewards.append([float(len(tok.decode(ids[:-1] if ids[-1] in stops else ids, skip_special_tokens=True)))
                             for ids in actions])
        tokens.append(sum(len(ids) for ids in actions))
    totals = [sum(r) for r in turn_rewards]
    want = naive_advantages(estimator, totals, tokens, G)
    # the batch tells the total from the last turn's reward: earlier turns pay, and differently within groups
    last_only = naive_advantages(estimator, [r[-1] for r in turn_rewards], tokens, G)
    assert max(abs(x - y) for x, y in zip(want, last_only)) > 0.1, (turn_rewards, want, last_only)

    adv = tr.learn(b, 1).targets.advantages
    obs = b.response_mask & ~b.action_mask
    assert bool((adv[obs] == 0).all())
    for i in range(b.size):
        got = adv[i][b.action_mask[i]].double().cpu()
        torch.testing.assert_close(got, torch.full_like(got, want[i]), rtol=1e-4, atol=1e-4,
                                   msg=lambda m, i=i: f"episode {i} (turn rewards {turn_rewards[i]}): {m}")
