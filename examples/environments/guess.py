"""A multi-turn environment in the protocol of docs/environments.md: guess a number, told higher or
lower after each wrong guess. Text in, text out (any tokenizer); with `--rollout.env
examples/environments/guess.py:Guess`, the rows of `data.prompts` reach reset, one per episode."""

import random


class Guess:
    def reset(self, row, seed):
        self.secret = random.Random(seed).randint(0, 9)  # the group's seed: one secret a group; resume replays it
        self.tries = 0
        return "Guess my number, 0 to 9:\n"

    def step(self, text):
        self.tries += 1
        digits = [c for c in text if c.isdigit()]
        if not digits:
            return "a digit, please:\n", -0.1, False
        guess = int(digits[0])
        if guess == self.secret:
            return None, 1.0 / self.tries, True  # sooner is better
        return ("higher:\n" if guess < self.secret else "lower:\n"), 0.0, False
