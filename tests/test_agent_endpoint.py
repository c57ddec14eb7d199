"""The OpenAI-compatible endpoint (rollout/agents/): the real `openai` client against the tiny policy on
127.0.0.1 — answers in OpenAI's shapes, every call recorded token-exact (the sampled ids never
re-tokenized, the ids between two calls exactly what the template's rendering adds), a rewritten
history recorded as separate segments, concurrent requests sampled as one batch, refusals as one-line
400s."""

from __future__ import annotations

import json
import threading

import openai
import pytest
import torch
from trainer_helpers import bpe_tokenizer

from ppo_lm.rollout.agents.calls import EpisodeCalls
from ppo_lm.rollout.agents.endpoint import AgentEndpoint
from ppo_lm.rollout.agents.openai_api import BadRequest, CallRequest, Choice, chat_body, parse_request
from ppo_lm.rollout.envs.environment import Renderer
from ppo_lm.rollout.sample.engine import TorchEngine
from ppo_lm.rollout.sample.sampling import SamplingParams
from ppo_lm.tasks.equations import build_tiny_policy

TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %}\n{{ t | tojson }}{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two integers.",
                                           "parameters": {"type": "object", "properties": {
                                               "a": {"type": "integer"}, "b": {"type": "integer"}}}}}]


def tiny_endpoint(corpus: list[str], max_new_tokens: int, max_context: int):
    """A chat tokenizer trained on ``corpus``, a tiny policy's engine, and the endpoint serving it (started)."""
    tok = bpe_tokenizer(corpus, 300, chat_template=TEMPLATE)
    engine = TorchEngine(build_tiny_policy(tok, seed=0, hidden_size=32), pad_token_id=tok.pad_token_id)
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, stop_token_ids=(tok.eos_token_id,))
    return tok, engine, AgentEndpoint(Renderer(tok), sampling, max_context=max_context).start()


@pytest.fixture(scope="module")
def served():
    tok, engine, endpoint = tiny_endpoint([CALL, "What is 2 + 3? Use the tool.", "5", "Say it again."], 12, 512)
    yield tok, engine, endpoint
    endpoint.stop()


def _client(endpoint, eid):
    return openai.OpenAI(base_url=endpoint.base_url(eid), api_key="unused", max_retries=0, timeout=60)


def _play(endpoint, engine, agents: dict, seed=0):
    """Run each agent(client) in a thread against its episode while this thread samples; returns what
    each agent returned and each episode's calls."""
    results, threads = {}, []
    for eid, agent in agents.items():
        endpoint.open(eid)

        def run(eid=eid, agent=agent):
            try:
                results[eid] = agent(_client(endpoint, eid))
            except Exception as e:  # noqa: BLE001 (the test reads it)
                results[eid] = e
        threads.append(threading.Thread(target=run))
    for t in threads:
        t.start()
    endpoint.serve(engine, torch.Generator().manual_seed(seed), lambda: not any(t.is_alive() for t in threads))
    return results, {eid: endpoint.close(eid) for eid in agents}


def _three_turns(client):
    """A tool-using loop as agents write it: the reply appended as the client returned it, then a tool
    result or a user turn."""
    messages = [{"role": "user", "content": "What is 2 + 3? Use the tool."}]
    sent = []
    for _ in range(3):
        sent.append([dict(m) for m in messages])
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, logprobs=True)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "content": "5"} if message.tool_calls else
                        {"role": "user", "content": "Say it again."})
        sent[-1].append(reply)
    return sent


