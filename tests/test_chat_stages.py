"""SFT and reward-model data as chat messages (TRL's conversational formats): a prompt of messages is
rendered by the tokenizer's chat template and encoded without a second set of special tokens, a
response may be one assistant message, a `messages` conversation splits into prompt and response, and
preference pairs may share their prompt turns; responses end with EOS as plain-text ones do."""

from __future__ import annotations

import json

import datasets
import pytest

from ppo_lm.cli.main import main
from ppo_lm.data.examples import ChatTemplateError, load_preference_rows, load_sft_rows
from ppo_lm.data.rows import InputError
from ppo_lm.stages import RMConfig, SFTConfig, build_sft_example, train_reward_model, train_sft
from ppo_lm.stages.rm import _encode_pairs, build_reward_model_from_policy_config
from ppo_lm.tasks.equations import (
    CHARACTERS,
    build_tiny_policy,
    build_tokenizer,
    preference_pairs,
    sft_demonstrations,
)

TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant: {% endif %}")
BOS, EOS = 2, 1
SYSTEM = {"role": "system", "content": "Be brief."}


def _ids(text: str) -> list[int]:
    """The built-in tokenizer's ids: one per character, after the four special tokens."""
    return [4 + CHARACTERS.index(c) for c in text]


@pytest.fixture(scope="module")
def tok():
    """The built-in tokenizer with a chat template that writes its own BOS, and (as Llama's does)
    adding a BOS to text it encodes with special tokens."""
    t = build_tokenizer()
    t.chat_template = TEMPLATE
    t.add_bos_token = True
    assert t("ab")["input_ids"] == [BOS, *_ids("ab")]
    return t


def _user(text: str) -> dict:
    return {"role": "user", "content": text.strip()}


def _assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def _chat_demos(n: int, seed: int = 0) -> list[dict]:
    return [{"messages": [SYSTEM, _user(r["prompt"]), _assistant(r["response"])]}
            for r in sft_demonstrations(n, seed=seed, error_rate=0.0)]


# -- encoding ------------------------------------------------------------------------------------


def test_a_chat_example_is_the_rendered_prompt_then_the_response_and_eos(tok):
    prompt = [SYSTEM, _user("Solve x+1=3")]
    rendered = "system: Be brief.\nuser: Solve x+1=3\nassistant: "
    expected_prompt = [BOS, *_ids(rendered)]  # the template's BOS, once: none added on top
    for response in ("x=2", [_assistant("x=2")], "x=2<eos>"):
        ids, labels = build_sft_example(tok, prompt, response)
        assert ids == expected_prompt + _ids("x=2") + [EOS]
        assert labels == [-100] * len(expected_prompt) + _ids("x=2") + [EOS]
        assert ids.count(BOS) == 1
    # a text prompt is encoded as before: the tokenizer adds its BOS
    ids, _ = build_sft_example(tok, "Solve x+1=3\n", "x=2")
    assert ids == [BOS, *_ids("Solve x+1=3\n"), *_ids("x=2"), EOS]


def test_messages_column_splits_into_prompt_and_last_assistant_turn(tok):
    convo = [SYSTEM, _user("Solve x+1=3"), _assistant("x=2"), _user("And 2x=8?"), _assistant("x=4")]
    rows = load_sft_rows([{"messages": convo, "id": 7}])
    assert rows == [{"messages": convo, "id": 7, "prompt": convo[:-1], "response": "x=4"}]
    # the same example as prompt + one assistant message, or prompt + text
    explicit = load_sft_rows([{"prompt": convo[:-1], "response": [convo[-1]]}, {"prompt": convo[:-1], "response": "x=4"}])
    assert [r["response"] for r in explicit] == ["x=4", "x=4"]
    ids = {tuple(build_sft_example(tok, r["prompt"], r["response"])[0]) for r in rows + explicit}
    assert len(ids) == 1
    # the earlier assistant turn is part of the prompt (not trained on)
    assert list(ids)[0][-len("x=4") - 1:] == (*_ids("x=4"), EOS)


