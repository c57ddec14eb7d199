"""Multi-turn environments (docs/environments.md): episodes advance turn by turn in one batch; the
trained sequence is the sampled ids plus the observation ids (token-in-token-out); observation tokens
carry no loss, KL, value or advantage; a turn's reward lands on its last action token; termination,
the turn limit and the context budget end episodes; errors are one line with the user's frames."""

from __future__ import annotations

import textwrap

import pytest
import torch
from trainer_helpers import action_runs, bpe_tokenizer, tiny_config

from ppo_lm.cli.main import main
from ppo_lm.rollout.envs.environment import EnvError, Renderer
from ppo_lm.trainer.ppo import PPOTrainer

ENV = '''
import json
import os


class Echo:
    """Three turns; each turn's reward is its text's length; the answer names the turn. With ECHO_LOG
    set, each step appends [seed, turn, text] to that file (the environment runs in worker processes)."""

    def reset(self, row, seed):
        self.n, self.seed = 0, seed
        return row["prompt"]

    def step(self, text):
        self.n += 1
        if os.environ.get("ECHO_LOG"):
            with open(os.environ["ECHO_LOG"], "a") as f:
                f.write(json.dumps([self.seed, self.n, text]) + "\\n")
        return (" ok%d:" % self.n, float(len(text)), self.n >= 3)


class Endless(Echo):
    def step(self, text):
        obs, reward, _ = super().step(text)
        return obs, reward, False


class Quiet(Echo):
    def step(self, text):
        obs, reward, done = super().step(text)
        return None, reward, done
'''


@pytest.fixture
def env_file(tmp_path):
    f = tmp_path / "echo_env.py"
    f.write_text(ENV)
    return f


def trainer(tmp_path, env_file, cls="Echo", **kw):
    kw = {"rollout__max_new_tokens": 6, "rollout__num_prompts": 4, **kw}
    return PPOTrainer(tiny_config(tmp_path / "run", rollout__env=f"{env_file}:{cls}", **kw))


