"""Request lifecycle shared by the simulated and the real cluster: queues, steps, hand-offs, elasticity."""
