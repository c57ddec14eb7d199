"""Agents written against the OpenAI client, trained with PPO (docs/agents.md): the policy served behind
an OpenAI-compatible endpoint (:mod:`.endpoint`), the requests it accepts (:mod:`.openai_api`), and each
episode's calls recorded token-exact (:mod:`.calls`)."""