def test_token_in_token_out_and_the_turn_rewards(tmp_path, env_file, monkeypatch):
    import json

    monkeypatch.setenv("ECHO_LOG", str(tmp_path / "steps.jsonl"))
    tr = trainer(tmp_path, env_file)
    b = tr.rollout(1)
    record = [tuple(json.loads(line)) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    tok = tr.models.tokenizer
    assert b.action_mask is not None and b.episode_info["turns"].tolist() == [3] * b.size
    for i in range(b.size):
        seed = tr.plan.seeds_for(1)[i]
        texts = [t for s, _, t in sorted(r for r in record if r[0] == seed)]
        runs = action_runs(b, i)
        actions = [ids for a, ids in runs if a]
        observations = [ids for a, ids in runs if not a]
        # the observations are the environment's answers, tokenized alone
        assert observations == [tok(f" ok{k}:", add_special_tokens=False)["input_ids"] for k in (1, 2)][:len(observations)]
        assert len(actions) == 3 or (len(actions) < 3 and len(observations) == len(actions) - 1)
        # each turn's sampled ids decode to the text the environment received (its stop token aside)
        stops = set(tr.sampler.sampling.stop_token_ids)
        for ids, text in zip(actions, texts):
            kept = ids[:-1] if ids[-1] in stops else ids
            assert tok.decode(kept, skip_special_tokens=True) == text
        # each turn's reward on its last action token: earlier turns as step rewards, the last as score
        ends = [k for k in range(b.response_mask.shape[1]) if b.action_mask[i, k]
                and (k + 1 == b.response_mask.shape[1] or not b.action_mask[i, k + 1])]
        want = torch.zeros(b.response_mask.shape[1])
        for k, text in zip(ends[:-1], texts[:-1]):
            want[k] = len(text)
        assert torch.equal(b.step_rewards[i], want) and float(b.scores[i]) == len(texts[-1])
    assert bool(b.terminated.all())


def test_observation_tokens_carry_no_loss(tmp_path, env_file):
    """What sits at observation positions in logp_old, logp_ref and values_old changes nothing: two
    identical trainers, one updated on a rollout with garbage there, end with the same weights."""
    from dataclasses import replace

    one, two = (trainer(tmp_path / d, env_file, optim__epochs=1, rollout__max_new_tokens=4) for d in "ab")
    b = one.rollout(1)
    obs = b.response_mask & ~b.action_mask
    assert obs.any()
    assert bool((b.logp_old[obs] == 0).all() and (b.values_old[obs] == 0).all())
    garbled = replace(b, logp_old=b.logp_old.masked_fill(obs, 5.0), logp_ref=b.logp_ref.masked_fill(obs, -7.0),
                      values_old=b.values_old.masked_fill(obs, 3.0))
    start = [p.detach().clone() for p in one.models.policy.parameters()]
    clean, dirty = one.learn(b, 1), two.learn(garbled, 1)
    for p1, p2 in zip(one.models.policy.parameters(), two.models.policy.parameters()):
        assert torch.equal(p1, p2)
    for p1, p2 in zip(one.models.critic.parameters(), two.models.critic.parameters()):
        assert torch.equal(p1, p2)
    assert any(not torch.equal(p0, p1) for p0, p1 in zip(start, one.models.policy.parameters()))
    assert clean.metrics["ref_kl"] == dirty.metrics["ref_kl"]
    t = clean.targets
    assert bool((t.advantages[obs] == 0).all() and (t.returns[obs] == 0).all() and (t.rewards[obs] == 0).all())


def test_the_turn_limit_truncates_and_bootstraps(tmp_path, env_file):
    tr = trainer(tmp_path, env_file, "Endless", rollout__max_turns=2)
    b = tr.rollout(1)
    assert not bool(b.terminated.any()) and b.episode_info["turns"].tolist() == [2] * b.size
    # the last observation is kept: the bootstrap value is V of the context after it
    for i in range(b.size):
        assert action_runs(b, i)[-1][0] is False
    m = tr.learn(b, 1).metrics
    assert m["done_frac"] == 0 and m["turns_mean"] == 2 and m["truncated_frac"] == 1


def test_a_context_budget_ends_episodes_and_is_counted(tmp_path, env_file):
    tr = trainer(tmp_path, env_file, rollout__max_episode_tokens=24, rollout__max_new_tokens=8, rollout__num_prompts=8)
    b = tr.rollout(1)
    total = b.attention_mask.sum(1)
    assert int(total.max()) <= 24
    cut = b.episode_info["context_truncated"]
    assert cut.any() and not bool(b.terminated[cut].any())
    m = tr.learn(b, 1).metrics
    assert m["truncated_by_context_frac"] == pytest.approx(float(cut.float().mean()))


def test_no_observation_continues_the_same_context(tmp_path, env_file):
    b = trainer(tmp_path, env_file, "Quiet").rollout(1)
    assert bool((b.action_mask == b.response_mask).all()) and b.episode_info["observation_tokens"].sum() == 0


def test_episodes_are_seeded_and_repeat(tmp_path, env_file):
    a = trainer(tmp_path / "a", env_file).rollout(1)
    b = trainer(tmp_path / "b", env_file).rollout(1)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.action_mask, b.action_mask)


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce++"])
def test_every_estimator_trains_on_episodes(tmp_path, env_file, estimator):
    tr = trainer(tmp_path, env_file, algo__estimator=estimator, rollout__samples_per_prompt=2, rollout__num_prompts=4)
    done = tr.learn(tr.rollout(1), 1)
    b = done.batch
    obs = b.response_mask & ~b.action_mask
    assert bool((done.targets.advantages[obs] == 0).all()) and done.targets.advantages[b.action_mask].abs().sum() > 0


def test_a_few_iterations_run_end_to_end(tmp_path, env_file):
    tr = trainer(tmp_path, env_file, log__sample_every=1)
    history = tr.train()
    assert len(history) == 2 and all(h["turns_mean"] == 3 for h in history)
    samples = (tmp_path / "run" / "samples.jsonl").read_text()
    assert " ok1:" in samples and " ok2:" in samples


BAD_ENVS = {
    "raises": ("def step(self, text):\n        return int('x' + text)", "the environment's step raised ValueError"),
    "wrong_type": ("def step(self, text):\n        return 1.0", "must return (observation"),
    "bad_reward": ("def step(self, text):\n        return None, 'high', True", "a reward of type str"),
    "bad_done": ("def step(self, text):\n        return None, 1.0, 'yes'", "done='yes'"),
    "slow": ("def step(self, text):\n        import time\n        time.sleep(5)\n        return None, 1.0, True",
             "ran past its time limit of 0.5 s"),
}


