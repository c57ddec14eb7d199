"""`ppo-lm compare --resume`: finished runs with unchanged settings are kept (read back, not run),
unfinished, new and changed ones run; the start is kept; the table names a mix of hosts."""

from __future__ import annotations

import json

import pytest
from test_compare import _in_process

from ppo_lm.cli import compare
from ppo_lm.cli.compare_resume import cpu_model, record_path
from ppo_lm.cli.main import main
from ppo_lm.reporting.compare_report import summarize, summary_markdown


class Counting:
    """compare's runner, in this process, recording which runs it started; ``fail`` names a run that
    stops with an error, as a killed or crashed run would."""

    def __init__(self, fail: str | None = None):
        self.started: list[str] = []
        self.fail = fail

    def __call__(self, run, config_path, log_path):
        name = config_path.stem
        self.started.append(name)
        if name == self.fail:
            raise compare.CompareError(f"the run in {run.output_dir} failed (status -9): killed")
        return _in_process(run, config_path, log_path)


def _compare(out, *extra):
    return main(["compare", "--smoke", "--estimators", "gae,grpo", "--iterations", "1", "--output-dir", str(out),
                 *extra])


def test_resume_keeps_finished_runs_and_runs_new_seeds_and_changed_settings(tmp_path, monkeypatch, capsys):
    out = tmp_path / "cmp"
    first = Counting()
    monkeypatch.setattr(compare, "run_one", first)
    assert _compare(out, "--seeds", "0") == 0
    before = json.loads((out / "summary.json").read_text())
    sft_written = (out / "sft" / "model.safetensors").stat().st_mtime_ns
    assert first.started == ["gae-seed0", "grpo-seed0"] and before["kept"] == []
    assert all(r["cpu"] == cpu_model() for r in before["runs"])

    more = Counting()
    monkeypatch.setattr(compare, "run_one", more)
    capsys.readouterr()
    assert _compare(out, "--seeds", "0,1", "--resume") == 0
    after = json.loads((out / "summary.json").read_text())
    assert more.started == ["gae-seed1", "grpo-seed1"]  # seed 0's runs were read back, not run
    assert after["kept"] == ["gae-seed0", "grpo-seed0"]
    assert [(r["estimator"], r["seed"]) for r in after["runs"]] == [("gae", 0), ("grpo", 0), ("gae", 1), ("grpo", 1)]
    assert after["runs"][:2] == before["runs"]
    assert (out / "sft" / "model.safetensors").stat().st_mtime_ns == sft_written  # the start is kept
    printed = capsys.readouterr().out
    assert "start: kept from the earlier comparison" in printed and "(finished earlier, kept)" in printed

    changed = Counting()
    monkeypatch.setattr(compare, "run_one", changed)
    assert _compare(out, "--seeds", "0", "--resume", "--iterations", "2") == 0
    assert changed.started == ["gae-seed0", "grpo-seed0"]
    assert "settings changed since it ran (iterations: 1 then, 2 now" in capsys.readouterr().out
    assert json.loads((out / "summary.json").read_text())["kept"] == []


def test_resume_after_a_failed_run_runs_it_and_what_follows_from_the_start(tmp_path, monkeypatch, capsys):
    out = tmp_path / "cmp"
    monkeypatch.setattr(compare, "run_one", Counting(fail="grpo-seed0"))
    assert _compare(out, "--seeds", "0,1") == 2
    assert record_path(out, "gae-seed0").is_file() and not record_path(out, "grpo-seed0").exists()
    assert not (out / "summary.json").exists()
    (out / "runs" / "grpo-seed0").mkdir()
    (out / "runs" / "grpo-seed0" / "stale.txt").write_text("left by the killed run")
    again = Counting()
    monkeypatch.setattr(compare, "run_one", again)
    capsys.readouterr()
    assert _compare(out, "--seeds", "0,1", "--resume") == 0
    assert again.started == ["grpo-seed0", "gae-seed1", "grpo-seed1"]
    assert "(not finished before)" in capsys.readouterr().out
    assert not (out / "runs" / "grpo-seed0" / "stale.txt").exists()  # a rerun starts from an empty directory
    assert json.loads((out / "summary.json").read_text())["kept"] == ["gae-seed0"]


def test_resume_and_overwrite_are_refused_together_and_a_comparison_asks_for_one(tmp_path, monkeypatch, capsys):
    out = tmp_path / "cmp"
    assert _compare(out, "--resume", "--overwrite") == 2
    assert "pass one of the two" in capsys.readouterr().err
    monkeypatch.setattr(compare, "run_one", Counting())
    assert _compare(out, "--seeds", "0") == 0
    assert _compare(out, "--seeds", "0") == 2
    assert "pass --resume to continue it, --overwrite to replace it" in capsys.readouterr().err


@pytest.mark.parametrize("cpus, noted", [(["A", "A"], False), (["A", "B"], True), ([None, "A"], False)])
def test_the_table_says_when_its_runs_ran_on_different_cpus(cpus, noted):
    runs = [{"estimator": "gae", "seed": seed, "accuracy_before": 0.46, "accuracy_after": 0.9, "sampled_tokens": 5e4,
             "wall_s": 3000.0, "peak_rss_mb": 9e3, "models_held": ["policy"], "cpu": cpu}
            for seed, cpu in enumerate(cpus)]
    settings = {"iterations": 40, "episodes": 64, "layout": "natural", "max_new_tokens": 32, "env": None,
                "policy": "m.gguf", "eval_prompts": "h.jsonl", "seeds": [0, 1], "layouts": {"gae": (64, 1)}}
    md = summary_markdown({"estimators": summarize(runs), "settings": settings, "runs": runs})
    assert ("ran on 2 different CPUs (A; B;" in md) == noted


def test_cpu_model_names_this_machine():
    name = cpu_model()
    assert name and name != "unknown" and "family" in name
