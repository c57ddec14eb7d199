"""The models of each role as PyTorch modules: the policy with its log-probabilities, the critic, the
reward scorer; loading checkpoints, LoRA, sharding and the fast forward paths."""
