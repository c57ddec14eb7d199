"""A run's checkpoints, in one room (docs/training.md, "Outputs"): the folders —
their names, manifests, verification and rotation (:mod:`.folders`); what the trainer's state holds and
how a resumed run restores it (:mod:`.state`); and each model's weight files, what trains written and
what is frozen fingerprinted (:mod:`.model_files`)."""
