"""The training loop: PPOTrainer (trainer/ppo.py) and what it is built from — configs, builders of the
model roles, the update (step 4), checkpoints, start-up checks, metrics and trackers."""
