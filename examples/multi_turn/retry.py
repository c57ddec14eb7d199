"""The real-model recipe's arithmetic with feedback (docs/environments.md): a wrong answer is told so
and gets another try. A right answer on turn k earns 0.5 ** (k - 1), so the first try counts most;
the episode ends at a right answer or after `rollout.max_turns`. The rows are the recipe's: chat
messages in `prompt` and the `answer`."""

import re

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
FEEDBACK = "That is not right. Try again, and end with the number."


def last_number(text):
    found = NUMBER.findall(text.replace(",", ""))
    return float(found[-1]) if found else None


class Retry:
    def reset(self, row, seed):
        self.answer, self.turn = float(row["answer"]), 0
        return row["prompt"]

    def step(self, text):
        self.turn += 1
        if last_number(text) == self.answer:
            return None, 0.5 ** (self.turn - 1), True
        return [{"role": "user", "content": FEEDBACK}], 0.0, False
