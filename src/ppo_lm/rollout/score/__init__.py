"""Trajectories to the rollout batch (docs/algorithm.md §2): the responses' text and their rewards
(:mod:`.reward`), step rewards inside a response (:mod:`.step_rewards`), the learner's π_old, π_ref,
V_old (:mod:`.scoring`) and the typed batch (:mod:`.batch`)."""
