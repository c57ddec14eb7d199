"""Explicit turn records (docs/report.md, docs/environments.md "Diagnostics"): every multi-turn record of
credit.jsonl and samples.jsonl lists its turns — `start`, `end` (the turn's sampled tokens are
tokens[start:end]) and `reward` — so turns with no observation between them (an environment's `None`
answer) stay two turns; `ppo-lm report` counts and marks turns from them, and reads older files (no
`turns`) from the `action` flags as before."""

from __future__ import annotations

import json
import re

import pytest
import torch
from browser_helpers import browser
from trainer_helpers import tiny_config

from ppo_lm.cli.main import main
from ppo_lm.trainer.ppo import PPOTrainer

ENV = '''
class Adjacent:
    """Two turns, no observation: the second follows the first directly in the same context. A turn's
    reward tells the turn and the text it got (environments may run in other processes: the logs must
    show what they received)."""

    answer = None

    def reset(self, row, seed):
        self.n = 0
        return row["prompt"]

    def step(self, text):
        self.n += 1
        return self.answer, 1000.0 * self.n + sum(map(ord, text)), self.n >= 2


class Answered(Adjacent):
    answer = " ok:"
'''

ITERATION, EPISODES = 1, 4


def _train(root, cls: str):
    """One iteration of PPO (GAE, a critic) on ``cls``, every episode logged; the run and the trainer."""
    root.mkdir(parents=True, exist_ok=True)
    env = root / "adjacent_env.py"
    env.write_text(ENV)
    cfg = tiny_config(root / "run", iterations=ITERATION, rollout__env=f"{env}:{cls}", rollout__num_prompts=EPISODES,
                      rollout__max_new_tokens=4, log__sample_every=1, log__num_samples=EPISODES,
                      optim__epochs=1, optim__num_minibatches=1)
    tr = PPOTrainer(cfg)
    tr.train()
    return root / "run", tr


@pytest.fixture(scope="module")
def adjacent_run(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("adjacent"), "Adjacent")


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _check_turns(run, tr, observation: str) -> list[dict]:
    """credit.jsonl and samples.jsonl give each episode 2 turns: the reward of each is the one the
    environment returned for the text its sampled ids decode to (the stop token aside, as the
    environment got it), and the observation (``observation``, "" for none) sits between them.
    Returns the credit records."""
    tok = tr.models.tokenizer
    stops = set(tr.sampler.sampling.stop_token_ids)
    credit, samples = _lines(run / "credit.jsonl"), _lines(run / "samples.jsonl")
    assert len(credit) == len(samples) == EPISODES
    for rec, sample in zip(credit, samples):
        turns = rec["turns"]
        assert len(turns) == 2 and turns[0]["start"] == 0 and turns[1]["end"] == len(rec["tokens"])
        for k, turn in enumerate(turns):
            ids = rec["token_ids"][turn["start"] : turn["end"]]
            assert all(rec["action"][turn["start"] : turn["end"]])
            kept = ids[:-1] if ids[-1] in stops else ids
            text = tok.decode(kept, skip_special_tokens=True)
            assert turn["reward"] == 1000.0 * (k + 1) + sum(map(ord, text)), (turn, text)
        gap = rec["token_ids"][turns[0]["end"] : turns[1]["start"]]
        assert tok.decode(gap) == observation and not any(rec["action"][turns[0]["end"] : turns[1]["start"]])
        assert turns[1]["reward"] == rec["score"]
        # the first turn's reward is a step reward on its last token: r_t = −β·kl_t + that reward
        last = turns[0]["end"] - 1
        assert rec["reward"][last] + rec["kl_coef"] * rec["kl"][last] == pytest.approx(turns[0]["reward"], abs=1e-4)
        # samples.jsonl: the same turns, with their texts, which put together are the response
        assert [{k: t[k] for k in ("start", "end", "reward")} for t in sample["turns"]] == turns
        assert [t["observation"] for t in sample["turns"]] == [observation, ""]
        assert "".join(t["text"] + t["observation"] for t in sample["turns"]) == sample["response"]
    return credit


def test_adjacent_turns_are_two_turns_in_credit_and_samples(adjacent_run):
    run, tr = adjacent_run
    credit = _check_turns(run, tr, observation="")
    assert all(all(r["action"]) for r in credit), "no observation: the action flags are one run"


def test_turns_with_an_observation_between_them(tmp_path):
    run, tr = _train(tmp_path, "Answered")
    _check_turns(run, tr, observation=" ok:")


def _page_data(run) -> dict:
    page = (run / "report" / "index.html").read_text(encoding="utf-8")
    return json.loads(re.search(r'<script type="application/json" id="credit-data">(.*?)</script>', page, re.S)[1])


