"""KV tiers behind the engine's arena: the abstract store and its backends (`shm`: node-shared memory)."""

from fluidpd.engine.kvstore.base import KVStore, StoreStats
from fluidpd.engine.kvstore.shm import SharedKVStore

__all__ = ["KVStore", "SharedKVStore", "StoreStats"]
