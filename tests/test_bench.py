"""``ppo-lm bench``: a smoke run at a tiny scale (the full W1 size takes minutes), the FLOP count,
and the workload settings that make W1 equal work with the TRL peer."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch

from ppo_lm.cli import bench, bench_host, bench_workloads
from ppo_lm.cli.main import main
from ppo_lm.runtime import peak

KEYS = {"episodes_per_s", "peak_rss_mb", "s_per_iteration", "generate_s", "score_s", "advantage_s", "update_s",
        "rollout_tokens_per_s", "update_tokens_per_s", "achieved_gflop_per_s", "gflop_per_iteration",
        "response_length_mean", "peak_blas_gflop_per_s", "peak_blas_gflop_per_s_2048", "update_of_peak",
        "iteration_of_peak", "update_of_peak_2048", "iteration_of_peak_2048"} | (
        {"other_cpu_share", "steal_share"} if Path("/proc/stat").exists() else set())


def _run(capsys, *args) -> dict:
    assert main(["bench", "--tiny", "--iterations", "1", "--json", *args]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert len(lines) == 1
    return json.loads(lines[0])


def test_w1_smoke_json(capsys):
    r = _run(capsys, "--workload", "w1", "--compare-hf-generate", "--threads", "1")
    assert KEYS | {"hf_generate_tokens_per_s", "ppo_lm_generate_tokens_per_s", "generate_speedup_vs_hf"} <= set(r)
    assert r["workload"] == "W1-tiny" and r["iterations"] == 1 and r["threads"] == 1
    assert r["cpu_lanes"] == 1  # one thread: nothing to share
    assert r["response_length_mean"] == bench_workloads.TINY.response_len  # EOS can never be sampled in W1
    assert r["episodes_per_s"] > 0 and r["peak_rss_mb"] > 0 and r["achieved_gflop_per_s"] > 0
    assert r["episodes_per_s"] == pytest.approx(bench_workloads.TINY.batch / r["s_per_iteration"], rel=1e-2)
    best = max(v for k, v in r.items() if k.startswith("peak_") and k.endswith("_gflop_per_s"))
    assert best > 0 and r["update_of_peak"] == pytest.approx(r["update_gflop_per_s"] / best, rel=2e-3, abs=1e-3)


def test_w2_stops_early(capsys):
    r = _run(capsys, "--workload", "w2", "--warmup", "0", "--threads", "2", "--cpu-lanes", "2")
    assert KEYS <= set(r) and r["cpu_lanes"] == 2
    assert r["response_length_mean"] < bench_workloads.TINY.response_len


@pytest.mark.slow  # ~3.5 s of the fast suite's 4 minutes; .ci/run runs it
def test_w4_long_responses_keep_w1_tokens(capsys):
    """W4: W1's sampled tokens per iteration in four prompts by default (tiny: 4 × 16 = TINY's 64)."""
    r = _run(capsys, "--workload", "w4", "--warmup", "0", "--threads", "1")
    tokens = bench_workloads.TINY.batch * bench_workloads.TINY.response_len
    assert r["workload"] == "W4-tiny" and r["response_length_mean"] == tokens // 4
    assert r["episodes_per_s"] == pytest.approx(4 / r["s_per_iteration"], rel=1e-2)
    r = _run(capsys, "--workload", "w4", "--warmup", "0", "--threads", "1", "--response-length", "32")
    assert r["response_length_mean"] == 32
    assert r["episodes_per_s"] == pytest.approx(tokens // 32 / r["s_per_iteration"], rel=1e-2)
    cfg = bench_workloads.make_config("w4", bench_workloads.w4_shape(), ("p", "r", "t"), "out", 2, 2)
    assert (cfg.rollout.num_prompts, cfg.rollout.max_new_tokens, cfg.rollout.min_new_tokens) == (4, 1024, 1024)
    assert bench_workloads.qwen2_config(bench_workloads.w4_shape()).max_position_embeddings >= 32 + 1024


@pytest.mark.parametrize("argv, message", [
    (["--workload", "w4", "--response-length", "48"], "--response-length must divide 64"),
    (["--workload", "w1", "--response-length", "32"], "--response-length is for --workload w4"),
])
def test_bad_response_length_is_refused(capsys, argv, message):
    assert main(["bench", "--tiny", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ppo-lm: error: {message}") and err.count("\n") == 1


def test_bad_cpu_lanes_is_refused(capsys):
    assert main(["bench", "--tiny", "--cpu-lanes", "0"]) == 2
    assert capsys.readouterr().err == "ppo-lm: error: --cpu-lanes must be >= 1, got 0\n"


def test_bad_device_is_refused_before_building_anything(capsys):
    assert main(["bench", "--tiny", "--device", "tpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ppo-lm: error: --device: 'tpu' is not a device") and err.count("\n") == 1


def test_w1_config_is_the_spec_workload(tmp_path):
    cfg = bench_workloads.make_config("w1", bench_workloads.W1_SHAPE, ("p", "r", "t"), str(tmp_path), 2, 2)
    r, a, o, c = cfg.rollout, cfg.algo, cfg.optim, cfg.critic
    assert (r.num_prompts, r.max_new_tokens, r.min_new_tokens, r.temperature) == (64, 64, 64, 1.0)
    assert (o.epochs, o.num_minibatches) == (4, 2)
    assert (a.kl_estimator, a.kl_coef, a.clip_eps, c.value_clip_eps, c.vf_coef, a.gamma, a.gae_lambda) == (
        "k1", 0.05, 0.2, 0.2, 0.1, 1.0, 0.95)
    assert (cfg.critic.kind, cfg.critic.init, cfg.model.dtype) == ("separate", "reward", "float32")
    w2 = bench_workloads.make_config("w2", bench_workloads.W1_SHAPE, ("p", "r", "t"), str(tmp_path), 2, 2)
    assert w2.rollout.min_new_tokens == 0 and len(w2.rollout.stop_tokens) == 31  # + EOS = 1/16 of 512


def test_micro_batch_size_flag_reaches_the_config(tmp_path, capsys, monkeypatch):
    """--micro-batch-size N sets optim.micro_batch_size of the trained config; without it the library's
    default (auto, resolved by the trainer)."""
    shape, paths = bench_workloads.W1_SHAPE, ("p", "r", "t")
    assert bench_workloads.make_config("w1", shape, paths, str(tmp_path), 2, 2).optim.micro_batch_size == "auto"
    assert bench_workloads.make_config("w1", shape, paths, str(tmp_path), 2, 2,
                                       micro_batch_size=8).optim.micro_batch_size == 8
    assert main(["bench", "--tiny", "--micro-batch-size", "-1"]) == 2
    assert capsys.readouterr().err == "ppo-lm: error: --micro-batch-size must be >= 0, got -1\n"

    class Built(Exception):
        pass

    def make_config(*args, **kwargs):  # the config run_bench builds, then stop before any training
        configs.append(bench_workloads.make_config(*args, **kwargs))
        raise Built

    configs: list = []
    monkeypatch.setattr(bench, "make_config", make_config)
    with pytest.raises(Built):
        bench.bench_command(["--tiny", "--micro-batch-size", "2", "--threads", "0"])
    with pytest.raises(Built):
        bench.bench_command(["--tiny", "--threads", "0"])
    assert [c.optim.micro_batch_size for c in configs] == [2, "auto"]


def test_prompts_are_exactly_the_prompt_length():
    tok = bench_workloads.build_tokenizer(bench_workloads.W1_SHAPE.vocab)
    rows = bench_workloads.random_prompts(5, bench_workloads.W1_SHAPE)
    lengths = [len(x) for x in tok([r["prompt"] for r in rows], add_special_tokens=False)["input_ids"]]
    assert lengths == [32] * 5
    assert tok.pad_token_id != tok.eos_token_id


def test_flop_count_of_w1():
    f = bench_workloads.iteration_flops(bench_workloads.W1_SHAPE, [64] * 64)
    assert 1.45e12 < f["total"] < 1.65e12  # docs/benchmarks.md: ≈ 1.5 TFLOP per iteration
    s = bench_workloads.W1_SHAPE
    policy = bench_workloads.forward_flops(s, 96, 96 * 97 / 2, 64, 512)  # 2·params·tokens + attention + vocab head
    critic = bench_workloads.forward_flops(s, 96, 96 * 97 / 2, 65, 1)
    assert policy == pytest.approx(96 * 2 * 4 * (4 * 256**2 + 3 * 256 * 1024) + 4 * 4 * 256 * 96 * 97 / 2
                                   + 64 * 2 * 256 * 512)
    assert f["update"] == pytest.approx(64 * 4 * 3 * (policy + critic))  # backward = 2 × forward


def test_host_load_shares():
    """Other processes' share = machine busy time minus our own, over the machine's total; steal apart."""
    hz = os.sysconf("SC_CLK_TCK")
    before = bench_host.HostCPU(busy=1000, steal=50, total=10_000)
    after = bench_host.HostCPU(busy=1000 + 3 * hz, steal=50 + hz // 2, total=10_000 + 20 * hz)
    load = bench_host.host_load(before, after, own_s=2.0)  # we used 2 of the 3 busy CPU seconds
    assert load == {"other_cpu_share": pytest.approx(1 / 20, abs=1e-3), "steal_share": pytest.approx(0.025, abs=1e-3)}
    # our own time can exceed the machine's busy ticks by rounding: never a negative share
    assert bench_host.host_load(before, after, own_s=4.0)["other_cpu_share"] == 0
    assert bench_host.host_load(None, after, 1.0) == {} and bench_host.host_load(after, after, 1.0) == {}


def test_host_cpu_counters_add_up():
    c = bench_host.host_cpu()
    assert (c is not None) == Path("/proc/stat").exists()
    if c is not None:
        assert 0 <= c.busy and 0 <= c.steal and c.busy + c.steal <= c.total


def test_w3_config_is_the_peers_workload(tmp_path):
    """shared/bench/trl_ppo_w3.py: 16 chat prompts × exactly 32 tokens, 4 epochs × 2 minibatches, k1 KL
    0.05 in the reward, clip 0.2, value clip 0.2, vf 0.1, γ 1, λ 0.95, lr 1e-6, fp32; a one-label reward
    model from the policy's body as `model.reward`, the separate critic initialised from it."""
    cfg = bench_workloads.make_config("w3", bench_workloads.W3_SHAPE, ("smol.gguf", "rm", None), str(tmp_path), 2, 2)
    m, d, r, a, o, c = cfg.model, cfg.data, cfg.rollout, cfg.algo, cfg.optim, cfg.critic
    assert (m.policy, m.reward, m.tokenizer) == ("smol.gguf", "rm", None)  # tokenizer from the policy
    assert (c.kind, c.init, m.dtype) == ("separate", "reward", "float32")
    assert (r.num_prompts, r.samples_per_prompt, r.max_new_tokens, r.min_new_tokens, r.temperature) == (
        16, 1, 32, 32, 1.0)
    assert (r.top_k, r.top_p, r.stop_tokens) == (0, 1.0, [])
    assert (o.epochs, o.num_minibatches, o.micro_batch_size, o.actor_lr, c.lr) == (4, 2, "auto", 1e-6, 1e-6)
    assert (a.estimator, a.kl_in, a.kl_estimator, a.kl_coef, a.clip_eps, c.value_clip_eps, c.vf_coef, a.gamma,
            a.gae_lambda) == ("gae", "reward", "k1", 0.05, 0.2, 0.2, 0.1, 1.0, 0.95)
    assert d.chat_template == "auto" and not d.shuffle
    rows = bench_workloads.w3_prompts(48)
    import random

    random.seed(0)  # the peer's draw
    assert [x["prompt"] for x in rows] == [[{"role": "user", "content": f"Write a short story about "
                                              f"{random.choice(bench_workloads.W3_TOPICS)}."}] for _ in range(48)]


