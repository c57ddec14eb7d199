"""The built-in linear-equation task: tokenizer, data generation, verifier, tiny models."""

import re

import pytest
import torch
from transformers import AutoTokenizer

from ppo_lm.tasks import (
    EquationTaskConfig,
    build_tiny_policy,
    build_tokenizer,
    format_equation,
    make_prompts,
    parse_equation,
    preference_pairs,
    sft_demonstrations,
    solve_equation,
    tiny_model_config,
    verify,
)

WELL_FORMED = re.compile(r"^x=-?\d+$")


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


# -- tokenizer ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["Solve 2x+3=11\nx=4", "Solve x-7=-3\n", "  two  spaces\n\nand lines ", "x=-10", ""]
)
def test_tokenizer_round_trips_one_token_per_char(tok, text):
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text)  # no BOS/EOS added, nothing merged
    assert tok.decode(ids) == text


def test_tokenizer_specials(tok):
    assert tok.pad_token_id is not None and tok.eos_token_id is not None
    assert tok.pad_token_id != tok.eos_token_id
    assert tok.padding_side == "left"
    ids = tok("x=4")["input_ids"] + [tok.eos_token_id]
    assert tok.decode(ids, skip_special_tokens=True) == "x=4"
    assert tok.decode(ids) == "x=4<eos>"
    assert tok("é")["input_ids"] == [tok.unk_token_id]


def test_tokenizer_left_pads_batches(tok):
    batch = tok(["ab", "abcd"], padding=True, return_tensors="pt")
    assert batch["input_ids"][0, :2].tolist() == [tok.pad_token_id] * 2
    assert batch["attention_mask"].tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]


