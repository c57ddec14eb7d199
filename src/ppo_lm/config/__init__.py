"""A run's settings: the typed configs (`train`), their reading and writing (`io`), their checks
(`validate`, `unused` and its `unused_rules`) and the `auto` values resolved by the model's size (`sizing`)."""
