"""What a user names is read and used, or refused with one line saying why this run ignores it
(config/unused.py, issue 42 item 9): each rule of the table, files checked even where unused, the
shipped presets and `ppo-lm compare`'s runs, and a resumed run's own settings."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
from trainer_helpers import tiny_config, with_overrides

from ppo_lm.cli.main import main
from ppo_lm.config.io import load_yaml
from ppo_lm.config.train import TrainConfig
from ppo_lm.config.unused import RULES, Facts, unused_settings
from ppo_lm.config.validate import validate_config
from ppo_lm.runtime.errors import ConfigError, UserError
from ppo_lm.trainer.preflight import preflight

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
KNOWN = Facts(files_read=True, torchrun=False, cuda=False, chat_prompts=False)


def _cfg(tmp_path, **overrides) -> TrainConfig:
    """The defaults with a few sizes (not tiny_config, whose built-in sizes are themselves one case)."""
    return with_overrides(TrainConfig(output_dir=str(tmp_path / "run"), iterations=1), overrides)


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_a_chat_template_with_plain_text_prompts_is_refused_after_it_is_read(tmp_path, no_model_loads):
    """The issue's example: a template file with text prompts was silently accepted. It is read and
    parsed first (a broken file is an error even though unused), then refused."""
    good = tmp_path / "t.jinja"
    good.write_text(TEMPLATE)
    with pytest.raises(ConfigError, match=r"^`data.chat_template`='.*t.jinja' is unused: the prompts are plain text"):
        preflight(_cfg(tmp_path, data__chat_template=str(good)))
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m['content'] }}")
    with pytest.raises(ConfigError, match=r"broken.jinja' is not a valid Jinja template: Unexpected end of template"):
        preflight(_cfg(tmp_path, data__chat_template=str(broken)))
    binary = tmp_path / "binary.jinja"
    binary.write_bytes(b"\xff\xfe{{ x }}")
    with pytest.raises(ConfigError, match=r"cannot be read: it is not a text \(UTF-8\) file"):
        preflight(_cfg(tmp_path, data__chat_template=str(binary)))
    with pytest.raises(ConfigError, match=r"is not a file"):
        preflight(_cfg(tmp_path, data__chat_template=str(tmp_path / "nope.jinja")))
    # chat messages use it; so does an environment, whose answers it renders
    chat = _jsonl(tmp_path / "chat.jsonl", [{"prompt": [{"role": "user", "content": "Solve x=1"}]}] * 4)
    preflight(_cfg(tmp_path, data__chat_template=str(good), data__prompts=chat, model__reward="builtin:equations"))
    preflight(_cfg(tmp_path, data__chat_template=str(good), rollout__env="builtin:equations_retry"))
    preflight(_cfg(tmp_path, data__chat_template="none"))  # 'none' only refuses messages: it holds for text


GRPO = {"algo__estimator": "grpo", "rollout__samples_per_prompt": 2}


@pytest.mark.parametrize("overrides,field,why", [
    # the critic and GAE with a critic-free estimator (each is used by gae: checked below)
    ({**GRPO, "critic__epochs": 2}, "critic.epochs", "has no critic to train: `algo.estimator`='grpo'"),
    ({**GRPO, "algo__bootstrap_truncated": True}, "algo.bootstrap_truncated", "has no effect: `algo.estimator`='grpo'"),
    ({**GRPO, "algo__gae_lambda": 0.9}, "algo.gae_lambda", "is unused: `algo.estimator`='grpo' has no critic"),
    ({**GRPO, "critic__vf_coef": 0.5}, "critic.vf_coef", "has no critic"),
    ({**GRPO, "critic__value_clip_eps": None}, "critic.value_clip_eps", "has no critic"),
    ({**GRPO, "critic__kind": "shared"}, "critic.kind", "has no critic"),
    ({**GRPO, "critic__target": "score"}, "critic.target", "has no critic"),
    ({**GRPO, "algo__whiten_advantages": False}, "algo.whiten_advantages", "whitens only gae's advantages"),
    ({**GRPO, "algo__gamma": 0.9}, "algo.gamma", "builds its advantages from the scores alone"),
    # the KL and the policy loss
    ({"algo__kl_coef": 0.0, "algo__kl_clamp": 5.0}, "algo.kl_clamp", "no KL term to clamp"),
    ({"algo__kl_clamp": 5.0}, "algo.kl_clamp", "only a KL loss term is clamped, and `algo.kl_in` resolves to 'reward'"),
    ({"critic__target": "score", "algo__kl_in": "loss"}, "critic.target", "the KL is not in the reward"),
    ({"algo__adaptive_kl_horizon": 500.0}, "algo.adaptive_kl_horizon", "`algo.adaptive_kl_target` is not set"),
    ({"algo__policy_loss": "pg", "algo__clip_eps_high": 0.28}, "algo.clip_eps_high", "'pg' does not clip"),
    ({"critic__kind": "separate", "critic__value_grad_scale": 0.5}, "critic.value_grad_scale", "a separate critic"),
    ({"critic__kind": "frozen", "critic__value_grad_scale": 0.5}, "critic.value_grad_scale", "a frozen critic"),
    # the off-policy correction's parts (docs/algorithm.md §1.6) and the producer
    ({"algo__is_veto": 1e-4}, "algo.is_veto", "no `algo.off_policy_correction`"),
    ({"algo__off_policy_correction": "token-mask", "algo__is_cap": 3.0}, "algo.is_cap", "truncates or caps nothing"),
    ({"algo__off_policy_correction": "tis", "algo__off_policy_mask": "none", "algo__is_band_low": 0.8},
     "algo.is_band_low", "has no band mask"),
    ({"rollout__stall_timeout_s": 60.0}, "rollout.stall_timeout_s", "no producer process"),
    ({"rollout__weight_box_dir": "/tmp"}, "rollout.weight_box_dir", "no producer process"),
    # LoRA, processes, logging
    ({"model__lora_alpha": 16.0}, "model.lora_alpha", "`model.lora_r` is 0"),
    ({"model__lora_target_modules": ["q_proj"]}, "model.lora_target_modules", "`model.lora_r` is 0"),
    ({"model__fsdp_bf16": True}, "model.fsdp_bf16", "`model.fsdp` is off"),
    ({"log__sample_every": 0, "log__num_samples": 8}, "log.num_samples", "`log.sample_every` is 0"),
    ({"log__run_name": "mine"}, "log.run_name", "only wandb, mlflow, trackio name runs"),
    ({"log__eval_pass_score": 0.5}, "log.eval_pass_score", "only with `log.eval_samples` > 1"),
])
def test_settings_a_run_ignores_are_refused_from_the_settings_alone(tmp_path, overrides, field, why):
    """validate_config (so `ppo-lm compare` and `ppo-lm demo` refuse them before anything runs)."""
    with pytest.raises(ConfigError, match=rf"^`{re.escape(field)}`=\S+ .*{re.escape(why)}.*; "):
        validate_config(_cfg(tmp_path, **overrides))
    if overrides.items() >= GRPO.items():  # gae uses the same setting
        validate_config(_cfg(tmp_path, **{k: v for k, v in overrides.items() if k not in GRPO}))


@pytest.mark.parametrize("overrides,field,why", [
    ({"rollout__max_turns": 3}, "rollout.max_turns", "`rollout.env` is not set"),
    ({"rollout__env_timeout_s": 5.0}, "rollout.env_timeout_s", "`rollout.env` is not set"),
    ({"rollout__env_workers": 2}, "rollout.env_workers", "`rollout.env` is not set"),
    ({"log__eval_every": 5}, "log.eval_every", "`data.eval_prompts` is not set"),
    ({"data__eval_max_prompts": 10}, "data.eval_max_prompts", "`data.eval_prompts` is not set"),
    ({"data__split": "validation"}, "data.split", "'builtin:equations' is the built-in task's prompts, which has no splits"),
    ({"rollout__env": "builtin:equations_retry", "data__prompts": "<FILE>", "data__prompt_column": "question"},
     "data.prompt_column",
     "an environment's reset (or an agent) receives each row whole"),
    ({"rollout__env": "builtin:equations_retry", "model__reward_weights": [2.0]}, "model.reward_weights",
     "turn rewards replace `model.reward`"),
    ({"rollout__env": "builtin:equations_retry", "model__gold_reward": "builtin:equations"}, "model.gold_reward",
     "no verifier scores the episodes"),
    ({"critic__init": "reward"}, "critic.init", "`model.reward` names verifiers only"),
    ({"critic__kind": "shared", "rollout__logp_from_sampler": True}, "rollout.logp_from_sampler",
     "the shared critic's values need the policy's scoring forward"),
    ({"model__fsdp": True}, "model.fsdp", "this run is one process"),
])
def test_settings_that_depend_on_the_files_and_the_process_are_refused_before_any_model(
        tmp_path, capsys, no_model_loads, overrides, field, why):
    """The start-up checks: after the files are read, before any model loads; on the command line one
    line, status 2."""
    rows = [{"prompt": "Solve x+1=3\n", "question": "x+1=3", "answer": "2"}] * 4
    overrides = {k: _jsonl(tmp_path / "p.jsonl", rows) if v == "<FILE>" else v for k, v in overrides.items()}
    with pytest.raises(ConfigError, match=rf"^`{field}`=\S+ .*{re.escape(why)}"):
        preflight(_cfg(tmp_path, **overrides))
    flags = []
    for key, value in overrides.items():
        section, _, name = key.partition("__")
        flag = f"--{section}.{name.replace('_', '-')}"
        flags += [flag] if value is True else [flag, *map(str, value if isinstance(value, list) else [value])]
    assert main(["train", "--output-dir", str(tmp_path / "cli"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ppo-lm: error: `{field}`=") and err.count("\n") == 1, err


def test_a_named_file_is_checked_even_where_the_run_ignores_it(tmp_path, saved_policy, no_model_loads):
    """A reward, a gold verifier, a critic's body and a split are read and checked first: a broken one is
    an error naming it, a good one is then refused as unused."""
    env = {"rollout__env": "builtin:equations_retry"}
    with pytest.raises(ConfigError, match="no_such_module_xyz"):
        preflight(_cfg(tmp_path, model__reward="no_such_module_xyz:score", **env))
    with pytest.raises(ConfigError, match="no_such_module_xyz"):
        preflight(_cfg(tmp_path, model__gold_reward="no_such_module_xyz:score", **env))
    grpo = {"algo__estimator": "grpo", "rollout__samples_per_prompt": 2}
    with pytest.raises(UserError, match=r"`critic.init` '.*nowhere' does not exist"):
        preflight(_cfg(tmp_path, critic__init=str(tmp_path / "nowhere"), **grpo))
    with pytest.raises(ConfigError, match=r"^`critic.init`='.*' is unused: `algo.estimator`='grpo' has no critic"):
        preflight(_cfg(tmp_path, critic__init=str(saved_policy), **grpo))
    with pytest.raises(ConfigError, match=r"is unused: a shared critic"):
        preflight(_cfg(tmp_path, critic__init=str(saved_policy), critic__kind="shared"))
    one_file = _jsonl(tmp_path / "p.jsonl", [{"prompt": "Solve x=1\n"}] * 4)
    with pytest.raises(ConfigError, match=r"`data.split`='validation' is unused: `data.prompts` '.*p.jsonl' is one file"):
        preflight(_cfg(tmp_path, data__prompts=one_file, data__split="validation", model__reward="builtin:equations"))
    with pytest.raises(ConfigError, match=r"`data.eval_split`='train' is unused: .* is one file"):
        preflight(_cfg(tmp_path, data__eval_prompts=one_file, data__eval_split="train"))


def test_the_same_settings_are_used_where_the_path_reads_them(tmp_path, no_model_loads):
    preflight(_cfg(tmp_path, rollout__env="builtin:equations_retry", rollout__max_turns=3, rollout__env_timeout_s=5.0,
                   data__eval_prompts="builtin:equations", log__eval_every=2, log__eval_samples=4,
                   log__eval_pass_score=0.5, data__builtin_eval_prompts=8, data__eval_max_prompts=4))
    preflight(_cfg(tmp_path, algo__kl_in="loss", algo__kl_clamp=5.0, critic__kind="shared",
                   critic__value_grad_scale=0.5, log__sample_every=2, log__num_samples=2,
                   log__report_to=["mlflow"], log__run_name="mine"))
    preflight(_cfg(tmp_path, critic__target="score", algo__adaptive_kl_target=1.0,
                   algo__adaptive_kl_horizon=500.0, rollout__logp_from_sampler=True))
    assert unused_settings(_cfg(tmp_path, model__lora_r=4, model__lora_alpha=8.0, model__fsdp=True,
                                model__fsdp_bf16=True), Facts(files_read=True, torchrun=True)) == []


def test_shared_settings_only_warn_and_the_run_goes_on(tmp_path, no_model_loads):
    """Settings a shipped workflow writes for runs that ignore them (the demo preset's critic rate for
    every estimator of `ppo-lm compare`, compare --smoke's built-in sizes, tiny_config's model size):
    one warning each, no error."""
    prompts = _jsonl(tmp_path / "p.jsonl", [{"prompt": "Solve x=1\n"}] * 4)
    cfg = tiny_config(tmp_path / "run", data__prompts=prompts, algo__estimator="rloo", rollout__samples_per_prompt=2,
                      critic__lr=1e-3, model__reward="builtin:equations")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        preflight(cfg)
    got = sorted(str(w.message) for w in seen)
    assert got == [
        "`critic.lr`=0.001 is unused: `algo.estimator`='rloo' has no critic, and this setting is the critic's or "
        "GAE's; leave it out, or pass `--critic.lr auto` over a preset that sets it (the demo's does; `ppo-lm "
        "compare` gives it to every estimator)",
        "`data.builtin_num_prompts`=64 is unused: `data.prompts` is '" + prompts + "', not the built-in task's prompts; "
        "leave it out"], got
    assert all(not u.refused for u in unused_settings(cfg, KNOWN))


def test_a_resumed_run_keeps_its_own_settings(tmp_path):
    """Settings equal to the resumed run's config.yaml were accepted when it began; a resume may not change
    them, so a rule added since must not leave the run impossible to continue. A changed one is checked."""
    cfg = _cfg(tmp_path, algo__estimator="grpo", rollout__samples_per_prompt=2, algo__gamma=0.9, log__eval_every=3)
    assert [u.field for u in unused_settings(cfg, KNOWN)] == ["algo.gamma", "log.eval_every"]
    assert unused_settings(cfg, KNOWN, keep={"algo.gamma": 0.9, "log.eval_every": 3}) == []
    assert [u.field for u in unused_settings(cfg, KNOWN, keep={"algo.gamma": 0.9, "log.eval_every": 2})] == [
        "log.eval_every"]
    validate_config(cfg, keep={"algo.gamma": 0.9})


def test_a_cli_resume_of_a_run_from_before_a_rule_continues(tmp_path, capsys):
    out = str(tmp_path / "run")
    tiny = ["--model.builtin-hidden-size", "32", "--rollout.num-prompts", "4", "--rollout.max-new-tokens", "2",
            "--optim.epochs", "1", "--data.builtin-num-prompts", "16", "--log.no-progress", "--log.no-tensorboard",
            "--log.save-every", "1", "--output-dir", out]
    assert main(["train", "--iterations", "1", *tiny]) == 0
    config = tmp_path / "run" / "config.yaml"
    config.write_text(config.read_text().replace("num_samples: 4", "num_samples: 2").replace(
        "sample_every: 5", "sample_every: 0"))  # as a run written before the rule would hold it
    capsys.readouterr()
    assert main(["train", "--output-dir", out, "--iterations", "2", "--resume"]) == 0, capsys.readouterr().err
    assert main(["train", "--output-dir", out, "--iterations", "3", "--resume", "--log.num-samples", "3"]) == 2
    assert "`log.num_samples`=3 is unused: `log.sample_every` is 0" in capsys.readouterr().err


def test_the_defaults_the_shipped_presets_and_compares_runs_are_not_refused():
    """Every shipped YAML as its command completes it, and every run `ppo-lm compare` writes (each
    layout, --smoke, --env, a task of your own, the recipe's compare.yaml): warnings at most."""
    from ppo_lm.cli import compare

    assert unused_settings(TrainConfig(), KNOWN) == []
    files = {"model__policy": "m.gguf", "data__prompts": "t.jsonl", "data__eval_prompts": "h.jsonl",
             "model__reward": "rewards.py:correct"}
    for name in ("demo_ppo.yaml", "real_model/grpo.yaml", "real_model/compare.yaml", "multi_turn/ppo.yaml"):
        cfg = load_yaml(ROOT / "examples" / name, TrainConfig)
        validate_config(cfg)
        for key, value in files.items() if name != "demo_ppo.yaml" else ():
            section, _, field = key.partition("__")
            setattr(getattr(cfg, section), field, value)
        assert [u.message for u in unused_settings(cfg, KNOWN) if u.refused] == [], name
    own = ["--policy", "m", "--prompts", "p.jsonl", "--reward", "r.py:f", "--eval-prompts", "e.jsonl"]
    for args in ([], ["--smoke"], ["--layout", "common"], ["--smoke", "--env", "builtin:equations_retry"], own,
                 [*own, "--smoke", "--env", "builtin:equations_retry"],
                 [*own, "--config", str(ROOT / "examples" / "real_model" / "compare.yaml")]):
        c = compare.parse_args([*args, "--estimators", "gae,grpo,dr_grpo,rloo,reinforce++"])
        if c.config:
            c.file_settings, c.per_estimator = compare.read_file_settings(c.config)
        for est in c.estimators:
            run = compare.run_config(c, est, 0)
            assert [u.message for u in unused_settings(run, KNOWN) if u.refused] == [], (args, est)


def test_every_rule_names_fields_that_exist_and_a_fix():
    for rule in RULES:
        assert rule.fix and rule.fields
        for name in rule.fields:
            holder = TrainConfig()
            for part in name.split("."):
                holder = getattr(holder, part)  # AttributeError: a misspelt field


def test_the_kl_placement_the_rules_read_is_the_trainers():
    """unused.py resolves `algo.kl_in: auto` itself (validate.py imports it); the two must agree."""
    from ppo_lm.algorithms import ADVANTAGE_ESTIMATORS
    from ppo_lm.config.unused_rules import _kl_in
    from ppo_lm.config.validate import resolve_algo

    for estimator in ADVANTAGE_ESTIMATORS:
        for kl_in in ("auto", "reward", "loss"):
            cfg = TrainConfig()
            cfg.algo.estimator, cfg.algo.kl_in = estimator, kl_in
            assert _kl_in(cfg) == resolve_algo(cfg.algo).kl_in
