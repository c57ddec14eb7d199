"""The commands around `train` — sft, rm, plot, demo, bench — answer a user's mistake with one line and
exit status 2, found before any model loads where it can be (docs/errors.md); sft and rm refuse to
overwrite a finished stage, print progress lines, and document every option; a checkpoint of the
built-in model loads with plain `AutoTokenizer.from_pretrained`."""

from __future__ import annotations

import ast
import inspect
import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest

from ppo_lm.cli import bench, bench_workloads
from ppo_lm.cli.demo import DemoConfig
from ppo_lm.cli.main import main
from ppo_lm.cli.stages import RMCommand, SFTCommand
from ppo_lm.data.rows import InputError
from ppo_lm.stages.rm import RMConfig
from ppo_lm.stages.sft import SFTConfig, train_sft

SMALL = ["--builtin-hidden-size", "32"]


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any model or tokenizer build fails the test: the error must come from a check before it."""
    import ppo_lm.models.hf_compat as hf_compat
    import ppo_lm.models.loading as loading
    import ppo_lm.tasks.equations as equations

    def boom(*a, **k):
        raise AssertionError("a model or tokenizer was loaded before the error")

    for mod, name in [(equations, "build_tiny_policy"), (equations, "build_tokenizer"), (loading, "load_model"),
                      (hf_compat, "load_tokenizer")]:
        monkeypatch.setattr(mod, name, boom)


def _error(capsys, *argv) -> str:
    """Run ``ppo-lm ARGV``: status 2 and exactly one line on stderr, ``ppo-lm: error: …``."""
    rc = main(list(argv))
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("ppo-lm: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ----------------------------------------------------------------------------------------------
# sft and rm: settings, directories, output
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv,message", [
    (["sft", "--sft.lr", "-1"], "`sft.lr` must be a finite number > 0, got -1.0"),
    (["sft", "--sft.lr", "nan"], "`sft.lr` must be a finite number > 0, got nan"),
    (["sft", "--sft.epochs", "0"], "`sft.epochs` must be >= 1, got 0"),
    (["sft", "--sft.max-steps", "0"], "`sft.max_steps` must be >= 1"),
    (["sft", "--sft.batch-size", "0"], "`sft.batch_size` must be >= 1, got 0"),
    (["sft", "--sft.eval-batch-size", "0"], "`sft.eval_batch_size` must be >= 1, got 0"),
    (["sft", "--sft.max-length", "1"], "`sft.max_length` must be >= 2"),
    (["sft", "--sft.heldout-fraction", "1"], "`sft.heldout_fraction` must lie in [0, 1), got 1.0"),
    (["sft", "--sft.heldout-fraction", "-0.1"], "`sft.heldout_fraction` must lie in [0, 1), got -0.1"),
    (["sft", "--sft.weight-decay", "-1"], "`sft.weight_decay` must be a finite number >= 0"),
    (["sft", "--sft.warmup-steps", "-1"], "`sft.warmup_steps` must be >= 0, got -1"),
    (["sft", "--sft.max-grad-norm", "-1"], "`sft.max_grad_norm` must be a finite number >= 0"),
    (["sft", "--sft.log-every", "-1"], "`sft.log_every` must be >= 0"),
    (["sft", "--builtin-hidden-size", "30"], "`builtin_hidden_size` must be a positive multiple of 8"),
    (["sft", "--builtin-demos", "0"], "`builtin_demos` must be >= 1, got 0"),
    (["sft", "--builtin-error-rate", "1.5"], "`builtin_error_rate` must be in [0, 1], got 1.5"),
    (["sft", "--threads", "-1"], "`threads` must be >= 0"),
    (["sft", "--tokenizer", "some/dir"], "`tokenizer` cannot be set with `model` 'builtin'"),
    (["rm", "--rm.lr", "0"], "`rm.lr` must be a finite number > 0, got 0.0"),
    (["rm", "--rm.epochs", "0"], "`rm.epochs` must be >= 1, got 0"),
    (["rm", "--rm.heldout-fraction", "1.5"], "`rm.heldout_fraction` must lie in [0, 1), got 1.5"),
    (["rm", "--builtin-pairs", "0"], "`builtin_pairs` must be >= 1, got 0"),
])
def test_stage_settings_out_of_range_are_one_line_before_any_model(tmp_path, capsys, no_model_loads, argv, message):
    assert message in _error(capsys, *argv, "--output-dir", str(tmp_path / "out"))


def test_stage_settings_are_checked_in_the_library_too():
    from ppo_lm.stages._common import check_stage_config

    with pytest.raises(InputError, match=r"`sft.schedule` must be one of constant, linear, cosine, got 'cosin'"):
        train_sft(None, None, [], SFTConfig(schedule="cosin"))
    with pytest.raises(InputError, match=r"`rm.lr` must be a finite number > 0, got inf"):
        check_stage_config(RMConfig(lr=float("inf")), "rm")


def test_stage_model_directory_problems_are_one_line_before_loading(tmp_path, capsys, saved_policy, no_model_loads):
    out = ["--output-dir", str(tmp_path / "out")]
    for stage in ("sft", "rm"):
        assert "`model` " in _error(capsys, stage, "--model", str(tmp_path / "nope"), *out)
    assert "does not exist" in _error(capsys, "sft", "--model", str(tmp_path / "nope"), *out)
    (tmp_path / "file").write_text("x")
    assert "is a file" in _error(capsys, "sft", "--model", str(tmp_path / "file"), *out)
    (tmp_path / "empty").mkdir()
    assert "empty directory" in _error(capsys, "rm", "--model", str(tmp_path / "empty"), *out)
    garbage = _copy(saved_policy, tmp_path / "garbage")
    (garbage / "config.json").write_text("{not json")
    assert "config.json is not valid JSON" in _error(capsys, "sft", "--model", str(garbage), *out)
    no_weights = _copy(saved_policy, tmp_path / "no_weights")
    (no_weights / "model.safetensors").unlink()
    assert "holds no weights" in _error(capsys, "rm", "--model", str(no_weights), *out)
    no_tok = _copy(saved_policy, tmp_path / "no_tok")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (no_tok / f).unlink()
    err = _error(capsys, "sft", "--model", str(no_tok), *out)
    assert "holds no tokenizer" in err and "set `tokenizer` to the directory" in err
    err = _error(capsys, "sft", "--model", str(saved_policy), "--tokenizer", str(tmp_path / "empty"), *out)
    assert err.startswith(f"ppo-lm: error: `tokenizer` {str(tmp_path / 'empty')!r} holds no tokenizer")
    err = _error(capsys, "sft", "--model", str(saved_policy), "--data", str(tmp_path / "none.jsonl"), *out)
    assert "`data`: no such file or directory" in err
    (tmp_path / "pairs.jsonl").write_text(json.dumps({"prompt": "p", "chosen": "a"}) + "\n")
    err = _error(capsys, "rm", "--model", str(saved_policy), "--eval-data", str(tmp_path / "pairs.jsonl"), *out)
    assert "`eval_data`: row 0" in err and "lacks column(s) ['rejected']" in err


def test_a_reward_model_is_not_a_causal_lm(tmp_path, capsys, saved_policy, no_model_loads):
    """A sequence-classification checkpoint (an rm output) is refused as sft's or rm's starting model,
    from its config.json; rm says why it needs a causal LM."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    rm_dir = tmp_path / "rm_model"
    cfg = AutoConfig.from_pretrained(saved_policy)
    cfg.num_labels = 1
    AutoModelForSequenceClassification.from_config(cfg).save_pretrained(rm_dir)
    out = ["--output-dir", str(tmp_path / "out")]
    err = _error(capsys, "sft", "--model", str(rm_dir), *out)
    assert "sequence-classification model" in err and "not a causal language model" in err
    err = _error(capsys, "rm", "--model", str(rm_dir), *out)
    assert "not a causal language model (`ppo-lm rm` starts from a causal LM's body" in err


