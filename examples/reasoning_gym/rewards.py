"""The reward of the files data.py writes: what `model.reward: reasoning-gym` is (and `auto` picks for
`data.prompts: reasoning-gym:TASK`), as a verifier of prompt files — each response's answer (its last
``<answer>…</answer>``, else its last number, else its text: `data.task_answer` auto) handed to the
task's own ``score_answer``, the task named by each row's ``metadata``. Use it as
``--reward examples/reasoning_gym/rewards.py:score``.
"""

from ppo_lm.tasks.reasoning_gym import reward

score = reward("auto")
