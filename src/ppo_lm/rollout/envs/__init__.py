"""A user's environment (docs/environments.md): loading a class and checking what its ``reset`` and
``step`` return (:mod:`.environment`), the worker processes its instances live in, each call timed by
the trainer (:mod:`.env_pool`, :mod:`.env_worker`), and tool calls parsed and run in forked processes
(:mod:`.tools`). Free of torch: a worker imports only this wing."""
