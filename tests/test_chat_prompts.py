"""Prompts as chat messages: rendered with the tokenizer's chat template (or a Jinja file), encoded
without a second set of special tokens; responses end at every end-of-turn id of the policy's
generation config."""

from __future__ import annotations

import json

import pytest
from trainer_helpers import tiny_config

from ppo_lm.runtime.errors import ConfigError
from ppo_lm.tasks.equations import build_tiny_policy, build_tokenizer
from ppo_lm.trainer.ppo import PPOTrainer

TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}{{ bos_token }}assistant: {% endif %}")


def _chat_rows(n=8):
    return [{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Solve x+{i}=9"}],
             "answer": str(9 - i)} for i in range(n)]


def _capture():
    seen = {}

    def verifier(prompts, responses, **columns):
        seen.setdefault("prompts", []).extend(prompts)
        seen.setdefault("answer", []).extend(columns["answer"])
        return [0.0] * len(prompts)

    return seen, verifier


def test_messages_are_rendered_with_the_chat_template(tmp_path):
    f = tmp_path / "chat.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in _chat_rows()))
    tok = build_tokenizer()
    tok.chat_template = TEMPLATE
    seen, verifier = _capture()
    tr = PPOTrainer(tiny_config(tmp_path / "run", data__prompts=str(f)), tokenizer=tok, verifier=verifier)
    assert tr.sampler.prompts.chat
    batch = tr.rollout(1)
    expected = {f"system: Be brief.\nuser: Solve x+{i}=9\n<bos>assistant: " for i in range(8)}
    assert set(seen["prompts"]) == expected and len(seen["answer"]) == 8
    # the template's own <bos> is there once: the prompt is encoded without adding special tokens
    row = batch.input_ids[0, : batch.prompt_width][batch.attention_mask[0, : batch.prompt_width].bool()]
    assert row.tolist() == tok(batch.prompts[0], add_special_tokens=False)["input_ids"]
    assert row.tolist().count(tok.bos_token_id) == 1


def test_a_jinja_file_replaces_the_tokenizers_template(tmp_path):
    (tmp_path / "t.jinja").write_text("{% for m in messages %}{{ m['content'] }};{% endfor %}")
    seen, verifier = _capture()
    cfg = tiny_config(tmp_path / "run", data__chat_template=str(tmp_path / "t.jinja"))
    tr = PPOTrainer(cfg, prompt_rows=_chat_rows(), verifier=verifier)
    tr.rollout(1)
    assert set(seen["prompts"]) == {f"Be brief.;Solve x+{i}=9;" for i in range(8)}


def test_chat_errors(tmp_path):
    with pytest.raises(ConfigError, match="the tokenizer has no chat template.*data.chat_template"):
        PPOTrainer(tiny_config(tmp_path / "a"), prompt_rows=_chat_rows(), verifier=lambda p, r, **c: [0.0] * len(p))
    with pytest.raises(ConfigError, match="`data.chat_template` is 'none'"):
        PPOTrainer(tiny_config(tmp_path / "b", data__chat_template="none"), prompt_rows=_chat_rows(),
                   verifier=lambda p, r, **c: [0.0] * len(p))
    with pytest.raises(ConfigError, match="`data.chat_template` .* is not a file"):
        PPOTrainer(tiny_config(tmp_path / "c", data__chat_template=str(tmp_path / "nope.jinja")))
    mixed = _chat_rows(4) + [{"prompt": "Solve x+1=9", "answer": "8"}]
    with pytest.raises(ConfigError, match="rows 0 and 4 hold different kinds"):
        PPOTrainer(tiny_config(tmp_path / "d"), prompt_rows=mixed, verifier=lambda p, r, **c: [0.0] * len(p))
    bad = [{"prompt": [{"role": "user"}], "answer": "1"}]
    with pytest.raises(ConfigError, match="non-text `prompt` .*messages"):
        PPOTrainer(tiny_config(tmp_path / "e"), prompt_rows=bad, verifier=lambda p, r, **c: [0.0] * len(p))


def test_every_end_of_turn_id_of_the_generation_config_stops_a_response(tmp_path):
    tok = build_tokenizer()
    seven = tok.convert_tokens_to_ids("7")
    lm = build_tiny_policy(tok, seed=0, hidden_size=32)
    lm.generation_config.eos_token_id = [tok.eos_token_id, seven]
    seen, verifier = _capture()
    cfg = tiny_config(tmp_path / "run", rollout__max_new_tokens=12, rollout__temperature=3.0)
    tr = PPOTrainer(cfg, policy=lm, tokenizer=tok, verifier=lambda p, r, **c: [float("7" in x) for x in r])
    assert set(tr.sampler.sampling.stop_token_ids) == {tok.eos_token_id, seven}
    for it in range(1, 4):
        b = tr.rollout(it)
        ended_on_seven = [bool(t) and int(ids[m][-1]) == seven for ids, m, t in
                          zip(b.input_ids[:, b.prompt_width:], b.response_mask, b.terminated)]
        assert all("7" not in r for r in b.responses)  # the stop token is not part of the scored text
        if any(ended_on_seven):
            return
    pytest.fail("no response ended with the extra end-of-turn token in 3 iterations")


def test_stop_tokens_given_as_text(tmp_path):
    """A newline or a space is one token of the vocabulary even where it is stored as 'Ċ' / 'Ġ'."""
    tok = build_tokenizer()
    tr = PPOTrainer(tiny_config(tmp_path / "run", rollout__stop_tokens=["\n", " "]), tokenizer=tok,
                    verifier=lambda p, r, **c: [0.0] * len(p))
    newline, space = (tok.encode(s, add_special_tokens=False) for s in ("\n", " "))
    assert len(newline) == len(space) == 1 and tok.decode(newline + space) == "\n "
    assert set(tr.sampler.sampling.stop_token_ids) == {tok.eos_token_id, newline[0], space[0]}
    with pytest.raises(ConfigError, match="'ab' is not a single token"):
        PPOTrainer(tiny_config(tmp_path / "r2", rollout__stop_tokens=["ab"]), verifier=lambda p, r, **c: [0.0] * len(p))
