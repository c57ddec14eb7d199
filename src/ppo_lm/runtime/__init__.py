"""The process around the math: user errors, torch.distributed helpers, CPU lanes and memory release.
The bottom layer beside ``algorithms``: it imports nothing else of the package."""
