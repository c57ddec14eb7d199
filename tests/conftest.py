"""Every test starts with the process's torch thread count: some set it (``threads=1`` runs), and
the CPU lanes (``ppo_lm.runtime.lanes``) follow it."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def saved_policy(tmp_path_factory):
    """A tiny built-in policy and its tokenizer saved as a user's checkpoint directory."""
    from ppo_lm.tasks.equations import build_tiny_policy, build_tokenizer

    d = tmp_path_factory.mktemp("policy")
    tok = build_tokenizer()
    build_tiny_policy(tok, seed=0, hidden_size=32).save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any model build fails the test: the error must come from a check before it."""
    from ppo_lm.trainer import roles

    def boom(*a, **k):
        raise AssertionError("a model was loaded before the error")

    monkeypatch.setattr(roles, "build_policy", boom)
    monkeypatch.setattr(roles, "build_tokenizer", boom)
