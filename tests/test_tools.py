"""Tools (docs/environments.md): calls parsed from the model's `<tool_call>{json}</tool_call>` text, run
with a time limit, answered as tool messages (errors included, as a tool would answer them), the
functions rendered by the chat template's `tools`; and a ToolEnv episode end to end."""

from __future__ import annotations

import json
import time

import pytest
import torch
from trainer_helpers import bpe_tokenizer, tiny_config

from ppo_lm.rollout.envs.environment import Renderer
from ppo_lm.rollout.envs.tools import ToolEnv, parse_tool_calls, run_tool_call
from ppo_lm.tasks.equations import build_tiny_policy
from ppo_lm.trainer.ppo import PPOTrainer


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def slow(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "done"


TOOLS = {"add": add, "slow": slow}


def test_tool_calls_are_parsed_in_order():
    text = ('I will add. <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call> and '
            '<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 1}"}\n</tool_call>')
    assert parse_tool_calls(text) == [{"name": "add", "arguments": {"a": 2, "b": 3}},
                                      {"name": "add", "arguments": {"a": 1, "b": 1}}]
    assert parse_tool_calls("no call here") == []


@pytest.mark.parametrize("block, message", [
    ('{"name": "add", "arguments": {"a": 2,}}', "error: the tool call is not valid JSON"),
    ('["add"]', 'error: a tool call is {"name"'),
    ('{"name": "add", "arguments": 3}', 'error: a tool call is {"name"'),
])
def test_a_malformed_call_is_answered_with_an_error(block, message):
    (call,) = parse_tool_calls(f"<tool_call>{block}</tool_call>")
    assert run_tool_call(TOOLS, call, 1.0).startswith(message)


def test_calls_run_and_their_mistakes_come_back_as_errors():
    assert run_tool_call(TOOLS, {"name": "add", "arguments": {"a": 2, "b": 3}}, 1.0) == "5"
    assert run_tool_call(TOOLS, {"name": "mul", "arguments": {}}, 1.0) == "error: no tool 'mul'; the tools are add, slow"
    assert run_tool_call(TOOLS, {"name": "add", "arguments": {"a": 1}}, 1.0).startswith("error: TypeError: ")
    started = time.monotonic()
    out = run_tool_call(TOOLS, {"name": "slow", "arguments": {"seconds": 5}}, 0.2)
    assert out == "error: slow ran past its time limit of 0.2 s" and time.monotonic() - started < 2


class Calculator(ToolEnv):
    tools = [add]

    def prompt(self, row):
        return [{"role": "user", "content": row["prompt"]}]

    def reward(self, text):
        return float(text.strip() == str(self.row["answer"]))


def test_a_tool_env_calls_tools_then_scores_the_answer():
    env = Calculator()
    assert env.reset({"prompt": "2 + 3?", "answer": 5}, seed=0) == [{"role": "user", "content": "2 + 3?"}]
    obs, reward, done = env.step('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>')
    assert obs == [{"role": "tool", "content": "5"}] and reward == 0.0 and not done
    assert env.step("5") == (None, 1.0, True) and env.tool_calls == 1


TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %}\n{{ t | tojson }}{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def chat_tokenizer():
    corpus = ['<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>', "What is 2 + 3?", "5"]
    return bpe_tokenizer(corpus, 300, chat_template=TEMPLATE)


def test_the_template_renders_the_tools_and_the_whole_conversation(chat_tokenizer):
    tok, r = chat_tokenizer, Renderer(chat_tokenizer)
    env = Calculator()
    first = env.reset({"prompt": "What is 2 + 3?", "answer": 5}, 0)
    ids, history = r.first_prompt(first, env.tools)
    assert '"name": "add"' in tok.decode(ids) and "the first" in tok.decode(ids)  # the schema from the docstring
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    sampled = tok(call, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    obs = env.step(call)[0]
    obs_ids, history = r.observation(history, call, tok.decode(sampled[-1:]), obs, env.tools)
    seq = ids + sampled + obs_ids
    conversation = [*first, {"role": "assistant", "content": call}, {"role": "tool", "content": "5"}]
    assert tok.decode(seq) == tok.apply_chat_template(conversation, tools=env.tools, tokenize=False,
                                                      add_generation_prompt=True)
    assert seq[len(ids):len(ids) + len(sampled)] == sampled


def test_the_calculator_example_trains_end_to_end(tmp_path, chat_tokenizer):
    """examples/environments/calculator.py with a chat-template policy (random, so it rarely calls the
    tool): the prompts carry the tool schema, rows need only the environment's columns, every episode
    ends done or at the turn limit, and an update runs."""
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "examples" / "environments" / "calculator.py"
    rows = [{"question": f"What is {a} + {b}?", "answer": a + b} for a in range(4) for b in range(2)]
    lm = build_tiny_policy(chat_tokenizer, seed=0, hidden_size=32, max_position_embeddings=512)
    cfg = tiny_config(tmp_path / "run", rollout__env=f"{example}:Calculator", rollout__max_new_tokens=12,
                      rollout__max_turns=2)
    tr = PPOTrainer(cfg, policy=lm, tokenizer=chat_tokenizer, prompt_rows=rows)
    b = tr.rollout(1)
    assert all('"name": "add"' in p and "What is" in p for p in b.prompts)
    assert bool((b.action_mask <= b.response_mask).all())
    m = tr.learn(b, 1).metrics
    assert 1 <= m["turns_mean"] <= 2 and torch.isfinite(torch.tensor(m["ref_kl"]))
    json.dumps(m)


def test_the_models_mistakes_in_a_call_are_answered_not_raised():
    """Deep JSON (RecursionError inside json), a result JSON cannot write, an unclosed <tool_call>: each is
    an `error: …` tool message, and the episode goes on."""
    deep = "[" * 100_000 + "]" * 100_000
    (call,) = parse_tool_calls(f"<tool_call>{deep}</tool_call>")
    assert call == "error: the tool call's JSON nests too deep"

    def pairs(n: int) -> dict:
        """Pairs.

        Args:
            n: how many
        """
        return {(i, i): i for i in range(n)}

    out = run_tool_call({"pairs": pairs}, {"name": "pairs", "arguments": {"n": 2}}, 5.0)
    assert out.startswith("error: the tool's result cannot be written as JSON (TypeError")
    open_call = 'ok <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}'
    assert parse_tool_calls(open_call) == ["error: a <tool_call> without its </tool_call>; a tool call is "
                                           '<tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>']
    env = Calculator()
    env.reset({"prompt": "2 + 3?", "answer": 5}, seed=0)
    obs, reward, done = env.step(open_call)
    assert obs[0]["content"].startswith("error: a <tool_call> without") and not done
    closed_then_open = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call> <tool_call>'
    assert [c if isinstance(c, str) else "call" for c in parse_tool_calls(closed_then_open)][0] == "call"
    assert len(parse_tool_calls(closed_then_open)) == 2


def test_a_tool_without_a_docstring_is_refused_before_any_model(tmp_path, capsys):
    from ppo_lm.cli.main import main

    f = tmp_path / "env.py"
    f.write_text("from ppo_lm.rollout.envs.tools import ToolEnv\n\n\ndef add(a: int, b: int) -> int:\n    return a + b\n\n\n"
                 "class Env(ToolEnv):\n    tools = [add]\n")
    code = main(["train", "--iterations", "1", "--log.no-tensorboard", "--rollout.env", f"{f}:Env",
                 "--output-dir", str(tmp_path / "run")])
    out = capsys.readouterr()
    assert code == 2 and "tool 'add' cannot be described to the chat template" in out.err, out.err
    assert "Traceback" not in out.err and "policy" not in out.out  # refused before the banner: no model loaded


def test_a_template_that_refuses_the_tool_role_is_one_line(chat_tokenizer):
    from ppo_lm.rollout.envs.environment import EnvError

    strict = ("{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
              "{{ raise_exception('Conversation roles must alternate user/assistant\\nand nothing else') }}{% endif %}"
              "{{ m['content'] }}{% endfor %}")
    r = Renderer(chat_tokenizer, strict)
    _, history = r.first_prompt([{"role": "user", "content": "hi"}])
    with pytest.raises(EnvError) as e:
        r.observation(history, "x", None, [{"role": "tool", "content": "5"}])
    assert "the chat template cannot render the environment's conversation (roles: user, assistant, tool)" in str(e.value)
    assert "\n" not in str(e.value) and "TemplateError" in str(e.value)
