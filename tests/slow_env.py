"""An environment whose episodes start slowly on rank 1 only (the environment variable RANK): under
torchrun its rank's producer samples behind rank 0's, so their checkpoints hold different numbers of
batches sampled ahead."""

import os
import time

from ppo_lm.tasks.retry import EquationsRetry


class SlowOnRank1(EquationsRetry):
    def reset(self, row: dict, seed: int) -> str:
        if os.environ.get("RANK") == "1":
            time.sleep(0.6)
        return super().reset(row, seed)