@pytest.mark.parametrize("case", sorted(BAD_ENVS))
def test_environment_errors_are_one_line(tmp_path, capsys, case):
    body, message = BAD_ENVS[case]
    f = tmp_path / "bad_env.py"
    f.write_text(textwrap.dedent("""
        class Bad:
            def reset(self, row, seed):
                return row["prompt"]

            {body}
    """).replace("{body}", body))
    code = main(["train", "--iterations", "1", "--log.no-tensorboard", "--rollout.num-prompts", "4",
                 "--rollout.env", f"{f}:Bad", "--rollout.env-timeout-s", "0.5", "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code != 0 and message in err and "Traceback" not in err, err
    if case == "raises":
        assert "bad_env.py:7 in step" in err


def test_an_environment_spec_is_checked_before_any_model(tmp_path, capsys):
    f = tmp_path / "not_env.py"
    f.write_text("def Env():\n    pass\n")
    base = ["train", "--iterations", "1", "--log.no-tensorboard", "--output-dir", str(tmp_path / "run")]
    assert main([*base, "--rollout.env", f"{f}:Env"]) == 2
    assert "an environment is a class with reset(row, seed) and step(text)" in capsys.readouterr().err
    assert main([*base, "--rollout.env", f"{tmp_path}/none.py:Env"]) == 2
    assert "no such file" in capsys.readouterr().err


# ----------------------------------------------------------------------------- chat templates
QWEN_STYLE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def chat_tokenizer():
    corpus = ["What is 3 + 4? The answer is 7.", "Wrong, try again.", "user assistant tool", "<tool_call>"]
    return bpe_tokenizer(corpus, 400, chat_template=QWEN_STYLE)


def test_chat_observations_render_the_whole_conversation(chat_tokenizer):
    """Token-in-token-out with a chat template: the sampled ids of every turn stay as they are, and the
    whole sequence decodes to the template's rendering of the whole conversation."""
    tok = chat_tokenizer
    r = Renderer(tok)
    messages = [{"role": "user", "content": "What is 3 + 4?"}]
    ids, history = r.first_prompt(messages)
    seq = list(ids)
    replies = ["The answer is 8.", "The answer is 7."]
    answers = [[{"role": "user", "content": "Wrong, try again."}], [{"role": "tool", "content": "ok"}]]
    sampled_runs = []
    for reply, answer in zip(replies, answers):
        sampled = tok(reply, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
        sampled_runs.append((len(seq), sampled))
        seq += sampled
        obs, history = r.observation(history, reply, tok.decode(sampled[-1:]), answer)
        seq += obs
    conversation = [messages[0], {"role": "assistant", "content": replies[0]}, answers[0][0],
                    {"role": "assistant", "content": replies[1]}, answers[1][0]]
    assert tok.decode(seq) == tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    for start, sampled in sampled_runs:
        assert seq[start:start + len(sampled)] == sampled


def test_a_turn_cut_by_the_limit_gets_the_templates_closing(chat_tokenizer):
    tok = chat_tokenizer
    r = Renderer(tok)
    ids, history = r.first_prompt([{"role": "user", "content": "What is 3 + 4?"}])
    cut = tok("The answer", add_special_tokens=False)["input_ids"]
    obs, _ = r.observation(history, "The answer", None, [{"role": "user", "content": "Wrong, try again."}])
    assert tok.decode(ids + cut + obs).endswith("The answer<|im_end|>\n<|im_start|>user\nWrong, try again.<|im_end|>\n"
                                               "<|im_start|>assistant\n")


def test_mixing_text_and_messages_is_refused(chat_tokenizer):
    r = Renderer(chat_tokenizer)
    _, history = r.first_prompt([{"role": "user", "content": "hi"}])
    with pytest.raises(EnvError, match="returned text in an episode that reset started with chat"):
        r.observation(history, "x", None, "plain")
    with pytest.raises(EnvError, match="returned chat messages in an episode that reset started with text"):
        r.observation(None, "x", None, [{"role": "user", "content": "hi"}])


def _metrics(path):
    import json

    from ppo_lm.records.metrics_log import is_timing_key

    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in rows]


@pytest.mark.parametrize("lora", [0, pytest.param(4, marks=pytest.mark.slow)])  # LoRA: with the slow tests
def test_resume_equals_uninterrupted(tmp_path, env_file, lora):
    """Episodes are a function of the seed and the iteration: a run stopped after iteration 1 and
    resumed logs what the uninterrupted run logs (full fine-tuning and LoRA)."""
    kw = dict(rollout__env=f"{env_file}:Echo", rollout__max_new_tokens=4, log__save_every=1, optim__epochs=1,
              optim__num_minibatches=1, rollout__num_prompts=4, model__lora_r=lora)
    PPOTrainer(tiny_config(tmp_path / "full", **kw)).train()
    PPOTrainer(tiny_config(tmp_path / "part", iterations=1, **kw)).train()
    PPOTrainer(tiny_config(tmp_path / "part", resume=True, **kw)).train()
    full, part = _metrics(tmp_path / "full"), _metrics(tmp_path / "part")
    assert len(full) == 2 and full == part and full[0]["turns_mean"] == 3


def test_the_guess_example_runs_and_its_seeds_replay(tmp_path):
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "examples" / "environments" / "guess.py"
    kw = dict(rollout__env=f"{example}:Guess", rollout__max_new_tokens=2, rollout__num_prompts=8, rollout__max_turns=3)
    a, b = PPOTrainer(tiny_config(tmp_path / "a", **kw)), PPOTrainer(tiny_config(tmp_path / "b", **kw))
    ra, rb = a.rollout(1), b.rollout(1)
    assert torch.equal(ra.input_ids, rb.input_ids) and torch.equal(ra.scores, rb.scores)
    assert ra.responses[0].count(":\n") >= 1 and 1 <= float(ra.episode_info["turns"].float().mean()) <= 4
    assert a.learn(ra, 1).metrics["turns_mean"] >= 1


def test_an_unknown_builtin_environment_is_refused_before_any_model(tmp_path, capsys):
    base = ["train", "--iterations", "1", "--log.no-tensorboard", "--output-dir", str(tmp_path / "run")]
    assert main([*base, "--rollout.env", "builtin:chess"]) == 2
    assert "the built-in environments are builtin:equations_retry" in capsys.readouterr().err


def test_held_out_episodes_are_evaluated_with_fixed_seeds(tmp_path):
    """With data.eval_prompts, held-out episodes run greedily: eval_score is their mean return (the
    retry task: 0.5^(k−1) for a right answer on turn k), the same episodes at every evaluation."""
    cfg = tiny_config(tmp_path / "run", rollout__env="builtin:equations_retry", rollout__max_new_tokens=6,
                      data__eval_prompts="builtin:equations", data__builtin_eval_prompts=8, log__eval_every=1,
                      rollout__max_turns=3, rollout__num_prompts=4, iterations=1)
    tr = PPOTrainer(cfg)
    a, b = tr.evaluate(1), tr.evaluate(2)
    assert a == {**b, "eval_s": a["eval_s"]} and 1 <= a["eval_turns"] <= 3
    assert 0 <= a["eval_score"] <= 1
    history = tr.train()
    assert "eval_score" in history[-1] and "eval_turns" in history[-1]


def test_the_retry_task_rewards_the_first_right_answer():
    from ppo_lm.tasks.retry import FEEDBACK, FIRST_TRY, EquationsRetry

    env = EquationsRetry()
    prompt = env.reset({"prompt": "Solve 2x+3=11\n", "answer": "4"}, seed=0)
    assert prompt == "Solve 2x+3=11\n"
    assert env.step("x=5") == (FEEDBACK + prompt, 0.0, False)
    assert env.step("x=3") == (FEEDBACK + prompt, 0.0, False)
    assert env.step("x=4") == (None, FIRST_TRY ** 2, True)
    env.reset({"prompt": "Solve x=2\n", "answer": "2"}, seed=1)
    assert env.step("x=2") == (None, 1.0, True)


@pytest.mark.slow
def test_the_builtin_multi_turn_task_learns(tmp_path):
    """PPO (GAE) on builtin:equations_retry from the demo's SFT start, with compare's settings for it:
    the mean return of the greedy held-out episodes rises by more than two standard errors (a return
    lies in [0, 1], so its standard deviation is at most 0.5)."""
    import json
    import math

    from ppo_lm.cli.compare import CompareConfig, run_config
    from ppo_lm.cli.compare_plan import build_start

    cmp = CompareConfig(estimators=["gae"], iterations=80, seeds=[0], env="builtin:equations_retry",
                        output_dir=str(tmp_path))
    build_start(tmp_path, smoke=False, build_policy=True, threads=2)
    run = run_config(cmp, "gae", 0)
    PPOTrainer(run).train()
    rows = [json.loads(x) for x in (tmp_path / "runs" / "gae-seed0" / "metrics.jsonl").read_text().splitlines()]
    evals = [r["eval_score"] for r in rows if "eval_score" in r]
    n = sum(1 for _ in open(tmp_path / "heldout.jsonl"))
    assert evals[-1] - evals[0] > 2 * 0.5 / math.sqrt(n), evals
    late = [r["explained_variance"] for r in rows[-20:] if "explained_variance" in r]
    assert sum(late) / len(late) > 0.05, late  # the critic tells contexts apart
