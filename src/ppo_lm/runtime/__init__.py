"""The process around the math: user errors, settings that carry their rules, the optimiser and its
schedule, torch.distributed helpers, CPU lanes, memory release and phase timing. The bottom layer
beside ``algorithms``: it imports nothing else of the package."""