def test_sft_refuses_a_model_without_lm_head_but_rm_takes_its_body(tmp_path, capsys, saved_policy):
    from safetensors.torch import load_file, save_file

    d = _copy(saved_policy, tmp_path / "headless")
    sd = load_file(d / "model.safetensors")
    save_file({k: v for k, v in sd.items() if not k.startswith("lm_head")}, d / "model.safetensors",
              metadata={"format": "pt"})
    err = _error(capsys, "sft", "--model", str(d), "--output-dir", str(tmp_path / "sft"))
    assert "no language-model head weights (lm_head.weight)" in err
    assert main(["rm", "--model", str(d), "--output-dir", str(tmp_path / "rm"), "--builtin-pairs", "8",
                 "--rm.max-steps", "1", "--rm.batch-size", "4"]) == 0


def test_a_tokenizer_larger_than_the_model_is_refused(tmp_path, capsys, saved_policy):
    bench_workloads.build_tokenizer(512).save_pretrained(tmp_path / "tok")
    err = _error(capsys, "sft", "--model", str(saved_policy), "--tokenizer", str(tmp_path / "tok"),
                 "--output-dir", str(tmp_path / "out"))
    assert "has 512 tokens but the model's embedding has only 83 rows" in err


def test_stage_output_directory_problems(tmp_path, capsys, no_model_loads):
    (tmp_path / "file").write_text("x")
    for stage in ("sft", "rm"):
        err = _error(capsys, stage, "--output-dir", str(tmp_path / "file"))
        assert "`output_dir`" in err and "is a file, not a directory; choose another --output-dir" in err
    err = _error(capsys, "sft", "--output-dir", str(tmp_path / "file" / "sub"))
    assert "which is a file" in err
    if Path("/proc/self").is_dir():  # cannot be created, even by root
        assert "is not writable" in _error(capsys, "rm", "--output-dir", "/proc/ppo-lm-test/out")
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert "is not writable" in _error(capsys, "sft", "--output-dir", str(locked / "out"))


