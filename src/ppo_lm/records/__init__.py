"""What a run writes and shows: checkpoints and their manifests (`checkpoint`), the metrics log
(`metrics_log`), experiment trackers (`trackers`) and the console (`console`)."""
