"""`ppo-lm report` (docs/report.md): the page, its images, its errors, and the page in a real headless
browser (Chromium from the system's packages, driven by Selenium): it loads without a console error, shows
every token, hovering one shows its values, and switching the quantity recolours the tokens."""

from __future__ import annotations

import html
import json
import re
import shutil

import pytest
from browser_helpers import browser
from trainer_helpers import length_reward, tiny_config

from ppo_lm.cli.main import main
from ppo_lm.trainer.ppo import PPOTrainer


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("report") / "run"
    cfg = tiny_config(run, log__sample_every=1, log__num_samples=6, rollout__max_new_tokens=6)
    PPOTrainer(cfg, verifier=length_reward).train()
    return run


def _records(run, iteration):
    return [r for r in map(json.loads, (run / "credit.jsonl").read_text().splitlines()) if r["iteration"] == iteration]


def _data(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="credit-data">(.*?)</script>', page, re.S)
    return json.loads(m.group(1))


def test_report_writes_one_self_contained_page(run_dir, capsys):
    assert main(["report", str(run_dir)]) == 0
    out = run_dir / "report"
    assert capsys.readouterr().out.strip() == str(out / "index.html")
    page = (out / "index.html").read_text(encoding="utf-8")
    for png in ("credit.png", "diagnostics.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert page.count('src="data:image/png;base64,') == 2
    assert not re.search(r"(src|href)=\"(?!data:)", page), "the page must fetch nothing"
    assert "http://" not in page and "https://" not in page
    assert "iteration 2" in page  # the last iteration by default
    assert _data(page)["episodes"] == _records(run_dir, 2)


def test_report_of_a_chosen_iteration(run_dir):
    assert main(["report", str(run_dir), "--iteration", "1"]) == 0
    page = (run_dir / "report" / "index.html").read_text(encoding="utf-8")
    assert "credit, iteration 1" in page and _data(page)["episodes"] == _records(run_dir, 1)


def test_a_token_that_looks_like_markup_stays_text(run_dir, tmp_path):
    """Token text goes into the page as data, never as markup: ``</script>`` cannot end the script."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("checkpoints", "report"))
    rec = _records(run_dir, 2)[0]
    rec["tokens"][0] = "</script><b>x</b>&amp;"
    (run / "credit.jsonl").write_text(json.dumps(rec) + "\n")
    assert main(["report", str(run)]) == 0
    page = (run / "report" / "index.html").read_text(encoding="utf-8")
    assert "</script><b>" not in page and _data(page)["episodes"][0]["tokens"][0] == "</script><b>x</b>&amp;"


@pytest.mark.parametrize("case", ["missing", "no_credit", "empty_credit", "iteration"])
def test_report_errors_are_one_line(run_dir, tmp_path, capsys, case):
    run, args, expect = tmp_path / "run", [], ""
    if case == "missing":
        expect = "does not exist; pass a train run's output directory"
    elif case == "no_credit":
        run.mkdir()
        expect = "holds no credit.jsonl"
    elif case == "empty_credit":
        run.mkdir()
        (run / "credit.jsonl").write_text('{"iteration": 1, "epis')  # a line cut by a crash
        expect = "holds no episode record yet"
    else:
        run = run_dir
        args = ["--iteration", "7"]
        expect = "--iteration 7: " + str(run_dir / "credit.jsonl") + " has no episodes of that iteration; it has " \
                 "iterations 1, 2"
    assert main(["report", str(run), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ppo-lm: error: ") and err.count("\n") == 1 and expect in err, err


@pytest.mark.parametrize("estimator,whiten,says", [
    ("gae", True, ["GAE's", "the trainer whitened it into Â"]),
    ("gae", False, ["GAE's", "used it as is"]),
    ("grpo", True, ["GRPO's group-normalised score", "used it as is"]),
    ("dr_grpo", True, ["Dr. GRPO's group-centred score", "used it as is"]),
    ("rloo", True, ["RLOO's score minus the mean of the prompt's other samples", "used it as is"]),
    ("reinforce++", True, ["REINFORCE++'s returns-to-go", "already whitened over the batch by the estimator",
                           "used it as is"]),
])
def test_the_raw_advantage_is_labelled_as_what_the_runs_estimator_returned(estimator, whiten, says):
    """Only GAE's raw column is "before whitening": REINFORCE++ whitens inside the estimator, GRPO and
    RLOO return group-normalised or centred scores that the trainer does not whiten. Each record says
    what its column is; the page's label follows it."""
    import torch

    from ppo_lm.algorithms import get_advantage_estimator
    from ppo_lm.config.train import AlgoConfig
    from ppo_lm.config.validate import resolve_algo
    from ppo_lm.reporting.report_page import render_page
    from ppo_lm.rollout.score.batch import RolloutBatch
    from ppo_lm.tasks.equations import build_tokenizer
    from ppo_lm.trainer.credit import PER_TOKEN_KEYS, CreditTargets, credit_records

    B, T = 2, 3
    zeros = torch.zeros(B, T)
    batch = RolloutBatch(input_ids=torch.full((B, 1 + T), 5), attention_mask=torch.ones(B, 1 + T), prompt_width=1,
                         response_mask=torch.ones(B, T, dtype=torch.bool), terminated=torch.ones(B, dtype=torch.bool),
                         logp_old=zeros, logp_ref=zeros, scores=torch.zeros(B))
    algo = resolve_algo(AlgoConfig(estimator=estimator, whiten_advantages=whiten))
    records = credit_records(batch, CreditTargets(zeros, zeros, zeros, None, 0.0), zeros, build_tokenizer(), algo, B)
    assert all(r["advantage_raw_is"] == get_advantage_estimator(estimator).advantages_are for r in records)
    page = render_page("run", 1, [1], records, [], [], PER_TOKEN_KEYS)
    label = html.unescape(re.search(r'<option value="advantage_raw">(.*?)</option>', page).group(1))
    assert label.startswith("Â as the estimator returned it: ") and "before whitening" not in label
    assert all(s in label for s in says), label


# ------------------------------------------------------------------------------------------------
def _rgb(css: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", css)[:3])


def test_the_page_in_a_headless_browser(run_dir):
    assert main(["report", str(run_dir)]) == 0
    records = _records(run_dir, 2)
    driver = browser()
    try:
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import Select

        driver.get((run_dir / "report" / "index.html").as_uri())
        spans = driver.find_elements(By.CSS_SELECTOR, ".tok")
        tokens = [(e, t, tok) for e, r in enumerate(records) for t, tok in enumerate(r["tokens"])]
        assert len(spans) == len(tokens)
        assert [s.get_attribute("textContent") for s in spans[: len(records[0]["tokens"])]] == \
            [t.replace("\n", "↵") for t in records[0]["tokens"]]

        def colours():
            return driver.execute_script(
                "return [...document.querySelectorAll('.tok')].map(s => getComputedStyle(s).backgroundColor)")

        # Â (the default): red above 0, blue below, as the diverging map says
        for (e, t, _), css in zip(tokens, colours()):
            r, _, b = _rgb(css)
            a = records[e]["advantage"][t]
            assert (r > b) if a > 1e-3 else (r < b) if a < -1e-3 else True, (a, css)

        # hover: every value of the token, the score and the termination
        e, t = 1, len(records[1]["tokens"]) - 1
        span = spans[sum(len(r["tokens"]) for r in records[:e]) + t]
        ActionChains(driver).move_to_element(span).perform()
        tip = driver.find_element(By.ID, "tip")
        assert tip.is_displayed()
        rec = records[e]
        for key in ("advantage", "advantage_raw", "delta", "value", "kl", "ratio", "logp_old"):
            shown = tip.find_element(By.CSS_SELECTOR, f'td[data-key="{key}"]').text
            assert float(shown) == pytest.approx(rec[key][t], rel=1e-3, abs=1e-6), key
        assert f"score {rec['score']:g}" in tip.text
        assert ("terminated" if rec["terminated"] else "truncated, bootstrap V") in tip.text

        before = colours()
        Select(driver.find_element(By.ID, "quantity")).select_by_value("delta")
        after = colours()
        assert after != before and len(after) == len(before)
        Select(driver.find_element(By.ID, "quantity")).select_by_value("ratio")
        assert colours() != after

        errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
        assert not errors, errors
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def env_run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("report_env")
    env = root / "two_turns.py"
    env.write_text("class Two:\n    def reset(self, row, seed):\n        self.n = 0\n        return row['prompt']\n"
                   "    def step(self, text):\n        self.n += 1\n        return ' next:', float(len(text)), self.n >= 2\n")
    cfg = tiny_config(root / "run", log__sample_every=1, log__num_samples=3, rollout__max_new_tokens=5,
                      rollout__env=f"{env}:Two")
    PPOTrainer(cfg).train()
    return root / "run"


def test_observation_tokens_are_null_in_the_credit_file_and_apart_on_the_page(env_run_dir):
    records = _records(env_run_dir, 2)
    for r in records:
        assert len(r["action"]) == len(r["tokens"]) and not all(r["action"])
        for key in ("advantage", "value", "kl", "ratio", "reward"):
            assert all((v is None) == (not a) for v, a in zip(r[key], r["action"])), key
    assert main(["report", str(env_run_dir)]) == 0
    driver = browser()
    try:
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.by import By

        driver.get((env_run_dir / "report" / "index.html").as_uri())
        spans = driver.find_elements(By.CSS_SELECTOR, ".tok")
        flags = [a for r in records for a in r["action"]]
        assert ["obs" not in s.get_attribute("class") for s in spans] == flags
        starts = [r["action"][i] and i > 0 and not r["action"][i - 1] for r in records for i in range(len(r["action"]))]
        assert ["turn" in s.get_attribute("class") for s in spans] == starts and any(starts)
        heads = driver.find_elements(By.CSS_SELECTOR, ".episode .head")
        assert all("2 turns (observations in grey italics)" in h.text for h in heads)
        obs_span = spans[flags.index(False)]
        ActionChains(driver).move_to_element(obs_span).perform()
        assert "observation (context: no loss, KL or value)" in driver.find_element(By.ID, "tip").text
        errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
        assert not errors, errors
    finally:
        driver.quit()
