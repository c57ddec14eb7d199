"""LoRA through peft (docs/lora.md): the reference is the policy with its adapters off, only adapters (and
value heads) train, checkpoints hold peft-loadable adapters, resume is bit-exact, export merges."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from trainer_helpers import count_sevens, length_reward, other_weights, tiny_config

from ppo_lm.cli.main import main
from ppo_lm.models import lora
from ppo_lm.models.actor_critic import AdaptersOff, PolicyModel
from ppo_lm.records.metrics_log import is_timing_key
from ppo_lm.runtime.errors import ConfigError
from ppo_lm.tasks.equations import build_tiny_policy, build_tokenizer
from ppo_lm.trainer.checkpoint.folders import latest_checkpoint
from ppo_lm.trainer.ppo import PPOTrainer


def _lora_config(path, **kw):
    kw.setdefault("model__lora_r", 4)
    return tiny_config(path, **kw)


def _batch(vocab: int, B: int = 5, P: int = 6, T: int = 7, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (B, P + T), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # a left-padded prompt
    mask[2, P + 4:] = 0  # a short response
    return ids, mask, P


def _randomise_adapters(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if lora.is_adapter_key(name):
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)


@pytest.mark.parametrize("head", [False, True])
def test_adapters_off_give_the_base_models_log_probs_and_on_differ(head):
    tok = build_tokenizer()
    base = build_tiny_policy(tok, seed=0, hidden_size=32).eval()
    lm = copy.deepcopy(base)
    lora.add_adapters(lm, lora.LoraSettings(r=4, alpha=8, head=head), seed=0)
    assert lora.is_lora_layer(lm.lm_head) is head
    ids, mask, P = _batch(len(tok))
    valid = mask[:, P:].bool()

    def logp(model, off=False):
        with torch.no_grad():
            module = AdaptersOff(PolicyModel(model)) if off else PolicyModel(model)
            return module(ids, mask, P)["logp"].where(valid, 0)

    reference = logp(base)
    assert torch.allclose(logp(lm), reference, atol=1e-5, rtol=0)  # B = 0 at the start: the base model
    _randomise_adapters(lm)
    adapted = logp(lm)
    assert (adapted - reference).abs().max() > 1e-2
    assert torch.allclose(logp(lm, off=True), reference, atol=1e-5, rtol=0)
    assert torch.equal(logp(lm), adapted)  # switched back on afterwards


def test_the_lean_path_runs_adapters_as_transformers_does(monkeypatch):
    """Adapted projections stay on the lean forward (its base matmul plus the adapters'): log-probs,
    the adapters' gradients and greedy decoding equal transformers' forward through peft's layers."""
    from ppo_lm.models import actor_critic, lean_support
    from ppo_lm.models.hf_compat import trunk
    from ppo_lm.rollout.sample.sampling import SamplingParams, generate

    tok = build_tokenizer()
    lm = build_tiny_policy(tok, seed=0, hidden_size=32).eval()
    lora.add_adapters(lm, lora.LoraSettings(r=4, alpha=8), seed=0)
    _randomise_adapters(lm)
    assert lean_support.supported(trunk(lm))
    ids, mask, P = _batch(len(tok))
    valid = mask[:, P:].bool()

    def run(lean_path: bool):
        monkeypatch.setattr(actor_critic.lean_support, "supported", (lambda body: True) if lean_path else (lambda body: False))
        lm.zero_grad()
        logp = PolicyModel(lm)(ids, mask, P)["logp"].where(valid, 0)
        logp.sum().backward()
        grads = {n: p.grad.clone() for n, p in lm.named_parameters() if p.requires_grad}
        with torch.no_grad():
            off = AdaptersOff(PolicyModel(lm))(ids, mask, P)["logp"].where(valid, 0)
        return logp.detach(), grads, off

    (lean_logp, lean_grads, lean_off), (hf_logp, hf_grads, hf_off) = run(True), run(False)
    monkeypatch.undo()
    assert torch.allclose(lean_logp, hf_logp, atol=1e-5, rtol=0) and torch.allclose(lean_off, hf_off, atol=1e-5, rtol=0)
    assert (lean_logp - lean_off).abs().max() > 1e-2  # the adapters act on the lean path
    assert lean_grads.keys() == hf_grads.keys() and all(lora.is_adapter_key(n) for n in lean_grads)
    for n in lean_grads:
        assert torch.allclose(lean_grads[n], hf_grads[n], atol=1e-5, rtol=1e-4), n
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    with torch.no_grad():
        a = generate(lm, ids[:, :P], mask[:, :P], params, pad_token_id=pad, lean_path=True)
        b = generate(lm, ids[:, :P], mask[:, :P], params, pad_token_id=pad, lean_path=False)
    assert torch.equal(a.responses, b.responses)


@pytest.mark.parametrize("head", [False, True])
def test_only_adapters_and_heads_train_and_the_reference_stays_the_base(tmp_path, head):
    cfg = _lora_config(tmp_path, iterations=3, optim__actor_lr=1e-2, critic__lr=1e-2, model__lora_head=head)
    tr = PPOTrainer(cfg, verifier=length_reward)
    assert tr.models.ref.lm is tr.models.policy.lm  # one copy of the weights
    trained = {n for n, p in tr.models.policy.lm.named_parameters() if p.requires_grad}
    assert trained and all(lora.is_adapter_key(n) for n in trained)
    assert any(n.startswith("lm_head.") for n in trained) is head
    critic_trained = {n for n, p in tr.models.critic.model.named_parameters() if p.requires_grad}
    assert {n for n in critic_trained if not lora.is_adapter_key(n)} == {"score.weight", "score.bias"}
    frozen_before = {n: p.detach().clone() for n, p in tr.models.policy.lm.named_parameters() if not p.requires_grad}
    ids, mask, P = _batch(len(tr.models.tokenizer))
    with torch.no_grad():
        ref_before = tr.models.ref(ids, mask, P)["logp"]
    history = tr.train()
    assert all(torch.equal(p, frozen_before[n]) for n, p in tr.models.policy.lm.named_parameters() if not p.requires_grad)
    with torch.no_grad():
        assert torch.equal(tr.models.ref(ids, mask, P)["logp"], ref_before)
        moved = (tr.models.policy(ids, mask, P)["logp"] - ref_before).abs().max()
    assert moved > 1e-3 and history[-1]["ref_kl"] != 0


def test_the_critics_frozen_body_is_the_donors_weights_not_a_copy(tmp_path):
    tr = PPOTrainer(_lora_config(tmp_path, critic__init="policy"), verifier=count_sevens)
    policy = dict(tr.models.policy.lm.model.named_parameters())
    shared = [n for n, p in tr.models.critic.model.model.named_parameters()
              if n.replace(".base_layer.", ".") in {k.replace(".base_layer.", ".") for k in policy}
              and p.data_ptr() == policy[next(k for k in policy if k.replace(".base_layer.", ".")
                                              == n.replace(".base_layer.", "."))].data_ptr()]
    body_base = [n for n, _ in tr.models.critic.model.model.named_parameters() if not lora.is_adapter_key(n)]
    assert sorted(shared) == sorted(body_base)


@pytest.mark.parametrize("head", [False, True])
def test_first_minibatch_ratio_is_one_with_adapters(tmp_path, head):
    cfg = _lora_config(tmp_path, iterations=1, optim__epochs=1, optim__num_minibatches=1, rollout__num_prompts=16,
                       rollout__max_new_tokens=8, model__lora_head=head)
    tr = PPOTrainer(cfg, verifier=count_sevens)
    _randomise_adapters(tr.models.policy.lm)  # a policy away from its reference: the ratio is still π_θ/π_old
    m = tr.train_iteration(1).metrics
    assert abs(m["ratio_max"] - 1) < 1e-5 and m["approx_kl"] < 1e-10 and m["ref_kl"] > 1e-4


def _metrics(path):
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in rows]


