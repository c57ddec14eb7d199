"""Every test starts with the process's torch thread count: some set it (``threads=1`` runs), and
the CPU lanes (``ppo_lm.lanes``) follow it."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