def test_tokenizer_save_load_round_trip(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "Solve 3x-4=-10\nx=-2"
    assert loaded(text)["input_ids"] == tok(text)["input_ids"]
    assert loaded.decode(loaded(text)["input_ids"]) == text
    assert (loaded.pad_token_id, loaded.eos_token_id, loaded.bos_token_id, loaded.unk_token_id) == (
        tok.pad_token_id,
        tok.eos_token_id,
        tok.bos_token_id,
        tok.unk_token_id,
    )
    assert loaded.padding_side == "left"
    assert len(loaded) == len(tok)


# -- equations and prompts ---------------------------------------------------------------------


def test_format_and_parse_equation():
    assert format_equation(2, 3, 11) == "2x+3=11"
    assert format_equation(1, 0, 5) == "x=5"
    assert format_equation(3, -4, -10) == "3x-4=-10"
    for a, b, c in [(2, 3, 11), (1, 0, 5), (3, -4, -10), (1, -1, 0)]:
        assert parse_equation(f"Solve {format_equation(a, b, c)}\n") == (a, b, c)
    assert solve_equation("Solve 2x+3=11\n") == "4"
    assert solve_equation("Solve 2x=3\n") is None
    with pytest.raises(ValueError, match="no linear equation"):
        parse_equation("What is 2+2?")


def test_make_prompts_deterministic_and_correct():
    cfg = EquationTaskConfig()
    a, b = make_prompts(50, seed=3, cfg=cfg), make_prompts(50, seed=3, cfg=cfg)
    assert a == b
    assert make_prompts(50, seed=4, cfg=cfg) != a
    for row in a:
        assert set(row) == {"prompt", "answer"}
        assert row["prompt"].startswith("Solve ") and row["prompt"].endswith("\n")
        assert solve_equation(row["prompt"]) == row["answer"]
        ca, cb, _ = parse_equation(row["prompt"])
        assert 1 <= ca <= cfg.max_coef and abs(cb) <= cfg.max_bias
        assert abs(int(row["answer"])) <= cfg.max_solution


def test_train_and_heldout_are_disjoint():
    train = {r["prompt"] for r in make_prompts(3000, seed=0)}
    held = {r["prompt"] for r in make_prompts(1000, seed=0, split="heldout")}
    assert held and train and not (train & held)
    pairs = {r["prompt"] for r in preference_pairs(500, seed=1)}
    demos = {r["prompt"] for r in sft_demonstrations(500, seed=1)}
    assert not (pairs & held) and not (demos & held)


def test_unique_prompts_and_impossible_request():
    cfg = EquationTaskConfig(max_coef=2, max_solution=3, max_bias=2)
    rows = make_prompts(10, seed=0, cfg=cfg, split="heldout", unique=True)
    assert len({r["prompt"] for r in rows}) == 10
    with pytest.raises(ValueError, match="could only draw"):
        make_prompts(1000, seed=0, cfg=cfg, unique=True)  # only 2*7*5 = 70 equations exist


def test_non_negative_config():
    cfg = EquationTaskConfig(allow_negative=False)
    for row in make_prompts(200, seed=0, cfg=cfg):
        assert int(row["answer"]) >= 0 and "-" not in row["prompt"]


def test_config_validation():
    with pytest.raises(ValueError):
        EquationTaskConfig(max_coef=0)
    with pytest.raises(ValueError):
        EquationTaskConfig(heldout_fraction=0.0)
    with pytest.raises(ValueError, match="split"):
        make_prompts(1, split="test")


# -- verifier ----------------------------------------------------------------------------------


def test_verify_correct_incorrect_and_malformed():
    p = "Solve 2x+3=11\n"
    responses = ["x=4", " x=4\n", "x=5", "x=-4", "x = 4", "4", "x=04", "x=4x", "x=4 x=4", "", "x="]
    assert verify([p] * len(responses), responses) == [1.0, 1.0] + [0.0] * (len(responses) - 2)


def test_verify_uses_answer_column_and_ignores_extra_columns():
    prompts = ["Solve 2x+3=11\n", "Solve x-1=-5\n"]
    assert verify(prompts, ["x=4", "x=-4"], answer=["4", "-4"], split=["a", "b"]) == [1.0, 1.0]
    assert verify(prompts, ["x=4", "x=-4"], answer=[4, -4]) == [1.0, 1.0]
    # The column wins over the prompt: a dataset's answer is the ground truth.
    assert verify(prompts, ["x=4", "x=-4"], answer=["5", "-4"]) == [0.0, 1.0]
    assert verify(["Solve 2x=3\n"], ["x=1"]) == [0.0]  # no integer solution
    with pytest.raises(ValueError):
        verify(prompts, ["x=4"])
    with pytest.raises(ValueError):
        verify(prompts, ["x=4", "x=-4"], answer=["4"])


def test_verify_agrees_with_generated_answers():
    rows = make_prompts(300, seed=7)
    prompts = [r["prompt"] for r in rows]
    right = [f"x={r['answer']}" for r in rows]
    assert verify(prompts, right) == [1.0] * len(rows)
    assert verify(prompts, right, answer=[r["answer"] for r in rows]) == [1.0] * len(rows)


def test_sft_demonstrations_error_rate():
    rows = sft_demonstrations(2000, seed=0, error_rate=0.3)
    scores = verify([r["prompt"] for r in rows], [r["response"] for r in rows])
    assert [s == 1.0 for s in scores] == [r["correct"] for r in rows]
    assert 0.26 < 1 - sum(scores) / len(scores) < 0.34
    assert all(WELL_FORMED.match(r["response"]) for r in rows)
    assert all(r["correct"] for r in sft_demonstrations(200, seed=0, error_rate=0.0))
    assert not any(r["correct"] for r in sft_demonstrations(200, seed=0, error_rate=1.0))
    assert sft_demonstrations(50, seed=2) == sft_demonstrations(50, seed=2)


def test_preference_pairs_correct_over_incorrect():
    rows = preference_pairs(500, seed=0)
    prompts = [r["prompt"] for r in rows]
    assert verify(prompts, [r["chosen"] for r in rows]) == [1.0] * len(rows)
    assert verify(prompts, [r["rejected"] for r in rows]) == [0.0] * len(rows)
    assert all(WELL_FORMED.match(r["rejected"]) for r in rows)


# -- tiny models -------------------------------------------------------------------------------


def test_tiny_model_config_matches_tokenizer(tok):
    cfg = tiny_model_config(tok, hidden_size=32, num_layers=2, num_heads=4)
    assert cfg.vocab_size == len(tok)
    assert (cfg.pad_token_id, cfg.eos_token_id, cfg.bos_token_id) == (
        tok.pad_token_id,
        tok.eos_token_id,
        tok.bos_token_id,
    )
    assert cfg.intermediate_size == 128 and not cfg.tie_word_embeddings
    with pytest.raises(ValueError):
        tiny_model_config(tok, hidden_size=30, num_heads=4)


def test_build_tiny_policy_is_seeded_and_generates(tok):
    torch.manual_seed(123)
    before = torch.rand(1)
    a = build_tiny_policy(tok, seed=1, hidden_size=32)
    b = build_tiny_policy(tok, seed=1, hidden_size=32)
    c = build_tiny_policy(tok, seed=2, hidden_size=32)
    torch.manual_seed(123)
    assert torch.equal(before, torch.rand(1))  # the global RNG was not consumed
    assert a.dtype == torch.float32
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    assert any(not torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters()))

    batch = tok(["Solve 2x+3=11\n", "Solve x=5\n"], padding=True, return_tensors="pt")
    a.eval()
    out = a.generate(
        **batch,
        max_new_tokens=5,
        do_sample=False,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    assert out.shape[0] == 2 and out.shape[1] <= batch["input_ids"].shape[1] + 5


@pytest.mark.parametrize("prompt", ["Solve 2x+3=11+1", "Solve 2x+3=11.5", "Solve 2x+3=11x", "Solve 2x+3=11=9",
                                    "Solve 2x+3=-1-4", "Solve 2x+3=11 * 2"])
def test_a_right_hand_side_that_goes_on_is_not_an_equation(prompt):
    """The verifier must not score x=4 correct for 2x+3 = 11+1: such prompts fail loudly."""
    with pytest.raises(ValueError, match="no linear equation"):
        parse_equation(prompt)


@pytest.mark.parametrize("prompt", ["Solve 2x+3=11\n", "Solve 2x+3=11.", "Solve 2x+3=11 for x", "Solve 2x + 3 = 11",
                                    "Solve 2x+3=11\n- answer as x=N", "Solve 2x+3=11\n(answer with x=N)"])
def test_an_equation_may_be_followed_by_words(prompt):
    assert parse_equation(prompt) == (2, 3, 11)