def test_preference_rows_in_every_conversational_form(tok):
    prompt = [_user("Solve x+1=3")]
    explicit = {"prompt": prompt, "chosen": [_assistant("x=2")], "rejected": [_assistant("x=5")]}
    implicit = {"chosen": [*prompt, _assistant("x=2")], "rejected": [*prompt, _assistant("x=5")]}
    text = {"prompt": prompt, "chosen": "x=2", "rejected": "x=5"}
    rows = load_preference_rows([explicit, implicit, text])
    assert all((r["prompt"], r["chosen"], r["rejected"]) == (prompt, "x=2", "x=5") for r in rows)
    pairs, skipped = _encode_pairs(tok, rows, RMConfig())
    rendered = [BOS, *_ids("user: Solve x+1=3\nassistant: ")]
    assert skipped == 0 and pairs == [(rendered + _ids("x=2") + [EOS], rendered + _ids("x=5") + [EOS])] * 3


# -- training on chat data ---------------------------------------------------------------------


def test_sft_on_messages_from_a_file_lowers_the_loss(tok, tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _chat_demos(240)))
    model = build_tiny_policy(tok, seed=0, hidden_size=32)
    cfg = SFTConfig(lr=3e-3, max_steps=24, batch_size=16, log_every=0)
    metrics = train_sft(model, tok, path, cfg, seed=0)
    assert metrics["n_train"] + metrics["n_heldout"] == 240 and metrics["n_heldout"] > 0
    assert metrics["heldout_loss_after"] < 0.5 * metrics["heldout_loss_before"]
    assert sum(metrics["train_loss"][-5:]) < 0.6 * sum(metrics["train_loss"][:5])


def test_reward_model_on_conversational_pairs(tok):
    rows = [{"prompt": [_user(r["prompt"])], "chosen": [_assistant(r["chosen"])],
             "rejected": [_assistant(r["rejected"])]} for r in preference_pairs(64, seed=0)]
    policy = build_tiny_policy(tok, seed=0, hidden_size=32)
    rm = build_reward_model_from_policy_config(policy.config, policy, seed=0)
    reference = _chat_demos(16, seed=3)
    metrics = train_reward_model(rm, tok, rows, RMConfig(lr=3e-3, max_steps=4, batch_size=16, log_every=0),
                                 reference_rows=reference, seed=0)
    assert metrics["steps"] == 4 and metrics["n_train"] + metrics["n_heldout"] == 64
    assert all(loss == loss for loss in metrics["train_loss"])  # finite, not nan
    assert metrics["reward_std"] is not None and metrics["reward_std"] > 0