def test_calls_are_recorded_token_exact_across_turns(served):
    tok, engine, endpoint = served
    results, calls = _play(endpoint, engine, {0: _three_turns})
    sent, record = results[0], calls[0]
    assert not isinstance(sent, Exception), sent
    assert [c.parent for c in record.calls] == [None, 0, 1] and record.segments() == [[0, 1, 2]]
    for k, call in enumerate(record.calls):
        *messages, reply = sent[k]
        choice = reply.choices[0]
        # the prompt is the template's rendering of what the client sent, the endpoint's own answers
        # rendered as the ids they were sampled as
        assert tok.decode(call.prompt_ids) == record.chat_text(messages, TOOLS)
        if k:
            before = record.calls[k - 1]
            assert call.prompt_ids == before.prompt_ids + before.sampled + call.observation
        # what the client received is the sampled ids' text, the stop token left off
        body = call.sampled[:-1] if choice.finish_reason != "length" else call.sampled
        if not choice.message.tool_calls:
            assert choice.message.content == tok.decode(body, skip_special_tokens=True)
        assert [lp.logprob for lp in choice.logprobs.content] == pytest.approx(call.logprobs)
    traj = record.trajectory([0, 1, 2])
    sampled = [t for t, a in zip(traj.tokens, traj.actions) if a]
    assert sampled == sum((c.sampled for c in record.calls), [])
    assert traj.turns == 3 and traj.observation_tokens == sum(len(c.observation) for c in record.calls)


def test_a_tool_call_comes_back_in_openai_form_and_is_rendered_as_sampled():
    tok = bpe_tokenizer([CALL, "What is 2 + 3?"], 300, chat_template=TEMPLATE)
    record = EpisodeCalls(Renderer(tok))
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    text = record.chat_text(messages, TOOLS)
    ids, parent, _ = record.prompt(text)
    sampled = tok(CALL, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    record.record(text, ids, parent, [], sampled, [-1.0] * len(sampled), 0)
    request = CallRequest("chat", messages=messages, tools=TOOLS)
    body = chat_body(request, [Choice(CALL, sampled, [-1.0] * len(sampled), "stop", raw=CALL)], "chatcmpl-0", len(ids))
    message = body["choices"][0]["message"]
    assert body["choices"][0]["finish_reason"] == "tool_calls" and message["content"] is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [
        ("add", {"a": 2, "b": 3})]
    record.returned(message, CALL)
    # the client sends it back with the arguments serialised its own way
    back = {"role": "assistant", "tool_calls": [{"id": "x", "type": "function", "function": {
        "name": "add", "arguments": json.dumps({"b": 3, "a": 2}, separators=(",", ":"))}}]}
    nxt = record.chat_text([*messages, back, {"role": "tool", "content": "5"}], TOOLS)
    ids2, parent2, obs = record.prompt(nxt)
    assert parent2 == 0 and ids2[:len(ids) + len(sampled)] == ids + sampled
    assert tok.decode(obs) == "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"


def test_a_rewritten_history_is_recorded_as_segments_each_exact(served):
    tok, engine, endpoint = served

    def forgetful(client):
        first = [{"role": "user", "content": "What is 2 + 3? Use the tool."}]
        a = client.chat.completions.create(model="policy", messages=first)
        # the harness summarises the history: the assistant's answer is not sent back as it came
        second = [{"role": "user", "content": "Say it again."}]
        b = client.chat.completions.create(model="policy", messages=second)
        third = [*second, b.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "5"}]
        client.chat.completions.create(model="policy", messages=third)
        return a, b

    results, calls = _play(endpoint, engine, {3: forgetful}, seed=1)
    record = calls[3]
    assert [c.parent for c in record.calls] == [None, None, 1] and record.segments() == [[0], [1, 2]]
    for chain in record.segments():
        traj = record.trajectory(chain)
        first = record.calls[chain[0]]
        assert traj.prompt_ids == first.prompt_ids and traj.turns == len(chain)
        assert [t for t, a in zip(traj.tokens, traj.actions) if a] == sum((record.calls[i].sampled for i in chain), [])


def test_concurrent_episodes_are_sampled_in_one_batch(served):
    tok, engine, endpoint = served
    seen = threading.Event()
    for eid in range(4):
        endpoint.open(10 + eid)
    out = {}

    def ask(eid):
        out[eid] = _client(endpoint, eid).completions.create(model="policy", prompt="What is 2 + 3?", max_tokens=5,
                                                             logprobs=0)
    threads = [threading.Thread(target=ask, args=(10 + i,)) for i in range(4)]
    for t in threads:
        t.start()
    while endpoint._queue.qsize() < 4:  # all four waiting: one step answers them together
        seen.wait(0.01)
    before = len(endpoint.batches)
    endpoint.serve(engine, torch.Generator().manual_seed(2), lambda: not any(t.is_alive() for t in threads))
    assert endpoint.batches[before:] == [4]
    for eid in range(10, 14):
        record = endpoint.close(eid)
        (call,) = record.calls
        choice = out[eid].choices[0]
        assert len(call.sampled) <= 5 and choice.logprobs.token_logprobs == pytest.approx(call.logprobs)
        assert choice.text == tok.decode(call.sampled[:-1] if choice.finish_reason == "stop" else call.sampled,
                                         skip_special_tokens=True)


