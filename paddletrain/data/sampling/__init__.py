"""Which samples an epoch sees, in which order: the resumable seeded batch sampler, class balance, and the held-out
validation split."""
