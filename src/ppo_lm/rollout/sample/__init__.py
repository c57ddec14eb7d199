"""What samples: the generation engine (:mod:`.engine`, docs/architecture.md "Generation engines") over
the in-process decoders (:mod:`.sampling`), and the producer (:mod:`.producer`) that turns prompts or an
environment's episodes into trajectories through it."""
