"""`rollout.agent`: a user's agent written against the OpenAI client trains with PPO and a critic — its
calls are the episode's turns (the sampled ids the actions, the rendered additions observations), its
return the reward; the setting is checked before any model loads."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from test_agent_endpoint import TEMPLATE
from trainer_helpers import bpe_tokenizer, tiny_config

from ppo_lm.runtime.errors import ConfigError
from ppo_lm.tasks.equations import build_tiny_policy
from ppo_lm.trainer.ppo import PPOTrainer

AGENT = textwrap.dedent('''
    def run(client, row):
        """Ask, then ask again with the answer in the history; 1 for an answer that holds a digit."""
        messages = [{"role": "user", "content": row["question"]}]
        for _ in range(2):
            reply = client.chat.completions.create(model="policy", messages=messages, temperature=1.0)
            messages.append(reply.choices[0].message.model_dump(exclude_none=True))
            messages.append({"role": "user", "content": "Again."})
        return float(any(c.isdigit() for c in messages[-2]["content"]))
''')
ROWS = [{"question": f"What is {a} + {b}?"} for a in range(4) for b in range(2)]


@pytest.fixture(scope="module")
def chat_tokenizer():
    return bpe_tokenizer([r["question"] for r in ROWS] + ["Again.", "0123456789"], 300, chat_template=TEMPLATE)


@pytest.mark.parametrize("lora", [0, 4], ids=["full", "lora"])
def test_an_agent_trains_through_its_own_client(tmp_path, chat_tokenizer, lora):
    """With full weights and with LoRA adapters (the endpoint serves the adapted policy)."""
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    lm = build_tiny_policy(chat_tokenizer, seed=0, hidden_size=32, max_position_embeddings=512)
    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps({"question": f"What is {a} + 3?"}) + "\n" for a in range(3)))
    cfg = tiny_config(tmp_path / "run", rollout__agent=f"{agent}:run", rollout__max_new_tokens=6,
                      data__eval_prompts=str(held), model__lora_r=lora)
    tr = PPOTrainer(cfg, policy=lm, tokenizer=chat_tokenizer, prompt_rows=ROWS)
    try:
        b = tr.rollout(1)
        assert b.episode_info["turns"].tolist() == [2] * 8 and b.episode_info["segments"].tolist() == [1] * 8
        assert all("What is" in p for p in b.prompts), b.prompts[0]
        assert bool((b.action_mask <= b.response_mask).all()) and bool((~b.action_mask & b.response_mask).any())
        m = tr.learn(b, 1).metrics
        assert m["turns_mean"] == 2 and m["segments_per_episode"] == 1 and m["episode_errors_frac"] == 0
        assert torch.isfinite(torch.tensor(m["ref_kl"])) and 0 <= m["score"] <= 1
        json.dumps(m)
        # held out: the same agent, sampled greedily (its temperature=1.0, the run's, is accepted)
        ev = tr.evaluate(1)
        assert 0 <= ev["eval_score"] <= 1 and ev["eval_turns"] == 2
    finally:
        tr.source.close()


def test_an_agent_is_checked_before_any_model_loads(tmp_path, no_model_loads):
    agent = tmp_path / "agent.py"
    agent.write_text("def run(client):\n    return 1.0\n")
    with pytest.raises(ConfigError, match=r"called as run\(client, row\)"):
        PPOTrainer(tiny_config(tmp_path / "a", rollout__agent=f"{agent}:run"))
    with pytest.raises(ConfigError, match="has no function 'play'"):
        PPOTrainer(tiny_config(tmp_path / "b", rollout__agent=f"{agent}:play"))
    with pytest.raises(ConfigError, match="keep one"):
        PPOTrainer(tiny_config(tmp_path / "c", rollout__agent=f"{agent}:run", rollout__env="builtin:equations_retry"))
    with pytest.raises(ConfigError, match="`rollout.agent_timeout_s`.*`rollout.agent` is not set"):
        PPOTrainer(tiny_config(tmp_path / "d", rollout__agent_timeout_s=5.0))


def test_an_agents_calls_are_its_turns_in_credit_and_samples(tmp_path, chat_tokenizer):
    """credit.jsonl and samples.jsonl (what `ppo-lm report` draws) show each call as a turn: its sampled
    ids, the reward the agent gave that call, and between two calls the template's additions."""
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT.replace("return float(any(c.isdigit() for c in messages[-2][\"content\"]))",
                                   "return [0.25, 0.75]"))
    lm = build_tiny_policy(chat_tokenizer, seed=0, hidden_size=32, max_position_embeddings=512)
    cfg = tiny_config(tmp_path / "run", iterations=1, rollout__agent=f"{agent}:run", rollout__num_prompts=4,
                      rollout__max_new_tokens=4, log__sample_every=1, log__num_samples=4, optim__epochs=1,
                      optim__num_minibatches=1)
    PPOTrainer(cfg, policy=lm, tokenizer=chat_tokenizer, prompt_rows=ROWS).train()
    credit = [json.loads(x) for x in (tmp_path / "run" / "credit.jsonl").read_text().splitlines()]
    samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert len(credit) == len(samples) == 4
    for rec, sample in zip(credit, samples):
        turns = rec["turns"]
        assert [t["reward"] for t in turns] == [0.25, 0.75] and rec["score"] == 0.75
        assert all(all(rec["action"][t["start"]:t["end"]]) for t in turns)
        gap = rec["token_ids"][turns[0]["end"]:turns[1]["start"]]
        assert chat_tokenizer.decode(gap).endswith("<|im_start|>user\nAgain.<|im_end|>\n<|im_start|>assistant\n")
        assert not any(rec["action"][turns[0]["end"]:turns[1]["start"]])
        assert [t["reward"] for t in sample["turns"]] == [0.25, 0.75]