def test_n_choices_are_branches_and_stop_strings_cut_the_text(served):
    tok, engine, endpoint = served

    def two(client):
        return client.completions.create(model="policy", prompt="What is 2", n=2, stop=["3"], max_tokens=12)

    results, calls = _play(endpoint, engine, {20: two}, seed=3)
    reply, record = results[20], calls[20]
    assert len(reply.choices) == 2 and record.segments() == [[0], [1]]
    for choice, call in zip(reply.choices, record.calls):
        assert "3" not in choice.text
        if choice.finish_reason == "stop" and call.sampled[-1] != tok.eos_token_id:  # cut at the stop string
            assert "3" in tok.decode(call.sampled) and "3" not in tok.decode(call.sampled[:-1])


@pytest.mark.parametrize("extra, names", [
    ({"presence_penalty": 0.5}, "`presence_penalty` is not served"),
    ({"temperature": 0.5}, "rollout.temperature 1.0"),
    ({"stream": True}, "`stream`"),
    ({"tool_choice": "required"}, "`tool_choice`"),
    ({"top_logprobs": 3, "logprobs": True}, "`top_logprobs`"),
])
def test_what_the_endpoint_cannot_honour_is_a_one_line_400(served, extra, names):
    tok, engine, endpoint = served

    def ask(client):
        return client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}], **extra)

    results, calls = _play(endpoint, engine, {30: ask})
    err = results[30]
    assert isinstance(err, openai.BadRequestError) and names in str(err) and "\n" not in err.body["message"]
    assert calls[30].calls == []


def test_a_call_to_an_episode_that_ended_is_refused(served):
    tok, engine, endpoint = served
    results, _ = _play(endpoint, engine, {40: lambda client: None})
    box = {}
    t = threading.Thread(target=lambda: box.update(r=_try(lambda: _client(endpoint, 40).completions.create(
        model="policy", prompt="hi"))))
    t.start()
    endpoint.serve(engine, None, lambda: not t.is_alive())
    assert isinstance(box["r"], openai.ConflictError) and "episode 40 is not running" in str(box["r"])


def _try(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        return e


def test_requests_are_checked_before_any_sampling():
    with pytest.raises(BadRequest, match="`stop`"):
        parse_request("chat", {"messages": [{"role": "user", "content": "x"}], "stop": ["a"] * 5},
                      temperature=1.0, top_p=1.0)
    with pytest.raises(BadRequest, match="`prompt`"):
        parse_request("completion", {"prompt": ["a", "b"]}, temperature=1.0, top_p=1.0)
    with pytest.raises(BadRequest, match="`n`"):
        parse_request("completion", {"prompt": "a", "n": 0}, temperature=1.0, top_p=1.0)
    ok = parse_request("chat", {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                          {"type": "text", "text": "b"}]}],
                                "temperature": 1.0, "max_completion_tokens": 4}, temperature=1.0, top_p=1.0)
    assert ok.messages[0]["content"] == "ab" and ok.max_tokens == 4


def test_requests_that_come_close_together_wait_for_one_step(served):
    """The first request waits up to `gather_s` for the other open episodes': three asking 0.1 s apart
    are sampled in one generation step."""
    tok, engine, endpoint = served
    for eid in range(50, 53):
        endpoint.open(eid)

    def ask(eid, delay):
        threading.Event().wait(delay)
        _client(endpoint, eid).completions.create(model="policy", prompt="What is 2 + 3?", max_tokens=3)
    threads = [threading.Thread(target=ask, args=(50 + i, 0.1 * i)) for i in range(3)]
    for t in threads:
        t.start()
    before = len(endpoint.batches)
    endpoint.serve(engine, None, lambda: not any(t.is_alive() for t in threads), gather_s=0.5)
    assert endpoint.batches[before:] == [3]
    for eid in range(50, 53):
        endpoint.close(eid)
