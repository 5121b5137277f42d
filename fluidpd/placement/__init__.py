"""DistServe's goodput-optimised placement: Algorithms 1 and 2 over a phase-goodput estimator."""