def test_sft_command_on_a_dataset_dict_of_messages(tmp_path, capsys):
    """`ppo-lm sft` reads the train split of a saved DatasetDict as data and its test split as eval_data."""
    model_dir = tmp_path / "policy"
    build_tiny_policy(tok_ := build_tokenizer(), seed=0, hidden_size=32).save_pretrained(model_dir)
    tok_.chat_template = TEMPLATE
    tok_.save_pretrained(model_dir)
    data = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(_chat_demos(24)),
                          "test": datasets.Dataset.from_list(_chat_demos(8, seed=1))}).save_to_disk(str(data))
    capsys.readouterr()
    argv = ["sft", "--model", str(model_dir), "--data", str(data), "--eval-data", str(data),
            "--output-dir", str(tmp_path / "out"), "--sft.max-steps", "2", "--sft.log-every", "0"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "24 rows (+8 held out)" in out
    assert main([*argv[:-4], "--output-dir", str(tmp_path / "out2"), "--split", "dev"]) == 2
    assert "`data`: " in (err := capsys.readouterr().err) and "has no split 'dev'; its splits: ['test', 'train']" in err


# -- errors ----------------------------------------------------------------------------------------


def test_message_data_needs_a_chat_template(tmp_path, capsys):
    plain = build_tokenizer()  # no chat template
    model = build_tiny_policy(plain, seed=0, hidden_size=32)
    message = ("sft data: the 'prompt' column holds chat messages but the tokenizer has no chat template; use a "
               "tokenizer with a chat template (chat_template in its tokenizer_config.json, or chat_template.jinja)")
    with pytest.raises(ChatTemplateError) as e:
        train_sft(model, plain, _chat_demos(8), SFTConfig(max_steps=1))
    assert str(e.value) == message
    rm = build_reward_model_from_policy_config(model.config, model)
    pairs = [{"chosen": [_user("q"), _assistant("a")], "rejected": [_user("q"), _assistant("b")]}]
    with pytest.raises(ChatTemplateError, match="^preference data: the 'prompt' column holds chat messages"):
        train_reward_model(rm, plain, pairs, RMConfig(max_steps=1))
    # the command: one line, before the built-in model is built
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _chat_demos(4)))
    assert main(["sft", "--data", str(path), "--output-dir", str(tmp_path / "o"), "--builtin-hidden-size", "32"]) == 2
    err = capsys.readouterr().err
    assert err == "ppo-lm: error: `data`: " + message.removeprefix("sft data: ") + "\n"


def test_a_failing_chat_template_is_one_line(tok):
    failing = build_tokenizer()
    failing.chat_template = "{{ raise_exception('roles must alternate') }}"
    model = build_tiny_policy(failing, seed=0, hidden_size=32)
    with pytest.raises(ChatTemplateError, match=r"^sft data: the chat template failed on the messages a list "
                                                r"\(\[\{'role': 'system'.*\): TemplateError: roles must alternate$"):
        train_sft(model, failing, _chat_demos(8), SFTConfig(max_steps=1))


@pytest.mark.parametrize("row,message", [
    ({"messages": [_user("q")]},
     "column 'messages' ends with a 'user' message; it must end with the assistant turn to train on"),
    ({"messages": [_assistant("a")]},
     "column 'messages' holds only an assistant message; it needs the prompt's messages before it"),
    ({"messages": "q"}, "column 'messages' holds a str ('q'), not a list of {'role': ..., 'content': ...} messages"),
    ({"prompt": [_user("q")], "response": [_assistant("a"), _assistant("b")]},
     "column 'response' holds a list ([{'role': 'assistant', 'content': 'a'}, {'role': 'assistant'…), not text or "
     "a list of one {'role': 'assistant', 'content': ...} message"),
    ({"prompt": [_user("q")], "response": [_user("a")]}, "column 'response' holds a list"),
    ({"prompt": [{"role": "user"}], "response": "a"},
     "has a list in column 'prompt', not text (or a list of {'role': ..., 'content': ...} chat messages)"),
    ({"completion": "a"}, "lacks column(s) ['prompt', 'response']; columns found: ['completion'] (or a 'messages' "
                          "column: a conversation ending with an assistant turn)"),
])
def test_sft_row_errors(row, message):
    with pytest.raises(InputError) as e:
        load_sft_rows([row], name="sft data")
    assert str(e.value).startswith("sft data: row 0 of in-memory rows") and message in str(e.value)


@pytest.mark.parametrize("row,message", [
    ({"chosen": [_user("q"), _assistant("a")], "rejected": [_user("r"), _assistant("b")]},
     "the 'chosen' and 'rejected' conversations differ before their last assistant turn, so neither is the "
     "prompt; give a 'prompt' column"),
    ({"prompt": "q", "chosen": [_user("a")], "rejected": "b"}, "column 'chosen' holds a list"),
    ({"chosen": "a", "rejected": "b"}, "lacks column(s) ['prompt']"),
])
def test_preference_row_errors(row, message):
    with pytest.raises(InputError) as e:
        load_preference_rows([row], name="preference data")
    assert str(e.value).startswith("preference data: row 0 of in-memory rows") and message in str(e.value)
