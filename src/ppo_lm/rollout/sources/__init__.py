"""Where the learner takes each iteration's trajectories from (:mod:`.source`): sampled in step, or
ahead of it by a producer in a process of its own (:mod:`.async_source`, :mod:`.producer_process`),
the weights handed over in shared memory (:mod:`.weight_box`), the lag's one rule in :mod:`.staleness` —
docs/async.md."""