def test_w3_shape_follows_the_model_config():
    from transformers import LlamaConfig

    c = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3)
    assert bench_workloads.shape_of(c, 16, 32) == bench_workloads.W3_SHAPE
    f = bench_workloads.iteration_flops(bench_workloads.W3_SHAPE, [32, 32], prompt_lengths=[40, 44])
    one = bench_workloads.iteration_flops(dataclasses.replace(bench_workloads.W3_SHAPE, prompt_len=40), [32])
    two = bench_workloads.iteration_flops(dataclasses.replace(bench_workloads.W3_SHAPE, prompt_len=44), [32])
    assert f["total"] == pytest.approx(one["total"] + two["total"])


def test_w3_needs_a_policy(capsys):
    assert main(["bench", "--workload", "w3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ppo-lm: error: --workload w3 needs --policy PATH") and err.count("\n") == 1


def test_policy_is_for_w3_only_and_must_exist(capsys, tmp_path):
    assert main(["bench", "--workload", "w1", "--policy", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "ppo-lm: error: --policy is for --workload w3; w1 builds its own models\n"
    assert main(["bench", "--workload", "w3", "--policy", str(tmp_path / "none.gguf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ppo-lm: error: `--policy`") and "does not exist" in err and err.count("\n") == 1


# ---- the host's matmul peak (runtime/peak.py) -------------------------------------------------------
def test_peak_flop_arithmetic_on_a_tiny_shape(monkeypatch):
    """2·rows·inner·out FLOPs per product; a backend's GFLOP/s is the shapes' FLOPs over the sum of their
    best times (so a large shape counts more than a small one); the thread count is put back."""
    assert peak.MatmulShape(8, 16, 32).flops == 2 * 8 * 16 * 32 == 8192
    assert peak.gflop_per_s(3e9, 0.5) == 6.0
    seconds = {(8, 32): 1e-6, (16, 32): 4e-6}  # a call's time, by the shape of its product

    monkeypatch.setattr(peak, "best_seconds", lambda fn, repeats, warmup=1: seconds[tuple(fn().shape)])
    threads = torch.get_num_threads()
    one = peak.measure([peak.MatmulShape(8, 16, 32)], threads=1)
    assert set(one) == set(peak.backends()) and torch.get_num_threads() == threads
    assert all(v == pytest.approx(8192 / 1e-6 / 1e9) for v in one.values())  # 8.192 GFLOP/s
    two = peak.measure([peak.MatmulShape(8, 16, 32), peak.MatmulShape(16, 16, 32)], threads=1)
    assert all(v == pytest.approx((8192 + 16384) / 5e-6 / 1e9) for v in two.values())  # not the mean of 8.2, 4.1


def test_every_peak_backend_computes_the_linear_layer():
    x, w = torch.randn(40, 24), torch.randn(12, 24)
    for name, fn in peak.backends().items():
        torch.testing.assert_close(fn(x, w), x @ w.T, rtol=1e-4, atol=1e-4, msg=name)
    assert "blas" in peak.backends()


def test_decoder_shapes_and_fractions_of_the_peak():
    shapes = peak.decoder_shapes(rows=10, hidden=4, intermediate=6, kv_width=2)
    assert sum(s.flops for s in shapes) == 2 * 10 * (2 * 4 * 4 + 2 * 4 * 2 + 3 * 4 * 6)  # as forward_flops counts
    host = {"peak_onednn_gflop_per_s": 400.0, "peak_blas_gflop_per_s": 200.0,
            "peak_onednn_gflop_per_s_2048": 500.0, "peak_blas_gflop_per_s_2048": 250.0}
    assert bench_host.peak_fractions(host, update_gflop_per_s=100.0, iteration_gflop_per_s=50.0) == {
        "update_of_peak": 0.25, "iteration_of_peak": 0.125, "update_of_peak_2048": 0.2, "iteration_of_peak_2048": 0.1}
    assert bench_host.peak_fractions({}, 100.0, 50.0) == {}  # no peak measured (a GPU run): no fraction


@pytest.mark.slow  # ~5.5 s of the fast suite's 4 minutes; .ci/run runs it
def test_w1_asynchronous_times_the_learners_wall_clock(capsys):
    r = _run(capsys, "--workload", "w1", "--threads", "1", "--max-staleness", "1", "--producer-threads", "1")
    assert KEYS <= set(r) and r["max_staleness"] == 1 and r["producer_threads"] == 1
    assert r["episodes_per_s"] == pytest.approx(bench_workloads.TINY.batch / r["s_per_iteration"], rel=1e-2)


@pytest.mark.parametrize("setup, fields", [
    (bench_workloads.CriticSetup(kind="frozen"), ("frozen", None, None, "reward")),
    (bench_workloads.CriticSetup(lora_r=16, epochs=1), ("separate", 16, 1, "reward")),
    (bench_workloads.CriticSetup(kind="shared"), ("shared", None, None, "auto")),
])
def test_a_critic_variant_reaches_the_config_and_passes_its_checks(tmp_path, setup, fields):
    from ppo_lm.config.unused import unused_settings

    cfg = bench_workloads.make_config("w1", bench_workloads.W1_SHAPE, ("p", "r", "t"), str(tmp_path), 2, 2,
                                      critic=setup)
    c = cfg.critic
    assert (c.kind, c.lora_r, c.epochs, c.init) == fields
    assert not [u for u in unused_settings(cfg) if u.refused]


def test_reinforce_pp_runs_the_workload_without_a_critics_settings(tmp_path):
    from ppo_lm.config.unused import unused_settings

    cfg = bench_workloads.make_config("w1", bench_workloads.W1_SHAPE, ("p", "r", "t"), str(tmp_path), 2, 2,
                                      critic=bench_workloads.CriticSetup(estimator="reinforce++"))
    assert cfg.algo.estimator == "reinforce++" and cfg.rollout.samples_per_prompt == 1
    assert not [u for u in unused_settings(cfg) if u.refused]


def test_the_flop_count_follows_the_critic():
    """Per episode: a separate critic scores once and trains 3 forwards' worth per epoch; adapters on a
    frozen body 2; a frozen body's head 1; a shared head and no critic add nothing to the critic's count."""
    W, C = bench_workloads, bench_workloads.CriticSetup
    s = W.W1_SHAPE
    crit = W.forward_flops(s, 96, 96 * 97 / 2, 65, 1)
    base = W.iteration_flops(s, [64], critic=C(estimator="reinforce++"))
    assert W.iteration_flops(s, [64], critic=C(kind="shared")) == base
    for setup, per_epoch in ((C(), 3), (C(lora_r=8), 2), (C(kind="frozen"), 1)):
        f = W.iteration_flops(s, [64], critic=setup)
        assert f["score"] - base["score"] == pytest.approx(crit)
        assert f["update"] - base["update"] == pytest.approx(4 * per_epoch * crit)
    assert C(lora_r=4, epochs=1).label() == "separate, LoRA r 4, 1 epoch" and C(epochs=2).label() == "separate, 2 epochs"
    one = W.iteration_flops(s, [64], critic=C(epochs=1))
    assert one["update"] - base["update"] == pytest.approx(3 * crit)


@pytest.mark.parametrize("argv, message", [
    (["--estimator", "reinforce++", "--critic", "frozen"], "--estimator reinforce++ has no critic"),
    (["--critic", "frozen", "--critic-lora-r", "8"], "--critic-lora-r puts adapters on a separate critic"),
    (["--critic-epochs", "0"], "--critic-epochs must be >= 1, got 0"),
])
def test_critic_flags_that_do_not_fit_are_one_line(capsys, argv, message):
    assert main(["bench", "--tiny", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("argv, label", [(["--critic", "frozen"], "frozen"),
                                         (["--estimator", "reinforce++"], "none (reinforce++)")])
def test_a_critic_variant_runs_and_says_which(capsys, argv, label):
    r = _run(capsys, "--workload", "w1", "--warmup", "0", "--threads", "1", *argv)
    assert r["critic"] == label and r["episodes_per_s"] > 0 and r["update_s"] > 0
