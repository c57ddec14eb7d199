"""`ppo-lm export`: a run's policy as a directory that plain transformers loads, giving the trained
model's logits; one-line errors for what cannot be exported."""

from __future__ import annotations

import pytest
import torch
from trainer_helpers import length_reward, tiny_config

from ppo_lm.cli.main import main
from ppo_lm.trainer.checkpoint.folders import list_checkpoints
from ppo_lm.trainer.ppo import PPOTrainer


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("export") / "run"
    tr = PPOTrainer(tiny_config(run, iterations=2, log__save_every=1, log__keep_last=2), verifier=length_reward)
    tr.train()
    return run, tr


def test_export_loads_with_plain_transformers_and_gives_the_trained_logits(tmp_path, trained, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run, tr = trained
    assert main(["export", str(run), "--output", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "out")
    lm = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    tok = AutoTokenizer.from_pretrained(tmp_path / "out")
    ids = tok(["Solve 2x+3=11\n", "Solve x-1=4\n"], return_tensors="pt", padding=True)
    with torch.no_grad():
        ours = tr.models.policy.lm(**ids).logits
        theirs = lm(**ids).logits
    assert float((ours - theirs).abs().max()) <= 1e-5
    assert tok.decode(tok("x = 4\n")["input_ids"]) == "x = 4\n"


def test_export_an_earlier_iteration_and_errors(tmp_path, trained, capsys):
    run, _ = trained
    assert main(["export", str(run), "--output", str(tmp_path / "it1"), "--iteration", "1"]) == 0
    first = dict(list_checkpoints(run))[1] / "policy" / "model.safetensors"
    assert (tmp_path / "it1" / "model.safetensors").read_bytes() == first.read_bytes()
    capsys.readouterr()
    cases = [
        (["export", str(tmp_path / "none"), "--output", str(tmp_path / "o")], "does not exist"),
        (["export", str(run), "--output", str(tmp_path / "it1")], "exists and is not empty; pass --overwrite"),
        (["export", str(run), "--output", str(tmp_path / "o"), "--iteration", "7"], "has checkpoints of iterations [1, 2]"),
        (["export", str(run)], "the following arguments are required: --output"),
    ]
    for argv, message in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("ppo-lm: error: ") and message in err and "Traceback" not in err
    assert main(["export", str(run), "--output", str(tmp_path / "it1"), "--overwrite"]) == 0
    assert (tmp_path / "it1" / "model.safetensors").read_bytes() != first.read_bytes()  # now iteration 2