def test_resume_with_adapters_equals_uninterrupted(tmp_path):
    kw = dict(log__save_every=1, optim__actor_lr=1e-2, optim__epochs=1)
    PPOTrainer(_lora_config(tmp_path / "full", iterations=2, **kw), verifier=length_reward).train()
    PPOTrainer(_lora_config(tmp_path / "part", iterations=1, **kw), verifier=length_reward).train()
    PPOTrainer(_lora_config(tmp_path / "part", iterations=2, resume=True, **kw), verifier=length_reward).train()
    assert _metrics(tmp_path / "full") == _metrics(tmp_path / "part")
    (_, a), (_, b) = latest_checkpoint(tmp_path / "full"), latest_checkpoint(tmp_path / "part")
    for name in ["policy/adapter_model.safetensors", "critic/adapter_model.safetensors", "critic/value_head.safetensors"]:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert not (a / "policy" / "model.safetensors").exists()  # the frozen base is not copied into checkpoints


@pytest.mark.parametrize("head", [False, True])
def test_checkpoint_adapters_load_with_peft_and_export_merges_them(tmp_path, head):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    cfg = _lora_config(tmp_path / "run", iterations=2, optim__actor_lr=1e-2, log__save_every=1, model__lora_head=head)
    tr = PPOTrainer(cfg, verifier=length_reward)
    tr.train()
    _, path = latest_checkpoint(tmp_path / "run")
    ids, mask, P = _batch(len(tr.models.tokenizer))
    with torch.no_grad():
        trained = tr.models.policy.lm(input_ids=ids, attention_mask=mask).logits
        base = tr.models.ref.lm  # (the same model: read the base through peft below instead)
        assert base is tr.models.policy.lm
        fresh = build_tiny_policy(tr.models.tokenizer, seed=cfg.seed, hidden_size=32)
        via_peft = PeftModel.from_pretrained(fresh, str(path / "policy")).eval()
        assert torch.allclose(via_peft(input_ids=ids, attention_mask=mask).logits, trained, atol=1e-5, rtol=0)
    assert main(["export", str(tmp_path / "run"), "--output", str(tmp_path / "merged")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert not any("lora" in k for k in merged.state_dict())
    # The merged weights W + (alpha/r)·B·A are rounded to fp32 once; with head adapters this run's policy
    # has one position where that rounding reaches 9e-5 (its other logits agree to 1e-6). In float64 the
    # merge is exact, head included:
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids, attention_mask=mask).logits, trained, atol=1e-4 if head else 1e-5,
                              rtol=0)
        exact = PeftModel.from_pretrained(build_tiny_policy(tr.models.tokenizer, seed=cfg.seed, hidden_size=32).double(),
                                          str(path / "policy")).double().eval()
        unmerged = exact(input_ids=ids, attention_mask=mask).logits
        assert torch.allclose(exact.merge_and_unload()(input_ids=ids, attention_mask=mask).logits, unmerged,
                              atol=1e-12, rtol=0)


