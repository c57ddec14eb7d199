"""Guess (guess.py) with every step waiting 100 ms first, as an agent's tool or sandbox waits on I/O:
the latency-bound workload of docs/async.md, where sampling ahead of the learner pays."""

import random
import time


class WaitingGuess:
    def reset(self, row, seed):
        self.secret = random.Random(seed).randint(0, 9)
        self.tries = 0
        return "Guess my number, 0 to 9:\n"

    def step(self, text):
        time.sleep(0.1)  # the service's latency: the worker waits, the CPU is free
        self.tries += 1
        digits = [c for c in text if c.isdigit()]
        if digits and int(digits[0]) == self.secret:
            return None, 1.0 / self.tries, True
        return "again:\n", 0.0, False
