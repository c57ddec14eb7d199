"""The token-level credit file (credit.jsonl, docs/report.md): δ as GAE accumulates it, the stored values
reproduce the advantages, the ratio is the updated policy's, critic-free runs store no values, and a
resumed run rewrites the file bit-exactly."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from trainer_helpers import length_reward, tiny_config

from ppo_lm.algorithms import gae
from ppo_lm.algorithms.advantages import td_residuals
from ppo_lm.trainer.credit import CREDIT_FILE, PER_TOKEN_KEYS
from ppo_lm.trainer.ppo import PPOTrainer


def _discounted_sums(deltas: list[float], coef: float) -> list[float]:
    """Â_t = Σ_l coef^l δ_{t+l}, summed the long way (no recursion shared with gae)."""
    return [sum(coef**k * d for k, d in enumerate(deltas[t:])) for t in range(len(deltas))]


def _records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / CREDIT_FILE).read_text().splitlines()]


def test_td_residuals_accumulate_to_gae():
    g = torch.Generator().manual_seed(0)
    B, T, gamma = 6, 7, 0.9
    lengths = torch.tensor([7, 1, 4, 7, 3, 5])
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    rewards = torch.randn(B, T, generator=g, dtype=torch.double)
    values = torch.randn(B, T, generator=g, dtype=torch.double)
    terminated = torch.tensor([True, False, True, False, False, True])
    boot = torch.randn(B, generator=g, dtype=torch.double)
    lam = torch.tensor([0.95, 0.5, 1.0, 0.0, 0.8, 0.9], dtype=torch.double)
    deltas = td_residuals(rewards, values, mask, gamma=gamma, terminated=terminated, bootstrap_values=boot)
    adv, _ = gae(rewards, values, mask, gamma=gamma, lam=lam, terminated=terminated, bootstrap_values=boot)
    assert bool((deltas[~mask] == 0).all())
    for i in range(B):
        n = int(lengths[i])
        last = n - 1
        after = 0.0 if terminated[i] else gamma * float(boot[i])  # V(x_{T+1}): 0 at a stop token, else bootstrap
        assert float(deltas[i, last]) == pytest.approx(float(rewards[i, last]) + after - float(values[i, last]))
        if n > 1:
            assert float(deltas[i, 0]) == pytest.approx(float(rewards[i, 0] + gamma * values[i, 1] - values[i, 0]))
        expect = _discounted_sums(deltas[i, :n].tolist(), gamma * float(lam[i]))
        assert adv[i, :n].tolist() == pytest.approx(expect, abs=1e-12)


@pytest.fixture(scope="module")
def gae_run(tmp_path_factory):
    """Two iterations of PPO (GAE, whitened, a separate critic), every episode's credit logged, a
    checkpoint per iteration (for the resume test)."""
    run = tmp_path_factory.mktemp("credit") / "run"
    cfg = tiny_config(run, log__sample_every=1, log__num_samples=8, log__save_every=1, rollout__max_new_tokens=6)
    trainer = PPOTrainer(cfg, verifier=length_reward)
    done = []
    iterate = trainer.train_iteration
    trainer.train_iteration = lambda it: done.append(iterate(it)) or done[-1]
    trainer.train()
    return run, trainer, done[-1].batch


def test_the_stored_deltas_reproduce_the_stored_advantages(gae_run):
    run, trainer, _ = gae_run
    records = _records(run)
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [(r["iteration"], r["episode"]) for r in records] == [(it, i) for it in (1, 2) for i in range(8)]
    assert [(r["response"], r["score"]) for r in records] == [(s["response"], s["score"]) for s in samples]
    assert {r["terminated"] for r in records} == {True, False}, "want terminated and truncated episodes"
    a = trainer.cfg.algo
    for r in records:
        n = len(r["tokens"])
        assert n == len(r["token_ids"]) and all(len(r[k]) == n for k in PER_TOKEN_KEYS)
        assert (r["estimator"], r["gamma"], r["lam"], r["whitened"]) == ("gae", a.gamma, a.gae_lambda, True)
        # the correctness check of docs/report.md: Σ_l (γλ)^l δ_{t+l} is the stored Â before whitening
        assert _discounted_sums(r["delta"], r["gamma"] * r["lam"]) == pytest.approx(r["advantage_raw"], abs=1e-5)
        # δ_t = r_t + γ·V(x_{t+1}) − V(x_t); after the last token V is 0 (terminated) or the bootstrap value
        after = [*r["value"][1:], 0.0 if r["terminated"] else r["bootstrap_value"]]
        assert (r["bootstrap_value"] is None) == r["terminated"]
        assert r["delta"] == pytest.approx([rt + r["gamma"] * v1 - v for rt, v1, v in zip(r["reward"], after, r["value"])],
                                           abs=1e-5)
        # r_t = −β·kl_t, plus the score at the last token; k1: kl = logp_old − logp_ref; R̂ = Â_raw + V
        assert r["kl"] == pytest.approx([o - f for o, f in zip(r["logp_old"], r["logp_ref"])], abs=1e-5)
        shaped = [-r["kl_coef"] * k for k in r["kl"]]
        shaped[-1] += r["score"]
        assert r["reward"] == pytest.approx(shaped, abs=1e-5)
        assert r["return"] == pytest.approx([x + v for x, v in zip(r["advantage_raw"], r["value"])], abs=1e-5)
    # whitening is one affine map over the batch: the same scale and shift on every token
    xs = [x for r in records[8:] for x in r["advantage_raw"]]
    ys = [y for r in records[8:] for y in r["advantage"]]
    lo, hi = xs.index(min(xs)), xs.index(max(xs))
    scale = (ys[hi] - ys[lo]) / (xs[hi] - xs[lo])
    assert scale > 0 and ys == pytest.approx([ys[lo] + scale * (x - xs[lo]) for x in xs], abs=1e-4)
    assert any(abs(x - 1) > 1e-4 for r in records for x in r["ratio"]), "the update changed no probability"


def test_the_ratio_is_the_updated_policy_over_logp_old(gae_run):
    run, trainer, b = gae_run
    last = [r for r in _records(run) if r["iteration"] == 2]
    with torch.no_grad():
        logp = trainer.models.policy(b.input_ids, b.attention_mask, b.prompt_width)["logp"]
    ratio = torch.exp(logp - b.logp_old)
    for i, r in enumerate(last):
        assert r["ratio"] == pytest.approx(ratio[i, : len(r["tokens"])].tolist(), rel=1e-5)


def test_a_resumed_run_rewrites_the_credit_file_bit_exactly(gae_run, tmp_path):
    """A crash after iteration 2 wrote its lines but before its checkpoint: the resumed run from
    iteration 1's checkpoint drops those lines and writes the same ones again, ratios included (the
    extra forward draws no random numbers)."""
    full, _, _ = gae_run
    part = tmp_path / "part"
    shutil.copytree(full, part)
    shutil.rmtree(part / "checkpoints" / "iter_000002")
    (part / "metrics.jsonl").unlink()  # not compared here (timings differ); it is truncated like credit.jsonl
    with open(part / CREDIT_FILE, "a") as f:  # and half a line more
        f.write('{"iteration": 2, "episode": 8, "tok')
    settings = dict(log__sample_every=1, log__num_samples=8, log__save_every=1, rollout__max_new_tokens=6)
    PPOTrainer(tiny_config(part, resume=True, **settings), verifier=length_reward).train()
    assert (part / CREDIT_FILE).read_text() == (full / CREDIT_FILE).read_text()


def test_critic_free_estimators_store_advantages_and_no_values(tmp_path):
    cfg = tiny_config(tmp_path, iterations=1, algo__estimator="grpo", rollout__num_prompts=4,
                      rollout__samples_per_prompt=2, log__sample_every=1, log__num_samples=8)
    PPOTrainer(cfg, verifier=length_reward).train()
    records = _records(tmp_path)
    assert len(records) == 8
    for r in records:
        assert r["value"] is None and r["delta"] is None and r["return"] is None and r["lam"] is None
        assert r["bootstrap_value"] is None and not r["whitened"]
        assert r["advantage"] == r["advantage_raw"] and len(set(r["advantage"])) == 1  # one Â per response
        assert len(r["ratio"]) == len(r["tokens"])
    for first, second in zip(records[::2], records[1::2]):  # GRPO: the pair's advantages are ±the same
        if first["score"] != second["score"]:
            assert first["advantage"][0] == pytest.approx(-second["advantage"][0], abs=1e-5)
