"""What a run writes and shows: the metrics log (`metrics_log`), experiment trackers (`trackers`) and
the console (`console`). Checkpoints have their room in :mod:`ppo_lm.trainer.checkpoint`."""
