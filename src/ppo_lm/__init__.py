"""PPO with a learned critic for language models."""
__version__ = "0.1.0"
