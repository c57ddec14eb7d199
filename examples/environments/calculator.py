"""A tool-using environment (docs/environments.md): the model may call `add` in the
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` form of Qwen-style chat templates; its
first turn without a call is its answer. Needs a chat template that renders `tools`."""

from ppo_lm.rollout import ToolEnv


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


class Calculator(ToolEnv):
    tools = [add]

    def prompt(self, row):
        return [{"role": "user", "content": row["question"]}]

    def reward(self, text):
        return float(text.strip().endswith(str(self.row["answer"])))