def test_resume_on_another_base_model_is_refused(tmp_path, saved_policy):
    kw = dict(model__policy=str(saved_policy), model__tokenizer=str(saved_policy), log__save_every=1)
    PPOTrainer(_lora_config(tmp_path / "run", iterations=1, **kw), verifier=count_sevens).train()
    with other_weights(saved_policy, tmp_path / "other"), pytest.raises(ConfigError, match="base weights differ"):
        PPOTrainer(_lora_config(tmp_path / "run", iterations=2, resume=True, **kw), verifier=count_sevens).train()


def test_export_refuses_a_changed_base_model(tmp_path, saved_policy, capsys):
    kw = dict(model__policy=str(saved_policy), model__tokenizer=str(saved_policy), log__save_every=1)
    PPOTrainer(_lora_config(tmp_path / "run", iterations=1, **kw), verifier=count_sevens).train()
    with other_weights(saved_policy, tmp_path / "other"):
        rc = main(["export", str(tmp_path / "run"), "--output", str(tmp_path / "merged")])
    err = capsys.readouterr().err
    assert rc == 2 and "is not the one the adapters were trained on" in err and not (tmp_path / "merged").exists()


def test_lora_without_peft_is_one_line_before_any_model(tmp_path, monkeypatch, capsys):
    import importlib.util

    from ppo_lm.trainer import roles

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else find_spec(name, *a))
    monkeypatch.setattr(roles, "build_policy", lambda *a, **k: pytest.fail("a model was built"))
    rc = main(["train", "--output-dir", str(tmp_path / "run"), "--model.lora-r", "8", "--log.no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "needs the peft package: pip install 'ppo-lm[lora]'" in err and len(err.strip().splitlines()) == 1


def test_gradient_checkpointing_with_adapters_trains_the_same(tmp_path):
    runs = []
    for ckpt in (False, True):
        cfg = _lora_config(tmp_path / str(ckpt), iterations=1, model__gradient_checkpointing=ckpt,
                           optim__actor_lr=1e-2, model__cpu_lanes=1)
        tr = PPOTrainer(cfg, verifier=length_reward)
        runs.append(tr.train_iteration(1).metrics)
    a, b = runs
    for k in ("policy_loss", "value_loss", "approx_kl", "grad_norm_actor", "grad_norm_critic"):
        assert abs(a[k] - b[k]) < 1e-5 * max(1.0, abs(a[k])), k
    assert a["grad_norm_actor"] > 0


@pytest.mark.parametrize("field,value,message", [
    ("lora_r", -1, "`model.lora_r` must be >= 0"),
    ("lora_dropout", 1.0, "`model.lora_dropout` must lie in [0, 1)"),
    ("lora_alpha", 0.0, "model.lora_alpha"),
    ("lora_target_modules", ["all-linear", "q_proj"], "'all-linear' already names every linear layer"),
    ("lora_target_modules", [], "must name at least one module"),
])
def test_bad_lora_settings_are_named_before_any_model_is_built(tmp_path, monkeypatch, field, value, message):
    from ppo_lm.trainer import roles

    monkeypatch.setattr(roles, "build_policy", lambda *a, **k: pytest.fail("a model was built"))
    cfg = tiny_config(tmp_path, model__lora_r=4)
    setattr(cfg.model, field, value)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        PPOTrainer(cfg, verifier=count_sevens)


def test_target_modules_that_match_nothing_name_the_layers_there_are(tmp_path, capsys):
    rc = main(["train", "--output-dir", str(tmp_path / "run"), "--model.builtin-hidden-size", "32",
               "--model.lora-r", "4", "--model.lora-target-modules", "query", "--iterations", "1",
               "--log.no-progress", "--log.no-tensorboard"])
    err = capsys.readouterr().err
    assert rc == 2 and "selects no linear layer" in err and "q_proj" in err and "Traceback" not in err


@pytest.mark.parametrize("targets,named,head", [(["q_proj", "query"], "['query']", False),
                                                 (["v_proj", "lm_head"], "['lm_head']", True)])
def test_every_target_module_must_match_a_layer_of_the_body(targets, named, head):
    """A name that matches nothing is an error even when another name matches (not silently dropped);
    the output head is named as such."""
    lm = build_tiny_policy(build_tokenizer(), seed=0, hidden_size=32)
    with pytest.raises(ValueError) as e:
        lora.target_names(lm, tuple(targets))
    msg = str(e.value)
    assert f"={named} selects no linear layer" in msg and "q_proj" in msg and ("output head" in msg) is head


def test_a_head_tied_to_the_embeddings_is_refused_and_lora_head_needs_lora(tmp_path):
    tied = build_tiny_policy(build_tokenizer(), seed=0, hidden_size=32, tie_word_embeddings=True)
    with pytest.raises(ValueError, match="shares its weight with the input embeddings"):
        lora.target_names(tied, ("all-linear",), head=True)
    assert "lm_head" not in lora.target_names(tied, ("all-linear",))
    with pytest.raises(ConfigError, match="`model.lora_head` needs `model.lora_r` > 0"):
        PPOTrainer(tiny_config(tmp_path, model__lora_head=True), verifier=count_sevens)


def test_target_modules_by_name_adapt_only_those(tmp_path):
    tr = PPOTrainer(_lora_config(tmp_path, model__lora_target_modules=["q_proj", "v_proj"]), verifier=count_sevens)
    adapted = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n, _ in tr.models.policy.lm.named_parameters()
               if lora.is_adapter_key(n)}
    assert adapted == {"q_proj", "v_proj"}


def test_adapter_dropout_with_gradient_checkpointing_trains_and_recomputes_the_same_masks(tmp_path, monkeypatch):
    """The backward's recompute of a checkpointed layer sees the adapters' dropout as the forward did:
    on, with the same masks (the checkpoint restores the random state), so the run neither crashes on
    a different count of saved tensors nor trains on other gradients than without checkpointing."""
    from ppo_lm.models import actor_critic

    # both runs on transformers' forward (checkpointing takes it anyway): the lean one packs the rows
    # and orders the adapters' dropout calls its own way, so its masks are other draws
    monkeypatch.setattr(actor_critic.lean_support, "supported", lambda body: False)
    runs = []
    for ckpt in (False, True):
        cfg = _lora_config(tmp_path / str(ckpt), iterations=1, model__gradient_checkpointing=ckpt,
                           model__lora_dropout=0.1, optim__actor_lr=1e-2, model__cpu_lanes=1)
        tr = PPOTrainer(cfg, verifier=length_reward)
        runs.append(tr.train_iteration(1).metrics)
        assert not any(m.training for m in tr.models.policy.lm.__dict__[lora._DROPOUTS])  # off again after the update
    a, b = runs
    for k in ("policy_loss", "value_loss", "grad_norm_actor", "grad_norm_critic"):
        assert abs(a[k] - b[k]) < 1e-5 * max(1.0, abs(a[k])), k
    assert a["grad_norm_actor"] > 0


def test_the_lean_path_runs_fp32_adapters_on_a_bfloat16_model_as_peft_does(monkeypatch):
    """A half-precision body keeps fp32 adapters (peft's autocast_adapter_dtype): the lean forward
    casts the projection's input to the adapters' dtype and the sum back, as peft's forward does."""
    from ppo_lm.models import actor_critic, lean_support
    from ppo_lm.models.hf_compat import trunk

    tok = build_tokenizer()
    lm = build_tiny_policy(tok, seed=0, hidden_size=32).to(torch.bfloat16).eval()
    lora.add_adapters(lm, lora.LoraSettings(r=4, alpha=8), seed=0)
    _randomise_adapters(lm)
    adapter_dtypes = {p.dtype for n, p in lm.named_parameters() if lora.is_adapter_key(n)}
    assert adapter_dtypes == {torch.float32} and lm.model.embed_tokens.weight.dtype == torch.bfloat16
    assert lean_support.supported(trunk(lm))
    ids, mask, P = _batch(len(tok))
    valid = mask[:, P:].bool()

    def logp(lean_path: bool, off: bool = False):
        monkeypatch.setattr(actor_critic.lean_support, "supported", (lambda body: True) if lean_path else (lambda body: False))
        with torch.no_grad():
            module = AdaptersOff(PolicyModel(lm)) if off else PolicyModel(lm)
            return module(ids, mask, P)["logp"].float().where(valid, 0)

    lean_logp, hf_logp, base = logp(True), logp(False), logp(False, off=True)
    monkeypatch.undo()
    assert (hf_logp - base).abs().max() > 0.1  # the adapters act
    # bf16 tolerance: about one bfloat16 step at the log-probs' magnitude (a few nats)
    assert torch.allclose(lean_logp, hf_logp, atol=0.05, rtol=0), (lean_logp - hf_logp).abs().max()
