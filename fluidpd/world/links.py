"""Classes of KV transfer between workers (each may get its own share of a link)."""

HANDOFF = "handoff"  # prefill -> decode KV of a just-prefilled request (and gathers of spread pieces)
MIGRATION = "migration"  # FluidRole drain: live KV moved to a peer
