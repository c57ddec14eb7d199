"""What is drawn from a run's files: the diagnostics plots, the per-token credit page and the comparison
of estimators. It reads what the trainer wrote, by the file names and keys the trainer declares."""