def test_a_finished_stage_is_refused_unless_overwrite(tmp_path, capsys, no_model_loads):
    done = tmp_path / "done"
    done.mkdir()
    (done / "config.json").write_text("{}")
    (done / "model.safetensors").write_bytes(b"x")
    for stage in ("sft", "rm"):
        err = _error(capsys, stage, "--output-dir", str(done), *SMALL)
        assert "already holds a model or a stage's outputs (config.json, model.safetensors)" in err
        assert "pass --overwrite" in err
    ppo_run = tmp_path / "ppo_run"
    ppo_run.mkdir()
    (ppo_run / "metrics.jsonl").write_text('{"iteration": 1}\n')
    assert "metrics.jsonl" in _error(capsys, "sft", "--output-dir", str(ppo_run))


def test_stage_commands_log_progress_and_overwrite(tmp_path, capsys):
    """A plain line every log_every steps (and at the last), the same entries in <stage>_log.jsonl;
    --overwrite replaces a finished stage, stale weight files included."""
    sft_dir, rm_dir = tmp_path / "sft", tmp_path / "rm"
    assert main(["sft", "--output-dir", str(sft_dir), *SMALL, "--builtin-demos", "32", "--sft.max-steps", "3",
                 "--sft.batch-size", "8", "--sft.log-every", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    steps = [line for line in out if line.startswith("sft step ")]
    assert [s.split()[2] for s in steps] == ["2/3", "3/3"], out
    assert all(" loss " in s and " lr " in s and " grad_norm " in s for s in steps)
    assert out[0].startswith("sft: 32 rows; model ") and out[-1].startswith("held-out loss ")
    logged = [json.loads(x) for x in (sft_dir / "sft_log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in logged] == [2, 3] and logged[0]["stage"] == "sft"
    assert json.loads((sft_dir / "sft_metrics.json").read_text())["seed"] == 0

    (sft_dir / "pytorch_model.bin").write_bytes(b"stale")  # a previous model's weights in another format
    assert main(["sft", "--output-dir", str(sft_dir), "--overwrite", *SMALL, "--builtin-demos", "16",
                 "--sft.max-steps", "1", "--sft.log-every", "0"]) == 0
    assert not (sft_dir / "pytorch_model.bin").exists() and (sft_dir / "model.safetensors").is_file()
    assert (sft_dir / "sft_log.jsonl").read_text() == ""  # log_every 0: no lines, and the old log is gone
    assert not [line for line in capsys.readouterr().out.splitlines() if line.startswith("sft step")]

    assert main(["rm", "--output-dir", str(rm_dir), "--model", str(sft_dir), "--builtin-pairs", "16",
                 "--rm.max-steps", "2", "--rm.batch-size", "8", "--rm.log-every", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"rm: loading model {sft_dir} …"
    assert [line.split()[2] for line in out if line.startswith("rm step ")] == ["1/2", "2/2"]
    assert all(" accuracy " in line for line in out if line.startswith("rm step "))
    assert len((rm_dir / "rm_log.jsonl").read_text().splitlines()) == 2


def _documented_fields(cls) -> dict[str, bool]:
    """Each dataclass field of ``cls`` → whether a docstring follows it (what tyro shows as its help)."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    out = {}
    for stmt, nxt in zip(body, [*body[1:], None]):
        if isinstance(stmt, ast.AnnAssign):
            out[stmt.target.id] = isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant)
    return out


def plain_help(capsys, command: str) -> str:
    """``ppo-lm COMMAND --help``: exits 0, and its text holds no Sphinx markup; returns the text."""
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for markup in ("``", ":func:", ":class:", ":data:", ":meth:", ":mod:"):
        assert markup not in text, markup
    return text


@pytest.mark.parametrize("command", ["sft", "rm"])
def test_stage_help_is_complete_and_plain(capsys, command):
    text = plain_help(capsys, command)
    cmd, stage = (SFTCommand, SFTConfig) if command == "sft" else (RMCommand, RMConfig)
    for cls in (cmd, stage):
        undocumented = [name for name, has_doc in _documented_fields(cls).items() if not has_doc]
        assert not undocumented, (cls.__name__, undocumented)
    assert "--overwrite" in text and "--seed INT" in text and f"--{command}.seed" not in text
    assert f"--{command}.schedule {{constant,linear,cosine}}" in text


def test_one_seed_the_top_level_one(capsys):
    """`--sft.seed` is gone (one seed, as in `ppo-lm train`); `--seed` defaults to 0."""
    with pytest.raises(SystemExit) as e:
        main(["sft", "--sft.seed", "3"])
    assert e.value.code == 2
    capsys.readouterr()
    assert SFTCommand().seed == 0 and RMCommand().seed == 0
    assert "seed" not in SFTConfig.__dataclass_fields__ and "seed" not in RMConfig.__dataclass_fields__


# ----------------------------------------------------------------------------------------------
# plot
# ----------------------------------------------------------------------------------------------


def test_plot_errors(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    assert "does not exist" in _error(capsys, "plot", str(tmp_path / "nope"))
    assert "metrics.jsonl not found" in _error(capsys, "plot", str(run))
    (run / "metrics.jsonl").write_text("")
    assert "metrics.jsonl is empty: nothing to plot" in _error(capsys, "plot", str(run))
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"iteration": 1}\n')
    err = _error(capsys, "plot", str(run))
    assert "has 2 line(s) but none with an `iteration` and a metric that is plotted" in err
    assert not (run / "diagnostics.png").exists()  # no blank PNG

    (run / "metrics.jsonl").write_text('{"iteration": 1, "score": 0.5}\n{"iteration": 2, "score": 0.7}\n')
    err = _error(capsys, "plot", str(run), "--out", str(tmp_path / "missing" / "d.png"))
    assert f"'{tmp_path / 'missing'}' does not exist; create it or choose another --out" in err
    assert "is a directory" in _error(capsys, "plot", str(run), "--out", str(run))
    (tmp_path / "file").write_text("x")
    assert "is a file, not a directory" in _error(capsys, "plot", str(run), "--out", str(tmp_path / "file" / "d.png"))
    assert "Format 'xyz' is not supported" in _error(capsys, "plot", str(run), "--out", str(tmp_path / "d.xyz"))
    if Path("/proc/self").is_dir():
        err = _error(capsys, "plot", str(run), "--out", "/proc/ppo-lm-test.png")
        assert "cannot write the plot to '/proc/ppo-lm-test.png'" in err or "is not writable" in err
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert "is not writable" in _error(capsys, "plot", str(run), "--out", str(locked / "d.png"))
    assert "unrecognized arguments: --bogus" in _error(capsys, "plot", str(run), "--bogus")

    assert main(["plot", str(run), "--out", str(tmp_path / "plain")]) == 0  # no suffix: .png, as written
    assert capsys.readouterr().out.strip() == str(tmp_path / "plain.png")
    assert (tmp_path / "plain.png").stat().st_size > 1000


# ----------------------------------------------------------------------------------------------
# demo and bench
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv,message", [
    (["--threads", "-1"], "`threads` must be >= 0"),
    (["--hidden-size", "30"], "`hidden_size` must be a positive multiple of 8"),
    (["--num-layers", "0"], "`num_layers` must be >= 1, got 0"),
    (["--sft-demos", "0"], "`sft_demos` must be >= 1, got 0"),
    (["--sft-steps", "0"], "`sft_steps` must be >= 1, got 0"),
    (["--sft-lr", "-1"], "`sft_lr` must be a finite number > 0"),
    (["--sft-batch-size", "0"], "`sft_batch_size` must be >= 1"),
    (["--sft-error-rate", "2"], "`sft_error_rate` must be in [0, 1], got 2.0"),
    (["--eval-prompts", "0"], "`eval_prompts` must be >= 1"),
    (["--eval-prompts", "5000"], "`eval_prompts`=5000: could only draw"),
    (["--eval-every", "0"], "`eval_every` must be >= 1, got 0"),
    (["--rlhf", "--rm-samples-per-prompt", "1"], "`rm_samples_per_prompt` must be >= 2"),
    (["--rlhf", "--rm-steps", "0"], "`rm_steps` must be >= 1"),
    (["--rlhf", "--rm-lr", "0"], "`rm_lr` must be a finite number > 0"),
    (["--ppo.iterations", "0"], "`ppo.iterations` must be >= 1, got 0"),
    (["--ppo.rollout.temperature", "inf"], "`ppo.rollout.temperature` must be a finite number > 0, got inf"),
    (["--ppo.rollout.max-new-tokens", "200"], "`ppo.rollout.max_new_tokens`=200 leaves no room for a prompt"),
])
def test_demo_bad_settings_are_one_line_before_anything_is_built(tmp_path, capsys, no_model_loads, argv, message):
    assert message in _error(capsys, "demo", "--output-dir", str(tmp_path / "demo"), *argv)


def test_demo_output_directory_problems(tmp_path, capsys, no_model_loads):
    (tmp_path / "file").write_text("x")
    assert "is a file, not a directory" in _error(capsys, "demo", "--smoke", "--output-dir", str(tmp_path / "file"))
    old = tmp_path / "old"
    (old / "sft").mkdir(parents=True)
    (old / "summary.json").write_text("{}")
    err = _error(capsys, "demo", "--smoke", "--output-dir", str(old))
    assert "already holds a demo (summary.json, sft); choose another --output-dir" in err
    assert DemoConfig().threads == 2


@pytest.mark.parametrize("argv,message", [
    (["--iterations", "0"], "--iterations must be >= 1, got 0"),
    (["--warmup", "-1"], "--warmup must be >= 0, got -1"),
    (["--threads", "-2"], "--threads must be >= 0, got -2"),
    (["--cpu-lanes", "0"], "--cpu-lanes must be >= 1, got 0"),
    (["--workload", "w9"], "argument --workload: invalid choice: 'w9'"),
    (["--iterations", "x"], "argument --iterations: invalid int value: 'x'"),
    (["--device", "tpu"], "--device: 'tpu' is not a device"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_bench_bad_flags_are_one_line(capsys, monkeypatch, argv, message):
    def boom(*a, **k):
        raise AssertionError("the benchmark started")

    monkeypatch.setattr(bench, "run_bench", boom)
    assert message in _error(capsys, "bench", "--tiny", *argv)


# ----------------------------------------------------------------------------------------------
# The built-in tokenizer through plain AutoTokenizer
# ----------------------------------------------------------------------------------------------


def test_builtin_checkpoint_loads_with_auto_tokenizer(saved_policy):
    """transformers 5 picks Qwen2Tokenizer for a Qwen2 config.json whatever tokenizer_config.json says,
    and rebuilds its pipeline around the saved vocabulary: the built-in tokenizer is made so that this
    gives the same ids and decodes spaces and newlines."""
    from transformers import AutoTokenizer

    from ppo_lm.models.hf_compat import load_tokenizer
    from ppo_lm.tasks.equations import CHARACTERS, EOS_TOKEN, build_tokenizer, sft_demonstrations

    builtin = build_tokenizer()
    auto = AutoTokenizer.from_pretrained(saved_policy)
    ours = load_tokenizer(saved_policy)
    texts = ["Solve 2x+3=11\nx=4", "  two  spaces\n\nand lines\n", CHARACTERS, "x=-3" + EOS_TOKEN]
    texts += [r["prompt"] + r["response"] for r in sft_demonstrations(20, seed=0)]
    for text in texts:
        ids = builtin(text, add_special_tokens=True)["input_ids"]
        assert len(ids) == len(text) - (len(EOS_TOKEN) - 1) * text.count(EOS_TOKEN)  # one token per character
        for tok in (auto, ours):
            assert tok(text, add_special_tokens=True)["input_ids"] == ids, (type(tok).__name__, text)
            assert tok.decode(ids) == text
            assert tok.decode(ids, skip_special_tokens=True) == text.replace(EOS_TOKEN, "")
    for tok in (auto, ours):
        assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id, tok.padding_side) == (0, 1, 2, "left")
        assert len(tok) == len(builtin)
    batch = auto(["Solve x=1\n", "Solve 2x+3=11\n"], padding=True)["input_ids"]
    assert batch[0][:4] == [0, 0, 0, 0]  # left padding with <pad>
    assert builtin("é")["input_ids"] == [builtin.unk_token_id]  # outside the alphabet: <unk> (AutoTokenizer drops it)
