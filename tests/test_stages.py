"""Data loading, SFT and reward-model stages on the built-in task with tiny models."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from ppo_lm.data import encode_prompt_response, last_token_index, load_rows, pad_sequences, split_rows
from ppo_lm.stages import (
    RMConfig,
    SFTConfig,
    build_reward_model_from_policy_config,
    build_sft_example,
    collate_sft,
    score_sequences,
    score_texts,
    sft_loss,
    train_reward_model,
    train_sft,
)
from ppo_lm.stages.rm import MEAN_KEY, STD_KEY
from ppo_lm.tasks import build_tiny_policy, build_tokenizer, preference_pairs, sft_demonstrations


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


ROWS = [{"prompt": "Solve x+1=3\n", "response": "x=2"}, {"prompt": "Solve 2x=8\n", "response": "x=4"}]


# -- data loading ------------------------------------------------------------------------------


def test_load_rows_from_list_jsonl_parquet_and_saved_dataset(tmp_path):
    import datasets

    assert load_rows(ROWS, ["prompt", "response"]) == ROWS

    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n\n")
    assert load_rows(jsonl, ["prompt"]) == ROWS
    assert load_rows(str(jsonl), ["prompt"]) == ROWS

    ds = datasets.Dataset.from_list(ROWS)
    ds.to_parquet(str(tmp_path / "rows.parquet"))
    assert load_rows(tmp_path / "rows.parquet", ["prompt", "response"]) == ROWS

    ds.save_to_disk(str(tmp_path / "saved"))
    assert load_rows(tmp_path / "saved", ["prompt", "response"]) == ROWS
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "saved_dict"))
    assert load_rows(tmp_path / "saved_dict", ["prompt"]) == ROWS


def test_load_rows_errors(tmp_path):
    with pytest.raises(ValueError, match="no such file.*missing.jsonl"):
        load_rows(tmp_path / "missing.jsonl")
    (tmp_path / "rows.txt").write_text("prompt\nhi\n")
    with pytest.raises(ValueError, match=r"unknown extension '\.txt'"):
        load_rows(tmp_path / "rows.txt")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="empty.jsonl is empty"):
        load_rows(tmp_path / "empty.jsonl")
    with pytest.raises(ValueError, match="empty"):
        load_rows([])
    with pytest.raises(
        ValueError, match=r"lacks column\(s\) \['chosen'\].*columns found: \['prompt', 'response'\]"
    ):
        load_rows(ROWS, ["prompt", "chosen"])
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_rows(tmp_path / "bad.jsonl")
    (tmp_path / "plain_dir").mkdir()
    with pytest.raises(ValueError, match="save_to_disk"):
        load_rows(tmp_path / "plain_dir")


def test_split_rows_is_deterministic_and_disjoint():
    rows = [{"i": i} for i in range(50)]
    train, held = split_rows(rows, 0.2, seed=0)
    assert len(held) == 10 and len(train) == 40
    assert sorted(r["i"] for r in train + held) == list(range(50))
    assert split_rows(rows, 0.2, seed=0) == (train, held)
    assert split_rows(rows, 0.0, seed=0)[1] == []


# -- tokenisation helpers ----------------------------------------------------------------------


def test_pad_and_last_token_index():
    ids, mask = pad_sequences([[5, 6, 7], [8]], pad_id=0, side="right")
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert last_token_index(mask).tolist() == [2, 0]
    ids, mask = pad_sequences([[5, 6, 7], [8]], pad_id=0, side="left")
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert last_token_index(mask).tolist() == [2, 2]
    with pytest.raises(ValueError):
        last_token_index(torch.tensor([[0, 0]]))


def test_encode_prompt_response_appends_one_eos(tok):
    p, r = encode_prompt_response(tok, "Solve x=1\n", "x=1")
    assert tok.decode(p) == "Solve x=1\n"
    assert r[-1] == tok.eos_token_id and tok.decode(r[:-1]) == "x=1"
    assert encode_prompt_response(tok, "Solve x=1\n", "x=1<eos>") == (p, r)


# -- SFT ---------------------------------------------------------------------------------------


def test_sft_labels_mask_the_prompt(tok):
    ids, labels = build_sft_example(tok, "Solve 2x+3=11\n", "x=4")
    n_prompt = len("Solve 2x+3=11\n")
    assert labels[:n_prompt] == [-100] * n_prompt
    assert labels[n_prompt:] == ids[n_prompt:] == tok("x=4")["input_ids"] + [tok.eos_token_id]


def test_sft_loss_counts_response_tokens_only(tok):
    model = build_tiny_policy(tok, seed=0, hidden_size=32).eval()
    examples = [build_sft_example(tok, r["prompt"], r["response"]) for r in ROWS]
    batch = collate_sft(examples, tok.pad_token_id)
    loss, n = sft_loss(model, batch)
    assert n == sum(len(r["response"]) + 1 for r in ROWS)
    # Manual token-mean NLL over response positions, each row on its own (no padding involved).
    total = 0.0
    for ids, labels in examples:
        with torch.no_grad():
            logp = model(input_ids=torch.tensor([ids])).logits[0].log_softmax(-1)
        total += sum(-float(logp[t - 1, labels[t]]) for t in range(len(ids)) if labels[t] != -100)
    assert loss.item() == pytest.approx(total / n, rel=1e-4)
    # Changing prompt tokens' label slots cannot matter: they are ignored.
    assert (batch["labels"][batch["attention_mask"] == 0] == -100).all()


def test_train_sft_reduces_heldout_loss_and_saves(tok, tmp_path):
    torch.manual_seed(0)
    model = build_tiny_policy(tok, seed=0, hidden_size=64)
    rows = sft_demonstrations(600, seed=0, error_rate=0.3)
    logs = []
    cfg = SFTConfig(lr=3e-3, epochs=3, batch_size=32, heldout_fraction=0.1, log_every=10)
    metrics = train_sft(model, tok, rows, cfg, output_dir=tmp_path / "sft", log_fn=logs.append, seed=0)
    assert metrics["heldout_loss_after"] < 0.5 * metrics["heldout_loss_before"]
    assert sum(metrics["train_loss"][-5:]) / 5 < 0.5 * sum(metrics["train_loss"][:5]) / 5
    assert metrics["n_train"] == 540 and metrics["n_heldout"] == 60
    assert len(metrics["train_loss"]) == metrics["steps"] == 3 * 17
    assert logs and logs[-1]["step"] == metrics["steps"]
    assert model.training  # mode restored: from_config leaves it in train mode

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "sft")
    loaded_tok = AutoTokenizer.from_pretrained(tmp_path / "sft")
    assert loaded_tok.pad_token_id == tok.pad_token_id
    for (name, p), q in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(p, q), name
    assert json.loads((tmp_path / "sft" / "sft_metrics.json").read_text())["steps"] == metrics["steps"]


def test_train_sft_is_deterministic(tok):
    rows = sft_demonstrations(64, seed=0)
    cfg = SFTConfig(lr=1e-3, max_steps=4, batch_size=16, log_every=0)
    runs = [
        train_sft(build_tiny_policy(tok, seed=0, hidden_size=32), tok, rows, cfg, seed=5)["train_loss"]
        for _ in range(2)
    ]
    assert runs[0] == runs[1] and len(runs[0]) == 4


def test_train_sft_errors(tok):
    model = build_tiny_policy(tok, seed=0, hidden_size=32)
    with pytest.raises(ValueError, match="lacks column"):
        train_sft(model, tok, [{"prompt": "a", "completion": "b"}], SFTConfig(max_steps=1))
    with pytest.raises(ValueError, match="max_length"):
        train_sft(model, tok, ROWS, SFTConfig(max_steps=1, max_length=4))


# -- reward model ------------------------------------------------------------------------------


def _tiny_rm(tok, seed=0, hidden_size=64):
    policy = build_tiny_policy(tok, seed=seed, hidden_size=hidden_size)
    return policy, build_reward_model_from_policy_config(policy.config, policy, seed=seed)


def test_build_reward_model_copies_body(tok):
    policy, rm = _tiny_rm(tok, hidden_size=32)
    assert rm.config.num_labels == 1 and rm.config.pad_token_id == tok.pad_token_id
    body = policy.base_model.state_dict()
    for k, v in rm.base_model.state_dict().items():
        assert torch.equal(v, body[k]), k
    fresh = build_reward_model_from_policy_config(policy.config)
    assert fresh.config.num_labels == 1


def test_score_is_read_at_last_token_under_left_and_right_padding(tok):
    _, rm = _tiny_rm(tok, hidden_size=32)
    rm.eval()
    seqs = [tok("Solve x+1=3\nx=2")["input_ids"] + [1], tok("Solve 2x=8\nx=44")["input_ids"] + [1], [5, 6]]
    with torch.no_grad():
        right = score_sequences(rm, *pad_sequences(seqs, tok.pad_token_id, side="right"))
        left = score_sequences(rm, *pad_sequences(seqs, tok.pad_token_id, side="left"))
        # Padding with EOS instead of a distinct pad id: the mask, not the ids, decides.
        eos_pad = score_sequences(rm, *pad_sequences(seqs, tok.eos_token_id, side="right"))
        alone = torch.cat(
            [score_sequences(rm, torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long)) for s in seqs]
        )
    assert right.shape == (3,) and right.dtype == torch.float32
    torch.testing.assert_close(left, right, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(eos_pad, right, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(alone, right, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="score"):
        score_sequences(build_tiny_policy(tok, hidden_size=32), torch.tensor([[5]]), torch.tensor([[1]]))


def test_train_reward_model_beats_chance_and_normalizes(tok, tmp_path):
    torch.manual_seed(0)
    _, rm = _tiny_rm(tok, seed=0, hidden_size=64)
    train = preference_pairs(1000, seed=0)
    held = preference_pairs(300, seed=1, split="heldout")
    cfg = RMConfig(lr=3e-3, epochs=4, batch_size=32, log_every=0)
    metrics = train_reward_model(rm, tok, train, cfg, output_dir=tmp_path / "rm", eval_rows=held, seed=0)
    assert metrics["n_heldout"] == 300
    assert metrics["heldout_accuracy_after"] > 0.6
    assert metrics["heldout_loss_after"] < metrics["heldout_loss_before"]

    # Normalised scores on the reference set (both sides of the training pairs) are standardised.
    prompts = [r["prompt"] for r in train] * 2
    responses = [r["chosen"] for r in train] + [r["rejected"] for r in train]
    s = score_texts(rm, tok, prompts, responses)
    assert float(s.mean()) == pytest.approx(0.0, abs=1e-3)
    assert float(s.std()) == pytest.approx(1.0, abs=1e-3)
    raw = score_texts(rm, tok, prompts[:8], responses[:8], normalize=False)
    torch.testing.assert_close(s[:8], (raw - metrics["reward_mean"]) / metrics["reward_std"])

    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm")
    assert getattr(loaded.config, MEAN_KEY) == pytest.approx(metrics["reward_mean"])
    assert getattr(loaded.config, STD_KEY) == pytest.approx(metrics["reward_std"])
    torch.testing.assert_close(score_texts(loaded, tok, prompts[:8], responses[:8]), s[:8])


def test_train_reward_model_without_normalization_and_split(tok):
    _, rm = _tiny_rm(tok, hidden_size=32)
    setattr(rm.config, MEAN_KEY, 5.0)  # stale values from an earlier run must not survive
    setattr(rm.config, STD_KEY, 2.0)
    rows = preference_pairs(40, seed=0)
    metrics = train_reward_model(
        rm, tok, rows, RMConfig(max_steps=2, batch_size=8, normalize=False, log_every=0)
    )
    assert metrics["n_heldout"] == 4 and metrics["n_train"] == 36
    assert metrics["reward_mean"] is None and not hasattr(rm.config, MEAN_KEY)
    with pytest.raises(ValueError, match="rejected"):
        train_reward_model(rm, tok, [{"prompt": "p", "chosen": "a"}], RMConfig(max_steps=1))


def test_optimizer_step_refuses_a_nonfinite_gradient_before_stepping():
    from ppo_lm.stages._common import optimizer_step

    model = torch.nn.Linear(3, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    before = [p.detach().clone() for p in model.parameters()]
    out = model(torch.ones(1, 3)).sum()
    loss = out * 0 + (out * 0).abs().sqrt()  # value 0, gradient 0 · sqrt'(0) = NaN
    with pytest.raises(FloatingPointError, match="SFT gradient norm became nan at step 7"):
        optimizer_step(model, opt, sched, loss, 1.0, what="SFT", step=7)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    # without clipping the norm is still computed and returned (and checked)
    norm = optimizer_step(model, opt, sched, model(torch.ones(1, 3)).sum(), None, what="SFT", step=8)
    assert norm == pytest.approx(2.0)  # d/dw of w·1 + b: three ones and a one → √4


@pytest.mark.parametrize("argv,message", [
    (["sft", "--data", "/nonexistent/x.jsonl"], "no such file"),
    (["sft", "--sft.batch-size", "0"], "`sft.batch_size` must be >= 1, got 0"),
    (["rm", "--data", "PAIRS"], "lacks column"),
])
def test_stage_commands_report_bad_input_without_a_traceback(tmp_path, capsys, argv, message):
    from ppo_lm.cli.main import main

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "1+1=", "good": "2"}) + "\n")
    argv = [str(pairs) if a == "PAIRS" else a for a in argv]
    assert main([*argv, "--output-dir", str(tmp_path / "out"), "--builtin-hidden-size", "32"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_non_text_cells_are_named():
    from ppo_lm.data.rows import InputError, load_rows

    with pytest.raises(InputError, match="row 1 of in-memory rows has a int in column 'response', not text"):
        load_rows([{"prompt": "a", "response": "b"}, {"prompt": "a", "response": 1}], ("prompt", "response"))
    with pytest.raises(InputError, match="NoneType in column 'prompt'"):
        load_rows([{"prompt": None, "response": "b"}], ("prompt", "response"))


def test_split_rows_keeps_a_prompts_rows_together():
    """Repeated prompts (the built-in demonstrations draw with replacement) must not straddle the split."""
    rows = [{"prompt": f"p{i % 30}", "response": str(i)} for i in range(120)]
    train, held = split_rows(rows, 0.2, seed=1)
    assert {r["prompt"] for r in train}.isdisjoint({r["prompt"] for r in held})
    assert 20 <= len(held) <= 28 and len(train) + len(held) == 120


def test_stage_commands_seed_the_whole_run(monkeypatch, tmp_path):
    """`ppo-lm sft --seed S` / `rm --seed S` also seed the held-out split and batch order: one seed,
    the top-level one (default 0), reaches the stage."""
    import ppo_lm.stages.rm as rm_mod
    import ppo_lm.stages.sft as sft_mod
    from ppo_lm.cli.stages import RMCommand, SFTCommand, run_rm, run_sft

    seen = {}
    monkeypatch.setattr(sft_mod, "train_sft", lambda m, t, rows, cfg, seed, **k: (
        seen.setdefault("sft", seed), {"heldout_loss_before": 0.0, "heldout_loss_after": 0.0})[1])
    monkeypatch.setattr(rm_mod, "train_reward_model", lambda m, t, rows, cfg, seed, **k: (
        seen.setdefault("rm", seed), {"heldout_accuracy_before": 0.0, "heldout_accuracy_after": 0.0})[1])
    run_sft(SFTCommand(output_dir=str(tmp_path / "s"), seed=7, builtin_demos=8, builtin_hidden_size=32))
    run_rm(RMCommand(output_dir=str(tmp_path / "r"), seed=7, builtin_pairs=8, builtin_hidden_size=32))
    assert seen == {"sft": 7, "rm": 7}
    seen.clear()
    run_sft(SFTCommand(output_dir=str(tmp_path / "s2"), builtin_demos=8, builtin_hidden_size=32))
    assert seen == {"sft": 0}
    assert not hasattr(SFTConfig(), "seed") and not hasattr(RMConfig(), "seed")


def test_split_rows_does_not_overshoot_with_a_big_group():
    rows = [{"prompt": "same", "response": str(i)} for i in range(90)] + [{"prompt": f"p{i}", "response": "r"}
                                                                         for i in range(10)]
    for seed in range(6):
        train, held = split_rows(rows, 0.1, seed=seed)
        assert 1 <= len(held) <= 10 and len(train) + len(held) == 100
    one = [{"prompt": "same", "response": str(i)} for i in range(50)]
    assert len(split_rows(one, 0.2, seed=0)[1]) == 10  # a single prompt: rows are held out alone


def test_split_rows_holds_out_the_smaller_group_when_none_fits():
    rows = [{"prompt": "a", "response": str(i)} for i in range(60)] + [{"prompt": "b", "response": str(i)}
                                                                      for i in range(40)]
    for seed in range(4):
        train, held = split_rows(rows, 0.1, seed=seed)
        assert len(held) == 40 and {r["prompt"] for r in held} == {"b"}
