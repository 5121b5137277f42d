"""Side by side with another server (benchmarks/peers/engine_vs_peers.py): its process, its memory, the client."""