def test_the_report_counts_and_marks_adjacent_turns(adjacent_run):
    run, _ = adjacent_run
    assert main(["report", str(run)]) == 0
    records = _lines(run / "credit.jsonl")
    data = _page_data(run)
    # what the page counts and marks turns from (the header's count, a bar at each later turn's start)
    assert data["turns"] == [r["turns"] for r in records]
    assert data["episodes"] == records
    driver = browser()
    try:
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.by import By

        driver.get((run / "report" / "index.html").as_uri())
        heads = [h.text for h in driver.find_elements(By.CSS_SELECTOR, ".episode .head")]
        assert len(heads) == len(records)
        for head, r in zip(heads, records):
            rewards = ", ".join(f"{t['reward']:g}" for t in r["turns"])
            assert f"· 2 turns · turn rewards {rewards} ·" in head and "observations" not in head, head
        spans = driver.find_elements(By.CSS_SELECTOR, ".tok")
        starts = [i == r["turns"][1]["start"] for r in records for i in range(len(r["tokens"]))]
        assert ["turn" in s.get_attribute("class") for s in spans] == starts
        ActionChains(driver).move_to_element(spans[starts.index(True)]).perform()
        assert "turn 2/2" in driver.find_element(By.ID, "tip").text
        assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        driver.quit()


def test_a_file_without_turn_records_is_read_from_the_action_flags(adjacent_run, tmp_path):
    """Files written before records carried `turns`: one turn per run of action tokens, no reward — so
    adjacent turns count as one there, as they did."""
    from ppo_lm.reporting.report_page import record_turns

    run, _ = adjacent_run
    old = tmp_path / "run"
    old.mkdir()
    records = _lines(run / "credit.jsonl")
    (old / "credit.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "turns"}) + "\n"
                                              for r in records))
    assert main(["report", str(old)]) == 0
    assert _page_data(old)["turns"] == [[{"start": 0, "end": len(r["tokens"]), "reward": None}] for r in records]
    toks = ["a", "b", "c", "d", "e"]
    assert record_turns({"tokens": toks, "action": [True, False, False, True, True]}) == [
        {"start": 0, "end": 1, "reward": None}, {"start": 3, "end": 5, "reward": None}]
    assert record_turns({"tokens": toks}) == []  # single-turn: no turns
    mine = [{"start": 0, "end": 2, "reward": 1.0}, {"start": 2, "end": 5, "reward": None}]
    assert record_turns({"tokens": toks, "action": [True] * 5, "turns": mine}) == mine
    broken = [{"start": 0, "end": 9, "reward": 1.0}]  # past the tokens: not trusted, the flags are read
    assert record_turns({"tokens": toks, "action": [True] * 5, "turns": broken}) == [
        {"start": 0, "end": 5, "reward": None}]


def test_turn_records_of_a_batch():
    """episode_turns on a hand-made batch: adjacent turns, an observation answering a turn, padding; a
    single-turn batch's records carry no `turns`."""
    from ppo_lm.config.train import AlgoConfig
    from ppo_lm.config.validate import resolve_algo
    from ppo_lm.rollout.score.batch import RolloutBatch
    from ppo_lm.tasks.equations import build_tokenizer
    from ppo_lm.trainer.credit import CreditTargets, credit_records, episode_turns

    tok = build_tokenizer()
    B, T = 2, 6
    ids = torch.tensor([tok("=x", add_special_tokens=False)["input_ids"][:1] * (1 + T)] * B)
    response = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    action = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 0, 0, 1, 1, 1]], dtype=torch.bool)
    turn_index = torch.tensor([[0, 0, 1, 1, 1, -1], [0, 0, 0, 1, 1, 2]])
    steps = torch.zeros(B, T)
    steps[0, 1], steps[1, 0], steps[1, 4] = 0.5, 1.0, -1.0
    zeros = torch.zeros(B, T)
    batch = RolloutBatch(input_ids=ids, attention_mask=torch.ones(B, 1 + T), prompt_width=1, response_mask=response,
                         terminated=torch.ones(B, dtype=torch.bool), logp_old=zeros, logp_ref=zeros,
                         scores=torch.tensor([2.0, 3.0]), action_mask=action, turn_index=turn_index,
                         step_rewards=steps)
    want = [[{"start": 0, "end": 2, "reward": 0.5}, {"start": 2, "end": 5, "reward": 2.0}],
            [{"start": 0, "end": 1, "reward": 1.0}, {"start": 3, "end": 5, "reward": -1.0},
             {"start": 5, "end": 6, "reward": 3.0}]]
    algo = resolve_algo(AlgoConfig())
    records = credit_records(batch, CreditTargets(zeros, zeros, zeros, None, 0.0), zeros, tok, algo, B)
    assert [r["turns"] for r in records] == want
    one = tok.decode(ids[0, 1:2].tolist())
    texts = episode_turns(batch, B, tok)
    assert [[(t["text"], t["observation"]) for t in row] for row in texts] == [
        [(one * 2, ""), (one * 3, "")], [(one, one * 2), (one * 2, ""), (one, "")]]
    single = RolloutBatch(input_ids=ids, attention_mask=torch.ones(B, 1 + T), prompt_width=1, response_mask=response,
                          terminated=torch.ones(B, dtype=torch.bool), logp_old=zeros, logp_ref=zeros,
                          scores=torch.zeros(B))
    records = credit_records(single, CreditTargets(zeros, zeros, zeros, None, 0.0), zeros, tok, algo, B)
    assert not any("turns" in r or "action" in r for r in records)

