"""Agents played as episodes (rollout/agents/episodes.py): the user's own `run(client, row)`, sync or
async, with a real `openai` client per episode against the endpoint on 127.0.0.1 — its return is the
reward, its error one line with its own frames, a hung agent cut at its limit."""

from __future__ import annotations

import time

import pytest
import torch
from test_agent_endpoint import tiny_endpoint

from ppo_lm.rollout.agents.episodes import AgentEpisodes

ROWS = [{"question": "What is 2 + 3?", "answer": "5"}, {"question": "What is 4 + 4?", "answer": "8"}]


@pytest.fixture(scope="module")
def served():
    tok, engine, endpoint = tiny_endpoint([r["question"] for r in ROWS] + ["Try again."], 6, 256)
    yield tok, engine, endpoint
    endpoint.stop()


def two_turns(client, row):
    """An agent as users write one: ask, look at the answer, ask again; the reward is its own check."""
    messages = [{"role": "user", "content": row["question"]}]
    for _ in range(2):
        reply = client.chat.completions.create(model="policy", messages=messages)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Try again."}]
    return float(row["answer"] in messages[-2]["content"]) + 0.5


async def two_turns_async(client, row):
    messages = [{"role": "user", "content": row["question"]}]
    for _ in range(2):
        reply = await client.chat.completions.create(model="policy", messages=messages)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Try again."}]
    return [0.25, 0.75]  # one reward per call


def _play(served, agent, samples=2, timeout_s=60.0):
    tok, engine, endpoint = served
    return AgentEpisodes(agent, endpoint, timeout_s=timeout_s).play(engine, torch.Generator().manual_seed(0), ROWS,
                                                                     samples)


def test_each_episode_is_its_agents_calls_with_its_reward(served):
    episodes = _play(served, two_turns)
    assert len(episodes) == 4 and all(e.error is None and e.segments == 1 for e in episodes)
    for i, e in enumerate(episodes):
        t = e.traj
        assert t.row is ROWS[i // 2] and t.turns == 2 and t.terminated
        assert t.rewards[0] == 0.0 and t.rewards[1] in (0.5, 1.5)  # the number on the last call
        assert t.observation_tokens > 0 and len(t.logprobs) == len(t.tokens)


def test_an_async_agent_gets_the_async_client_and_may_reward_each_call(served):
    import openai

    seen = []

    async def checks_its_client(client, row):
        seen.append(type(client))
        return await two_turns_async(client, row)

    episodes = _play(served, checks_its_client, samples=1)
    assert seen == [openai.AsyncOpenAI] * 2 and [e.error for e in episodes] == [None, None]
    assert [e.traj.rewards for e in episodes] == [[0.25, 0.75]] * 2
    # not one reward per call: the episode's error, scored 0
    wrong = _play(served, lambda client, row: [two_turns(client, row)] * 3, samples=1)
    assert wrong[0].error == "the agent returned 3 rewards for its 2 calls; return one per call, or one number"
    assert wrong[0].traj.rewards == [0.0, 0.0]


def test_an_agent_that_raises_is_its_episodes_error_in_one_line_with_its_frames(served):
    def broken(client, row):
        client.completions.create(model="policy", prompt=row["question"], max_tokens=2)
        raise KeyError("tool")

    episodes = _play(served, broken, samples=1)
    for e in episodes:
        assert e.error.startswith("the agent raised KeyError: 'tool'") and "test_agent_episodes.py" in e.error
        assert e.traj.rewards == [0.0] and e.traj.terminated


def test_a_hung_agent_is_cut_at_its_limit_and_its_late_call_refused(served):
    late = {}

    def hangs(client, row):
        client.completions.create(model="policy", prompt=row["question"], max_tokens=2)
        time.sleep(1.5)
        try:
            client.completions.create(model="policy", prompt=row["question"], max_tokens=2)
        except Exception as e:  # noqa: BLE001
            late[row["answer"]] = e

    start = time.monotonic()
    episodes = _play(served, hangs, samples=1, timeout_s=0.75)
    assert time.monotonic() - start < 1.4  # the iteration did not wait for the agents
    for e in episodes:
        assert "ran past its time limit of 0.75 s" in e.error and not e.traj.terminated and e.traj.turns == 1
    time.sleep(1.5)
    assert sorted(late) == ["5", "8"] and all("is not running" in str(e) for e in late.values())


def test_an_agent_that_never_calls_has_no_trajectory(served):
    episodes = _play(served, lambda client, row: 1.0, samples=1)
    assert all(e.traj is None and e.error == "the agent made no call to its client" for e in episodes)
