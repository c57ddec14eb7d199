"""The command line, one module a command (docs/architecture.md): ``ppo-lm train``, ``sft``, ``rm``, ``demo``,
``compare``, ``plot``, ``report``, ``export``, ``bench``. The top layer: it imports every other, none imports it."""
