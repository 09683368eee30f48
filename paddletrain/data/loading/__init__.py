"""From datasets to batches: checked, seeded loaders with a bad-sample policy, and the bundle a run trains on."""
