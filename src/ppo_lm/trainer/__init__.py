"""The training loop: PPOTrainer (trainer/ppo.py) and what it is built from — the model roles, the
update (step 4), checkpoints, start-up checks, the held-out evaluation, the banner."""
