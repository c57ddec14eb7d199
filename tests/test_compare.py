"""`ppo-lm compare` at smoke sizes: its outputs, the spread over seeds against a hand calculation, one
real run in a fresh process, and its errors (each before any model loads)."""

from __future__ import annotations

import json
import math

import pytest

from ppo_lm.cli import compare
from ppo_lm.cli.main import main
from ppo_lm.config.train import TrainConfig
from ppo_lm.reporting.compare_report import smooth, spread, summarize, summary_markdown


def _in_process(run, config_path, log_path):
    """The smoke runs in this process: a fresh one costs seconds of imports each, and
    test_a_run_is_a_fresh_process_with_its_own_peak_rss checks the real runner."""
    from ppo_lm.config.io import dump_yaml
    from ppo_lm.trainer.ppo import PPOTrainer

    dump_yaml(run, config_path)
    PPOTrainer(run).train()
    return 1.5, 100.0


def test_compare_writes_the_summary_the_table_and_the_curves(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(compare, "run_one", _in_process)
    out = tmp_path / "cmp"
    assert main(["compare", "--smoke", "--estimators", "gae,grpo", "--seeds", "0,1", "--iterations", "2",
                 "--output-dir", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert list(s["estimators"]) == ["gae", "grpo"]
    # seed-major order: every estimator of a seed before the next seed
    assert [(r["estimator"], r["seed"]) for r in s["runs"]] == [("gae", 0), ("grpo", 0), ("gae", 1), ("grpo", 1)]
    # the natural layout at 8 episodes per iteration: one sample of 8 prompts for GAE, groups of 2 for GRPO
    assert s["settings"]["layouts"] == {"gae": [8, 1], "grpo": [4, 2]} and s["settings"]["layout"] == "natural"
    for r in s["runs"]:
        rows = [json.loads(x) for x in (out / "runs" / f"{r['estimator']}-seed{r['seed']}" / "metrics.jsonl")
                .read_text().splitlines()]
        assert [x["iteration"] for x in rows] == [0, 1, 2]  # the evaluation before training, then each iteration
        assert r["accuracy_before"] == rows[0]["eval_score"] and r["accuracy_after"] == rows[-1]["eval_score"]
        assert r["sampled_tokens"] == round(sum(x["response_length_mean"] * 8 for x in rows[1:]))
        assert r["wall_s"] == 1.5 and r["peak_rss_mb"] == 100.0
    # one start and one held-out set: greedy accuracy before training is the same in every run
    assert len({r["accuracy_before"] for r in s["runs"]}) == 1
    # GAE's critic on the built-in model: `auto` resolves to a value head on the policy (read back from
    # the run's checkpoint, which holds value_head.safetensors)
    assert s["estimators"]["gae"]["models_held"] == ["policy", "reference", "value head"]
    assert s["estimators"]["grpo"]["models_held"] == ["policy", "reference"]
    g = s["estimators"]["grpo"]
    after = [r["accuracy_after"] for r in s["runs"] if r["estimator"] == "grpo"]
    assert g["accuracy_after"]["mean"] == pytest.approx(sum(after) / 2)
    assert g["accuracy_after"]["std"] == pytest.approx(abs(after[0] - after[1]) / math.sqrt(2))
    md = (out / "summary.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| estimator")]
    assert [r.split("|")[1:3] for r in rows] == [[" gae ", " 8 × 1 "], [" grpo ", " 4 × 2 "]]
    assert "| 3 (policy, reference, value head) | " in rows[0] and rows[1].endswith("| 2 (policy, reference) | — |")
    # the critic's diagnostics: GAE's runs have them (the cell's figures: the tests below), GRPO's none
    assert all((r["critic"] is None) == (r["estimator"] == "grpo") for r in s["runs"])
    assert not rows[0].endswith("| — |")
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "sft" / "model.safetensors").is_file() and (out / "heldout.jsonl").is_file()
    assert "| gae |" in capsys.readouterr().out
    # a second comparison into the same directory needs --overwrite
    assert main(["compare", "--smoke", "--output-dir", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_spread_and_summary_against_a_hand_calculation():
    s = spread([0.2, 0.5, 0.8])
    # mean 0.5; deviations −0.3, 0, 0.3; sample variance (0.09 + 0 + 0.09) / (3 − 1) = 0.09
    assert s["mean"] == pytest.approx(0.5) and s["std"] == pytest.approx(0.3)
    assert (s["min"], s["max"], s["n"]) == (0.2, 0.8, 3)
    assert spread([0.4]) == {"mean": 0.4, "std": 0.0, "min": 0.4, "max": 0.4, "n": 1}
    runs = [{"estimator": "rloo", "seed": seed, "accuracy_before": 0.2, "accuracy_after": after,
             "sampled_tokens": tokens, "wall_s": 10.0 + seed, "peak_rss_mb": 300.0, "models_held": ["policy", "reference"]}
            for seed, after, tokens in [(0, 0.5, 1000), (1, 0.6, 1100)]]
    e = summarize(runs)["rloo"]
    # gains 0.3 and 0.4: mean 0.35, sample std |0.4 − 0.3| / √2
    assert e["gain"]["mean"] == pytest.approx(0.35) and e["gain"]["std"] == pytest.approx(0.1 / math.sqrt(2))
    assert e["sampled_tokens"]["mean"] == 1050 and e["wall_s"]["max"] == 11.0 and e["seeds"] == [0, 1]
    assert smooth([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]


@pytest.mark.slow  # a whole comparison in fresh processes: ~8 s of the fast suite; .ci/run runs it
def test_a_run_is_a_fresh_process_with_its_own_peak_rss(tmp_path):
    run = TrainConfig(iterations=1, output_dir=str(tmp_path / "run"))
    run.model.builtin_hidden_size = 16
    run.rollout.num_prompts, run.rollout.max_new_tokens = 2, 2
    run.optim.epochs, run.optim.num_minibatches = 1, 1
    run.data.builtin_num_prompts = 8
    run.log.report_to, run.log.progress = [], False
    wall, rss = compare.run_one(run, tmp_path / "run.yaml", tmp_path / "run.log")
    assert (tmp_path / "run" / "metrics.jsonl").is_file() and wall > 0
    assert 50 < rss < 4000  # MB: torch alone is over 50; a KB/MB mix-up would be 1000× off
    run.output_dir, run.model.reward = str(tmp_path / "bad"), "no_such_module_xyz:score"
    with pytest.raises(compare.CompareError, match=r"failed \(status 2\): ppo-lm: error: .*no_such_module_xyz"):
        compare.run_one(run, tmp_path / "bad.yaml", tmp_path / "bad.log")


@pytest.mark.parametrize("args, message", [
    (["--estimators", "gae,ppo2"], "unknown estimator(s) 'ppo2'; choose from gae, grpo"),
    (["--seeds", "0,x"], "argument --seeds: invalid comma-separated list of distinct integers value: '0,x'"),
    (["--seeds", "1,1"], "argument --seeds: invalid comma-separated list of distinct integers value: '1,1'"),
    (["--seeds", "-1"], "--seeds must be >= 0"),
    (["--estimators", ""], "argument --estimators: invalid comma-separated list value: ''"),
    (["--iterations", "0"], "--iterations must be >= 1, got 0"),
    (["--policy", "nowhere"], "`model.policy` 'nowhere' does not exist"),
    (["--episodes", "10", "--group-size", "4"], "--episodes 10 is not a multiple of --group-size 4"),
    (["--group-size", "1"], "--group-size must be >= 2, got 1"),
    (["--prompts", "p.jsonl"], "--prompts: a task of your own needs --policy"),
    (["--config", "missing.yaml"], "config file not found: missing.yaml"),
])
def test_compare_errors_are_one_line_before_any_run(tmp_path, capsys, args, message):
    out = tmp_path / "cmp"
    assert main(["compare", "--output-dir", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ppo-lm: error: ") and err.count("\n") == 1 and message in err, err
    assert not (out / "runs").exists()


def test_compare_config_is_merged_and_checked_per_estimator(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rollout:\n  samples_per_prompt: 1\n  num_prompts: 128\n")
    assert main(["compare", "--config", str(cfg), "--output-dir", str(tmp_path / "cmp")]) == 2
    err = capsys.readouterr().err
    assert "estimator 'grpo': `algo.estimator`='grpo' compares samples of the same prompt" in err, err
    c = compare.parse_args(["--config", str(cfg), "--estimators", "gae", "--iterations", "7",
                            "--output-dir", str(tmp_path / "ok")])
    compare.check_compare(c)
    run = compare.run_config(c, "gae", 3)
    assert (run.rollout.samples_per_prompt, run.rollout.num_prompts, run.iterations, run.seed) == (1, 128, 7, 3)
    assert run.rollout.max_new_tokens == 6  # the demo's, which the file leaves alone
    assert run.model.policy == str(tmp_path / "ok" / "sft")
    assert run.data.eval_prompts == str(tmp_path / "ok" / "heldout.jsonl")
    (tmp_path / "ok" / "summary.json").write_text("{}")
    c.overwrite = True
    compare.check_compare(c)  # an earlier comparison's outputs are replaced with --overwrite


def test_smoke_caps_the_iterations_and_the_config_files_sizes(tmp_path):
    """--smoke is a wiring check in seconds, whatever --iterations and the --config file ask for."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rollout:\n  max_new_tokens: 32\noptim:\n  epochs: 3\n  num_minibatches: 2\n"
                   "per_estimator:\n  gae:\n    log:\n      eval_every: 5\n")
    c = compare.parse_args(["--smoke", "--config", str(cfg), "--estimators", "gae", "--iterations", "40",
                            "--output-dir", str(tmp_path / "o")])
    compare.check_compare(c)
    run = compare.run_config(c, "gae", 0)
    assert (c.iterations, run.iterations, c.episodes) == (compare.SMOKE_ITERATIONS, compare.SMOKE_ITERATIONS, 8)
    assert (run.rollout.max_new_tokens, run.optim.epochs, run.optim.num_minibatches) == (4, 1, 1)
    assert (run.data.eval_max_prompts, run.log.eval_every) == (compare.SMOKE_EVAL_PROMPTS, 1)
    assert compare.parse_args(["--smoke", "--iterations", "1"]).iterations == 1  # fewer stay fewer


def test_each_estimator_runs_in_its_layout_at_the_same_episodes_and_common_gives_every_one_groups(tmp_path):
    c = compare.parse_args(["--estimators", "gae,reinforce++,grpo,rloo,dr_grpo", "--episodes", "96",
                            "--group-size", "8", "--output-dir", str(tmp_path / "n")])
    compare.check_compare(c)
    natural = {e: (r.rollout.num_prompts, r.rollout.samples_per_prompt)
               for e in c.estimators for r in [compare.run_config(c, e, 0)]}
    assert natural == {"gae": (96, 1), "reinforce++": (96, 1), "grpo": (12, 8), "rloo": (12, 8), "dr_grpo": (12, 8)}
    c.layout = "common"
    assert {(r.rollout.num_prompts, r.rollout.samples_per_prompt)
            for e in c.estimators for r in [compare.run_config(c, e, 0)]} == {(12, 8)}


def test_per_estimator_sections_apply_to_their_estimator_only_and_are_checked(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("optim:\n  epochs: 3\nper_estimator:\n  gae:\n    critic:\n      lr: 3.0e-3\n"
                   "  grpo:\n    rollout:\n      num_prompts: 16\n      samples_per_prompt: 8\n")
    c = compare.parse_args(["--config", str(cfg), "--estimators", "gae,grpo,rloo", "--output-dir", str(tmp_path / "o")])
    compare.check_compare(c)
    gae, grpo, rloo = (compare.run_config(c, e, 0) for e in ("gae", "grpo", "rloo"))
    assert gae.critic.lr == 3e-3 and rloo.critic.lr == grpo.critic.lr == 1e-3  # the demo's
    assert (grpo.rollout.num_prompts, grpo.rollout.samples_per_prompt) == (16, 8)
    assert (rloo.rollout.num_prompts, rloo.rollout.samples_per_prompt) == (32, 4)
    assert gae.optim.epochs == grpo.optim.epochs == rloo.optim.epochs == 3  # the file's, for every run
    for text, message in [
        ("per_estimator:\n  gea:\n    optim:\n      epochs: 2\n", "`per_estimator.gea`: unknown estimator"),
        ("per_estimator:\n  gae:\n    critic:\n      l_r: 1\n",
         "unknown config field `per_estimator.gae.critic.l_r`; did you mean `lr`?"),
        ("per_estimator: [gae]\n", "`per_estimator` must map estimator names to settings"),
        ("per_estimator:\n  gae:\n    optim:\n      actor_lr: fast\n",
         "`per_estimator.gae.optim.actor_lr` must be a number or 'auto', got 'fast'"),
    ]:
        cfg.write_text(text)
        assert main(["compare", "--config", str(cfg), "--output-dir", str(tmp_path / "bad")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err


def test_compare_on_a_task_of_your_own(tmp_path, monkeypatch, saved_policy, capsys):
    """--policy, --prompts, --reward and --eval-prompts: the train defaults (auto sizes), no SFT start
    and no built-in held-out set, the user's files in every run."""
    monkeypatch.setattr(compare, "run_one", _in_process)
    rows = [{"prompt": f"Solve {a}x+1={a * 2 + 1}", "answer": "2"} for a in range(1, 9)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "r.py").write_text("def sevens(prompts, responses, **columns):\n"
                                   "    return [r.count('7') / 4 for r in responses]\n")
    own = ["--policy", str(saved_policy), "--prompts", str(tmp_path / "p.jsonl"), "--reward", f"{tmp_path / 'r.py'}:sevens",
           "--eval-prompts", str(tmp_path / "p.jsonl")]
    out = tmp_path / "cmp"
    assert main(["compare", "--smoke", "--estimators", "gae,rloo", "--seeds", "0", "--iterations", "2",
                 "--output-dir", str(out), *own]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["settings"]["layouts"] == {"gae": [8, 1], "rloo": [4, 2]}
    assert s["settings"]["eval_prompts"] == f"the prompts of {tmp_path / 'p.jsonl'}"
    assert not (out / "sft").exists() and not (out / "heldout.jsonl").exists()
    c = compare.parse_args(["--output-dir", str(tmp_path / "x"), *own])
    run = compare.run_config(c, "gae", 0)
    assert (run.model.policy, run.data.prompts, run.model.reward) == (str(saved_policy), own[3], own[5])
    assert run.optim.actor_lr == "auto" and run.threads == 0  # the train defaults, not the demo's
    for drop, flag in ((0, "--policy"), (4, "--reward"), (6, "--eval-prompts")):
        args = own[:drop] + own[drop + 2:]
        assert main(["compare", "--output-dir", str(tmp_path / "y"), *args]) == 2
        assert f"a task of your own needs {flag}" in capsys.readouterr().err
    bad = own[:5] + [f"{tmp_path / 'r.py'}:nothing"] + own[6:]
    assert main(["compare", "--output-dir", str(tmp_path / "z"), *bad]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ppo-lm: error: estimator 'gae': ") and "nothing" in err and err.count("\n") == 1, err


def test_run_record_curves_over_tokens_and_over_training_seconds(tmp_path):
    from ppo_lm.reporting.compare_report import run_record

    rows = [{"iteration": 0, "eval_score": 0.1, "eval_s": 2.0},
            {"iteration": 1, "score": 0.2, "response_length_mean": 3.0, "iteration_s": 5.0, "ref_kl": 0.0},
            {"iteration": 2, "score": 0.4, "response_length_mean": 5.0, "iteration_s": 7.0, "eval_s": 1.0,
             "eval_score": 0.3, "ref_kl": 0.1}]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = run_record(tmp_path / "m.jsonl", episodes_per_iteration=4)
    assert r["sampled_tokens"] == 32 and r["train_s"] == 15.0  # 3·4 + 5·4 tokens; 2 + 5 + 7 + 1 s
    assert r["curves"]["score"] == [[12.0, 0.2], [32.0, 0.4]]
    assert r["wall_curves"]["score"] == [[7.0, 0.2], [15.0, 0.4]]
    assert r["wall_curves"]["eval_score"] == [[2.0, 0.1], [15.0, 0.3]]


def test_the_critics_record_against_a_hand_calculation(tmp_path):
    """Explained variance and value loss over the last eighth of the iterations, and the first iteration
    whose explained variance reaches 0.1; a run without a critic has no record."""
    from ppo_lm.reporting.compare_report import critic_record, run_record

    evs = [0.0, -0.05, 0.02, 0.08, float("nan"), 0.12, 0.05, 0.2, 0.3, 0.25, 0.3, 0.35, 0.4, 0.3, 0.5, 0.45, 0.6]
    its = [{"iteration": i + 1, "explained_variance": ev, "value_loss": 0.1 * (i + 1)} for i, ev in enumerate(evs)]
    c = critic_record(its)
    # 16 finite iterations (the NaN of iteration 5 left out): the last 16 // 8 = 2 are iterations 16 and 17
    assert c["explained_variance_late"] == pytest.approx((0.45 + 0.6) / 2)
    assert c["value_loss_late"] == pytest.approx((1.6 + 1.7) / 2)
    assert c["late_iterations"] == [16, 17] and c["first_learns"] == 6
    assert critic_record(its[:4])["first_learns"] is None  # never reached 0.1
    assert critic_record(its[:3])["late_iterations"] == [3, 3]  # at least one iteration
    assert critic_record([{"iteration": 1, "score": 0.5}]) is None  # no critic
    assert critic_record([{"iteration": 1, "explained_variance": None}])["explained_variance_late"] is None
    rows = [{"iteration": 0, "eval_score": 0.1},
            {"iteration": 1, "response_length_mean": 2.0, "explained_variance": 0.15, "value_loss": 0.2,
             "eval_score": 0.2}]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = run_record(tmp_path / "m.jsonl", episodes_per_iteration=4)
    assert r["critic"]["first_learns"] == 1 and r["curves"]["explained_variance"] == [[8.0, 0.15]]


def test_compare_on_an_environment(tmp_path, monkeypatch, capsys):
    """--env gives every run the environment: episodes of several turns, held-out episodes scored by
    their return, the table saying so."""
    monkeypatch.setattr(compare, "run_one", _in_process)
    out = tmp_path / "cmp"
    assert main(["compare", "--smoke", "--estimators", "gae,rloo", "--seeds", "0", "--iterations", "1",
                 "--env", "builtin:equations_retry", "--output-dir", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["settings"]["env"] == "builtin:equations_retry"
    for est in ("gae", "rloo"):
        rows = [json.loads(x) for x in (out / "runs" / f"{est}-seed0" / "metrics.jsonl").read_text().splitlines()]
        assert all(r["turns_mean"] >= 1 for r in rows[1:]) and "eval_turns" in rows[0]
    md = (out / "summary.md").read_text()
    assert "environment builtin:equations_retry; held-out mean return: greedy episodes" in md
    assert "| held-out mean return before |" in md and "%" not in md.splitlines()[-1]
    assert "held-out mean return " in capsys.readouterr().out  # each run's line too


def test_the_table_gives_no_spread_for_one_seed():
    def summary(seeds):
        runs = [{"estimator": "gae", "seed": seed, "accuracy_before": 0.46, "accuracy_after": 0.9 + 0.04 * seed,
                 "sampled_tokens": 5e4, "wall_s": 3000.0 + 2 * seed, "peak_rss_mb": 9e3,
                 "models_held": ["policy", "reference", "critic"]} for seed in seeds]
        settings = {"iterations": 40, "episodes": 64, "layout": "natural", "max_new_tokens": 32, "env": None,
                    "policy": "m.gguf", "eval_prompts": "h.jsonl", "seeds": seeds, "layouts": {"gae": (64, 1)}}
        return summary_markdown({"estimators": summarize(runs), "settings": settings})

    one = summary([0]).splitlines()[-1]
    # one seed: its sample standard deviation is undefined, so the row shows the means alone
    assert "±" not in one and "| 46.0 % | 90.0 % | +44.0 |" in one and "| 3000 s |" in one
    assert "the mean alone where one seed ran" in summary([0])
    two = summary([0, 1]).splitlines()[-1]
    assert "| 46.0 ± 0.0 % | 92.0 ± 2.8 % | +46.0 ± 2.8 |" in two and "3001 ± 1 s" in two


def test_the_table_gives_the_critics_explained_variance_and_where_it_first_learned():
    runs = [{"estimator": est, "seed": seed, "accuracy_before": 0.3, "accuracy_after": 0.5, "sampled_tokens": 4e4,
             "wall_s": 100.0, "peak_rss_mb": 9e3, "models_held": ["policy", "reference"],
             "critic": {"explained_variance_late": 0.3 + 0.1 * seed, "first_learns": [9, None][seed]}
             if est == "gae" else None} for seed in (0, 1) for est in ("gae", "grpo")]
    settings = {"iterations": 30, "episodes": 64, "layout": "natural", "max_new_tokens": 32, "env": None,
                "policy": "m.gguf", "eval_prompts": "h.jsonl", "seeds": [0, 1], "layouts": {"gae": (64, 1), "grpo": (8, 8)}}
    s = summarize(runs)
    assert s["gae"]["explained_variance_late"]["mean"] == pytest.approx(0.35) and s["gae"]["first_learns"] == [9, None]
    assert "explained_variance_late" not in s["grpo"]
    gae, grpo = summary_markdown({"estimators": s, "settings": settings}).splitlines()[-2:]
    # 0.3 and 0.4: mean 0.35, sample std 0.1 / √2 ≈ 0.07
    assert gae.endswith("| 0.35 ± 0.07; first ≥ 0.1 at iteration 9 / never |") and grpo.endswith("| — |")
    s["gae"]["explained_variance_late"] = None  # every iteration's returns alike: no explained variance
    assert summary_markdown({"estimators": s, "settings": settings}).splitlines()[-2].endswith(
        "| undefined: the returns never varied |")


def _env_table(env, max_new_tokens=32, seeds=(0, 1)):
    runs = [{"estimator": "rloo", "seed": seed, "accuracy_before": 0.5, "accuracy_after": 2.5 + seed,
             "sampled_tokens": 4e4, "wall_s": 100.0, "peak_rss_mb": 9e3, "models_held": ["policy", "reference"]}
            for seed in seeds]
    settings = {"iterations": 30, "episodes": 64, "layout": "natural", "max_new_tokens": max_new_tokens, "env": env,
                "policy": "m.gguf", "eval_prompts": "h.jsonl", "seeds": list(seeds), "layouts": {"rloo": (16, 4)}}
    return summary_markdown({"estimators": summarize(runs), "settings": settings})


def test_on_an_environment_the_table_gives_mean_returns_in_their_own_units():
    """A held-out mean return of 2.5 is not 250 %, nor its gain +200 points: plain numbers, headed
    'mean return'."""
    md = _env_table("builtin:equations_retry")
    header, row = md.splitlines()[-3], md.splitlines()[-1]
    assert "| held-out mean return before | after | gain (return) |" in header
    # after: 2.5 and 3.5, mean 3.0, sample std 1/√2 ≈ 0.707; gains 2.0 and 3.0
    assert "| 0.500 ± 0.000 | 3.000 ± 0.707 | +2.500 ± 0.707 |" in row and "%" not in row
    assert "environment builtin:equations_retry; held-out mean return: greedy episodes, on h.jsonl" in md
    assert "× ≤ 32 tokens a turn for every run" in md
    plain = _env_table(None)
    assert "| held-out accuracy before | after | gain (points) |" in plain and "| 50.0 ± 0.0 % |" in plain


def test_an_auto_response_limit_is_not_written_as_a_number():
    """`auto` is resolved by each run from its policy's size: the table leaves the limit out rather than
    print '≤ auto tokens'."""
    md = _env_table(None, max_new_tokens="auto")
    assert "auto" not in md and "≤" not in md.splitlines()[2]
    assert "30 iterations × 64 episodes (each estimator in its own layout: prompts × samples per prompt below) " \
           "for every run; start: m.gguf" in md


def test_compare_on_an_environment_of_your_own_task_needs_no_reward(tmp_path, saved_policy, capsys):
    """With --env the environment is the reward: --prompts needs no --reward, and a --reward (which
    would go unused) is refused before any run."""
    rows = [{"prompt": f"Solve {a}x+1={a * 2 + 1}\n", "answer": "2"} for a in range(1, 9)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    own = ["--policy", str(saved_policy), "--prompts", str(tmp_path / "p.jsonl"),
           "--eval-prompts", str(tmp_path / "p.jsonl"), "--env", "builtin:equations_retry"]
    c = compare.parse_args(["--estimators", "gae,rloo", "--output-dir", str(tmp_path / "ok"), *own])
    compare.check_compare(c)
    assert compare.run_config(c, "rloo", 0).rollout.env == "builtin:equations_retry"
    assert main(["compare", "--output-dir", str(tmp_path / "bad"), *own, "--reward", "r.py:score"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ppo-lm: error: --reward: with --env the environment's turn rewards are the reward") \
        and "leave --reward out" in err and err.count("\n") == 1, err
    assert main(["compare", "--output-dir", str(tmp_path / "bad2"), "--env", "builtin:equations_retry",
                 "--reward", "r.py:score"]) == 2  # the built-in task as well
    assert "leave --reward out" in capsys.readouterr().err


def test_a_policy_of_your_own_on_the_built_in_task_is_checked_without_the_held_out_file(tmp_path, saved_policy):
    """The built-in task's held-out equations are written by the comparison after its checks: a --policy
    given for that task is checked (it loads) without them."""
    c = compare.parse_args(["--policy", str(saved_policy), "--estimators", "gae", "--output-dir", str(tmp_path / "o")])
    compare.check_compare(c)
    assert compare.run_config(c, "gae", 0).data.eval_prompts == str(tmp_path / "o" / "heldout.jsonl")


def test_value_at_interpolates_between_evaluations_and_holds_at_the_ends():
    from ppo_lm.reporting.compare_report import value_at

    curve = [[10.0, 0.2], [20.0, 0.4], [40.0, 0.1]]
    assert value_at(curve, 5.0) == 0.2 and value_at(curve, 50.0) == 0.1
    assert value_at(curve, 15.0) == pytest.approx(0.3) and value_at(curve, 30.0) == pytest.approx(0.25)
    assert value_at(curve, 20.0) == pytest.approx(0.4)


def test_equal_budgets_read_every_run_where_the_first_run_ended():
    from ppo_lm.reporting.compare_report import equal_budgets

    def run(est, seed, train_s, tokens, scale):
        xs = [0.0, train_s / 2, train_s]
        return {"estimator": est, "seed": seed, "train_s": train_s, "sampled_tokens": tokens, "accuracy_before": 0.2,
                "accuracy_after": 0.2 + 0.4 * scale,
                "wall_curves": {"eval_score": [[x, 0.2 + 0.4 * scale * x / train_s] for x in xs]},
                "curves": {"eval_score": [[x * tokens / train_s, 0.2 + 0.4 * scale * x / train_s] for x in xs]}}

    runs = [run("gae", 0, 200.0, 1000.0, 1.0), run("reinforce++", 0, 100.0, 1100.0, 1.0),
            run("gae", 1, 220.0, 900.0, 0.5), run("reinforce++", 1, 120.0, 1000.0, 0.5)]
    eq = equal_budgets(runs)
    sec, tok = eq["seconds"], eq["tokens"]
    assert sec["at"] == 100.0 and sec["run"] == "reinforce++-seed0"
    assert tok["at"] == 900.0 and tok["run"] == "gae-seed1"
    # gae at 100 s: 0.2 + 0.4·100/200 = 0.4 (seed 0), 0.2 + 0.2·100/220 (seed 1)
    assert sec["estimators"]["gae"]["min"] == pytest.approx(0.2 + 0.2 * 100 / 220)
    assert sec["estimators"]["gae"]["max"] == pytest.approx(0.4)
    assert sec["estimators"]["reinforce++"]["max"] == pytest.approx(0.6)  # it ended there
    # reinforce++ at 900 tokens: seed 0 reaches 1100 tokens in 100 s, so 0.2 + 0.4·900/1100
    assert tok["estimators"]["reinforce++"]["max"] == pytest.approx(0.2 + 0.4 * 900 / 1100)


def test_a_variant_of_an_estimator_runs_in_its_layout_under_its_own_name(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(compare, "run_one", _in_process)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("per_estimator:\n  gae-frozen:\n    algo:\n      estimator: gae\n    critic:\n      kind: frozen\n")
    out = tmp_path / "cmp"
    assert main(["compare", "--smoke", "--estimators", "gae,gae-frozen,grpo", "--seeds", "0", "--iterations", "1",
                 "--config", str(cfg), "--output-dir", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["settings"]["layouts"]["gae-frozen"] == [8, 1]
    assert s["estimators"]["gae-frozen"]["models_held"] == ["policy", "reference", "critic's value head on a frozen body"]
    assert (out / "runs" / "gae-frozen-seed0" / "metrics.jsonl").is_file()
    assert set(s["equal_budgets"]["seconds"]["estimators"]) == {"gae", "gae-frozen", "grpo"}
    md = (out / "summary.md").read_text()
    assert "| at " in md and "interpolated linearly between the held-out evaluations" in md


@pytest.mark.parametrize("text, message", [
    ("per_estimator:\n  gae-x:\n    critic:\n      kind: frozen\n", "make it a variant by setting `algo.estimator`"),
    ("per_estimator:\n  gae:\n    algo:\n      estimator: grpo\n", "cannot run another; name a variant"),
])
def test_a_variant_needs_its_estimator(tmp_path, capsys, text, message):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    assert main(["compare", "--smoke", "--estimators", "gae", "--config", str(cfg), "--output-dir",
                 str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err


def test_an_undefined_variant_is_refused(tmp_path, capsys):
    assert main(["compare", "--smoke", "--estimators", "gae,gae-lora", "--output-dir", str(tmp_path / "o")]) == 2
    assert "define a variant in the --config file's `per_estimator`" in capsys.readouterr().err
