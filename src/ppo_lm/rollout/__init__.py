"""Step 1–3 of the loop, in five wings around the record they pass on, :mod:`.trajectory`
(docs/architecture.md, "rollout"):

- :mod:`.envs` — a user's environment: its protocol and checks, the worker processes its instances
  live in, tool calls;
- :mod:`.sample` — what samples: the generation engine over the in-process decoders, and the producer
  that turns prompts or an environment's episodes into trajectories through it (uses ``envs``);
- :mod:`.agents` — the policy behind an OpenAI-compatible endpoint for agents written against the
  OpenAI client, each episode's calls recorded token-exact (uses ``sample`` and ``envs``' chat
  rendering);
- :mod:`.sources` — where the learner takes each iteration's trajectories from: in step, or sampled
  ahead by a producer in its own process, the weights handed over in shared memory (uses ``sample``);
- :mod:`.score` — trajectories to the rollout batch the update trains on: the responses' text, rewards
  and step rewards, π_old, π_ref and V_old;

and :mod:`.evaluate`, held-out evaluation through a producer. Within ``rollout`` the arrows run
``envs`` ← ``sample`` ← ``sources`` and ``envs`` ← ``sample`` ← ``agents``, and ``score`` stands beside
them.

The names a user's code imports — ``Reward`` (a score with step rewards) and ``ToolEnv`` (an
environment whose model calls Python functions) — load their modules on first use (PEP 562), so an
environment's worker process, which imports :mod:`ppo_lm.rollout.envs.env_worker`, does not import torch."""

__all__ = ["Reward", "ToolEnv"]


def __getattr__(name: str):
    if name == "Reward":
        from .score.step_rewards import Reward

        return Reward
    if name == "ToolEnv":
        from .envs.tools import ToolEnv

        return ToolEnv
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
