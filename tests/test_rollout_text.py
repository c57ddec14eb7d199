"""Prompts in and responses out of a rollout: the same prompt encoding as SFT/RM, and the verifier
sees a response without the stop token that ended it."""

from __future__ import annotations

from tokenizers.processors import TemplateProcessing

from ppo_lm.data.examples import encode_prompt_response
from ppo_lm.data.prompts import encode_prompts
from ppo_lm.rollout.score.reward import response_texts
from ppo_lm.rollout.trajectory import Trajectory
from ppo_lm.tasks.equations import build_tokenizer


def test_the_stop_token_is_not_in_the_scored_text():
    tok = build_tokenizer()
    dot = tok.convert_tokens_to_ids(".")
    x4 = tok.convert_tokens_to_ids(list("x=4"))
    rows = [x4 + [dot], x4 + [tok.eos_token_id], x4 + [dot]]
    trajs = [Trajectory([1], tokens=ids, terminated=stopped)  # the last one ran out of tokens on a "."
             for ids, stopped in zip(rows, [True, True, False])]
    assert response_texts(tok, trajs) == ["x=4", "x=4", "x=4."]


def test_prompts_carry_the_tokenizers_special_tokens_as_in_sft():
    tok = build_tokenizer()
    tok.backend_tokenizer.post_processor = TemplateProcessing(single="<bos> $A",
                                                              special_tokens=[("<bos>", tok.bos_token_id)])
    prompts = ["Solve 2x+3=11\n", "Solve x=1\n"]
    ids, mask = encode_prompts(tok, prompts)
    for row, m, p in zip(ids, mask, prompts):
        expected, _ = encode_prompt_response(tok, p, "x=4")
        assert row[m.bool()].tolist() == expected
        assert expected[0] == tok.bos_token_id
    assert mask[1, 0] == 0  # left-padded
